"""``msg.lock_lost`` judged by the lease's own deadline, not by heartbeat ticks.

A handler polls ``msg.lock_lost`` while the servers holding its lease go silent (SIGSTOP:
connections stay open, nothing answers, so the worker's heartbeat hangs). Right after a
heartbeat landed, the test reads when the servers last refreshed the lease (the PEL's idle
time, the Redlock keys' PTTL) and stops them: no other worker can reclaim the job and
start it before that refresh plus the lease's TTL. From then on (in fact from the lease's
deadline, the drift margin earlier) ``msg.lock_lost`` must say true whenever the handler
looks (it polls every 2 ms; a busy machine may make it look late, never wrong) and
``msg.check()`` must raise. The margins seen are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import pytest
import redis

import streamwork as sw
from streamwork._redis.server import RedisServer
from streamwork._wire.keys import redlock_key, redlock_resource
from streamwork.testing import await_for

STREAM = "deadlines"
GROUP = "g"
VISIBILITY = 1.0  #: s: the lease's TTL (heartbeat every third of it)
RUNS = 3  #: partitions per lease kind, each right after a heartbeat
#: s the test waits for lock_lost past the deadline before calling it late (today's code
#: noticed only when the hanging heartbeat timed out, 10 s on)
LATE = 3.0


class WatchingWorker(sw.StreamWorker):
    """Polls ``msg.lock_lost`` every few ms and records when it turned true (monotonic)."""

    stream = STREAM
    group = GROUP
    concurrency = 1
    visibility_timeout = VISIBILITY
    read_block = 0.1
    dedup = True
    seen: ClassVar[dict[str, dict[str, Any]]] = {}

    async def handle(self, msg: sw.Message) -> None:
        me = self.seen.setdefault(msg.key, {})
        me["started"] = time.monotonic()
        while True:
            before = time.monotonic()
            if msg.lock_lost:
                break
            me["last_false"] = before  # it still said false at this time or later
            await asyncio.sleep(0.002)
        me["lost"] = before
        try:
            msg.check()
        except sw.LockLost:
            me["check_raised"] = True


def _fresh_beat(stream_redis: redis.Redis, masters: list[redis.Redis], key: str,
                servers: list[RedisServer]) -> float:
    """Wait until a heartbeat (and, with ``masters``, the Redlock extension after it) has
    just landed, stop every server in ``servers`` at once and return the earliest monotonic
    time another worker could take the lease over (a lower bound: a refresh between the
    look and the stop only pushes it later)."""
    ttl_ms = round(VISIBILITY * 1000)
    resource = redlock_key(redlock_resource(STREAM, key))
    end = time.monotonic() + 20
    while time.monotonic() < end:
        rows = stream_redis.xpending_range(STREAM, GROUP, min="-", max="+", count=1)
        now = time.monotonic()
        if not rows or int(rows[0]["time_since_delivered"]) > 20:
            time.sleep(0.002)
            continue
        expiries = [now + VISIBILITY - int(rows[0]["time_since_delivered"]) / 1000]
        if masters:
            pttls = [m.pttl(resource) for m in masters]
            now = time.monotonic()
            if min(pttls) < ttl_ms - 40:  # the extension after this beat has not landed
                time.sleep(0.001)
                continue
            expiries += [now + p / 1000 for p in pttls]
        for server in servers:
            server.pause()
        return min(expiries)
    raise AssertionError("no heartbeat seen within 20 s")


async def _one_partition(make_server: Any, kind: str, run: int) -> float:
    """One job, its servers stopped right after a heartbeat; returns how long before a
    takeover was possible the handler saw ``msg.lock_lost`` true."""
    server = make_server()
    masters = [make_server() for _ in range(3)] if kind == "redlock" else []
    stream_redis = redis.Redis.from_url(server.url)
    master_clients = [redis.Redis.from_url(m.url) for m in masters]
    key = f"job-{kind}-{run}"
    opts: dict[str, Any] = {"lock_urls": [m.url for m in masters]} if masters else {}
    worker = WatchingWorker.from_url(server.url, **opts)
    task = asyncio.create_task(worker.serve())
    try:
        sw.Producer.from_url(server.url).send(STREAM, {}, key=key)
        await await_for(lambda: "started" in WatchingWorker.seen.get(key, {}),
                        message="the handler to start")
        await asyncio.sleep(VISIBILITY / 2)  # a heartbeat or two while it runs
        takeover = await asyncio.to_thread(
            _fresh_beat, stream_redis, master_clients, key, [server, *masters])
        seen = WatchingWorker.seen[key]
        await await_for(lambda: "lost" in seen or time.monotonic() > takeover + LATE,
                        timeout=LATE + 20, message="lock_lost or its lateness")
        assert "lost" in seen, (
            f"msg.lock_lost still false {LATE} s past the lease's deadline ({kind})")
        # on a busy machine the handler may look late, but whenever it looks from the
        # moment the lease could be taken over on, it must be told
        late = seen["last_false"] - takeover
        assert late < 0, (
            f"msg.lock_lost still said false {late:.3f} s after the lease could be taken "
            f"over ({kind}, run {run})")
        assert seen.get("check_raised"), "msg.check() did not raise once lock_lost"
        return float(takeover - seen["lost"])
    finally:
        for s in [server, *masters]:
            s.resume()
        worker.stop()
        await task
        stream_redis.close()
        for c in master_clients:
            c.close()


@pytest.mark.parametrize("kind", ["redis", "redlock"])
async def test_lock_lost_turns_true_by_the_lease_deadline_while_servers_hang(
    make_server: Any, kind: str
) -> None:
    """Servers silent right after a heartbeat: ``msg.lock_lost`` is true and ``check()``
    raises before the lease could be taken over elsewhere, every run."""
    margins = [await _one_partition(make_server, kind, run) for run in range(RUNS)]
    print(f"\n{kind}: lock_lost seen true this long before a takeover was possible (s): "
          + ", ".join(f"{m:.3f}" for m in margins))
