"""A handler's API never blocks the worker's event loop: what ``msg.send``, ``msg.send_many``
and ``msg.stage`` do from an ``async def`` handler makes no synchronous Redis call (checked
at run time, on every synchronous redis-py client), also for a target whose partition count
is not known yet, and also while Redis stalls."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.cluster

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork.testing import await_for, stream_idle

SOURCE, TARGET, OTHER = "loop-src", "loop-dst", "loop-other"


@pytest.fixture(name="loop_calls")
def _loop_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every command a synchronous redis-py client sends from a thread that runs an event
    loop (the worker's), as ``"COMMAND by caller"``."""
    seen: list[str] = []

    def wrap(cls: Any) -> None:
        original = cls.execute_command

        def execute_command(self: Any, *args: Any, **options: Any) -> Any:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass
            else:
                seen.append(f"{args[0]!r} in {threading.current_thread().name}")
            return original(self, *args, **options)

        monkeypatch.setattr(cls, "execute_command", execute_command)

    wrap(redis.Redis)
    wrap(redis.cluster.RedisCluster)
    yield seen


class Sender(sw.StreamWorker):
    stream = SOURCE
    group = "senders"
    read_block = 0.05
    visibility_timeout = 3.0

    async def handle(self, msg: sw.Message) -> None:
        msg.stage("HINCRBY", [StreamKeys.for_stream(SOURCE).prefix + ":ran"], [msg.key, 1])
        msg.send(TARGET, {"from": msg.key})  # a target never seen: its count is unknown
        msg.send_many(OTHER, [{"n": 1}, {"n": 2}], partitions=1)
        await asyncio.sleep(0)


async def test_no_handler_api_call_is_a_synchronous_redis_call(
        redis_url: str, r: redis.Redis, loop_calls: list[str]) -> None:
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(SOURCE, [{}] * 20)
    loop_calls.clear()  # the producer above is ours, not the worker's
    w = Sender.from_url(redis_url)
    task = asyncio.create_task(w.serve())
    try:
        await await_for(lambda: w.counts["acked"] == 20, timeout=30, message="20 done")
        assert loop_calls == [], loop_calls
    finally:
        w.stop()
        await task
    assert r.xlen(TARGET) == 20 and r.xlen(OTHER) == 40
    assert w.counts["produced"] == 60


class SlowSender(Sender):
    concurrency = 8
    timeout = 30.0


async def test_a_redis_stall_does_not_hold_the_event_loop_in_msg_send(
        make_server: Any) -> None:
    """Redis stalls (SIGSTOP) while handlers send to a target whose partition count is
    unknown: the event loop keeps turning (no round trip is made in the handler), and once
    Redis answers again every job completes with its chained jobs, each sent once (not
    failed with a partition error for a stream that is not partitioned)."""
    server = make_server()
    r = redis.Redis.from_url(server.url)
    with sw.Producer.from_url(server.url) as p:
        p.send_many(SOURCE, [{}] * 16, keys=[f"j{i}" for i in range(16)])
    w = SlowSender.from_url(server.url)
    lags: list[float] = []

    async def ticker() -> None:  # how late the loop runs a 50 ms timer
        while True:
            started = time.monotonic()
            await asyncio.sleep(0.05)
            lags.append(time.monotonic() - started - 0.05)

    tick = asyncio.create_task(ticker())
    task = asyncio.create_task(w.serve())
    try:
        await await_for(lambda: w.health().ready, timeout=20, message="ready")
        server.pause()
        try:
            lags.clear()
            await asyncio.sleep(3.0)  # the stall: the loop must keep its timers
        finally:
            server.resume()
        assert lags and max(lags) < 1.0, f"the event loop was held {max(lags or [0]):.1f} s"
        await await_for(lambda: w.counts["acked"] == 16 and stream_idle(r, SOURCE, "senders"),
                        timeout=60, message="every job done after the stall")
    finally:
        tick.cancel()
        w.stop()
        await task
    assert w.counts["acked"] == 16 and w.counts["dead_lettered"] == 0
    assert r.xlen(TARGET) == 16
    r.close()
