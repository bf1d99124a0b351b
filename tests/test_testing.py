"""The public test kit (streamwork.testing) on a real redis-server."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork.testing import Ledger, await_for, run_until_idle, stream_idle, wait_for
from tests.workers.ledger import STREAM, LedgerWorker


class LoopWatchingClient:
    """A sync client whose every call first asks ``loop`` to run a callback and waits (up
    to 5 s) for it: made on the loop's own thread, a call would wait for a loop that cannot
    run, so ``blocked`` records each call made there."""

    def __init__(self, client: redis.Redis, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop
        self.blocked: list[str] = []
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            ran = threading.Event()
            self._loop.call_soon_threadsafe(ran.set)
            if not ran.wait(5):
                self.blocked.append(name)
            self.calls += 1
            return method(*args, **kwargs)

        return call


async def test_run_until_idle_looks_at_redis_off_the_event_loop(redis_url: str,
                                                                 r: redis.Redis) -> None:
    """run_until_idle takes a sync client, yet none of its Redis calls runs on the event
    loop the worker serves on (the loop keeps running while it looks)."""
    keys = [f"job-{i}" for i in range(20)]
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * len(keys), keys=keys)
    watching = LoopWatchingClient(r, asyncio.get_running_loop())
    await run_until_idle(LedgerWorker.from_url(redis_url), watching, timeout=60)
    assert watching.calls > 0
    assert watching.blocked == [], f"Redis calls made on the event loop: {watching.blocked}"
    assert Ledger(r).report(keys).exactly_once


async def test_run_until_idle_raises_when_the_worker_fails(redis_url: str,
                                                           r: redis.Redis) -> None:
    """A worker that stops on an error makes run_until_idle raise that error, not wait."""
    r.set(STREAM, "not a stream")
    with pytest.raises(sw.WorkerFailed):
        await run_until_idle(LedgerWorker.from_url(redis_url), r, timeout=60)


async def test_run_until_idle_times_out_with_an_assertion(redis_url: str,
                                                          r: redis.Redis) -> None:
    """A group that never becomes idle (a job stays delayed) fails with AssertionError
    naming the stream once the timeout passes, and the worker is stopped."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="later", delay=600)
    worker = LedgerWorker.from_url(redis_url)
    with pytest.raises(AssertionError, match=repr(STREAM)):
        await run_until_idle(worker, r, timeout=0.5)
    assert not worker.health().alive


def test_stream_idle_never_misses_a_job_moving_between_retry_zset_and_stream(
        r: redis.Redis) -> None:
    """A job that keeps moving (each move one atomic step, as the worker's scripts make
    them) between the group's retry ZSET and its retry stream is always somewhere, so
    stream_idle never says idle: it looks at every place in one snapshot, not one after
    the other (when a busy machine slowed those looks, run_until_idle stopped a worker
    with a retry still to run)."""
    keys = StreamKeys.for_stream(STREAM)
    retry, retries = keys.group("g").retry, keys.group("g").retries
    r.xadd(STREAM, {"b": "x"})
    r.xgroup_create(STREAM, "g", id="$")
    r.xgroup_create(retry, "g", id="$", mkstream=True)
    r.zadd(retries, {"job": 0})
    stop = threading.Event()

    def move() -> None:  # ZSET -> retry stream (unread) -> read (pending) -> ZSET, forever
        mover = redis.Redis(connection_pool=r.connection_pool)
        while not stop.is_set():
            with mover.pipeline(transaction=True) as pipe:
                pipe.zrem(retries, "job").xadd(retry, {"b": "x"}).execute()
            [[_, [(entry, _)]]] = mover.xreadgroup("g", "c", {retry: ">"}, count=1)
            with mover.pipeline(transaction=True) as pipe:
                pipe.xack(retry, "g", entry).zadd(retries, {"job": 0}).execute()

    thread = threading.Thread(target=move, daemon=True)
    thread.start()
    try:
        seen_idle = sum(stream_idle(r, STREAM, "g") for _ in range(300))
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert seen_idle == 0, f"idle in {seen_idle} of 300 looks while a job was always there"


def test_wait_for_returns_the_truthy_value_or_raises_with_the_message() -> None:
    """wait_for hands back the predicate's first truthy value; on timeout it raises
    AssertionError carrying the message."""
    values = iter([0, None, "", "ready"])
    assert wait_for(lambda: next(values), timeout=5, interval=0.001) == "ready"
    with pytest.raises(AssertionError, match="the moon"):
        wait_for(lambda: False, timeout=0.05, interval=0.01, message="the moon")


async def test_await_for_lets_the_loop_run_while_it_waits() -> None:
    """await_for polls without blocking the loop: a task on the same loop makes the
    predicate true; on timeout it raises AssertionError carrying the message."""
    flag = asyncio.Event()
    setter = asyncio.get_running_loop().call_later(0.05, flag.set)
    try:
        assert await await_for(flag.is_set, timeout=5) is True
    finally:
        setter.cancel()
    with pytest.raises(AssertionError, match="never"):
        await await_for(lambda: False, timeout=0.05, message="never")


class MovesBeforeCall:
    """A sync client that, right before its first ``trigger`` call, runs ``move`` (real
    Redis writes, as another client would make them between two of the caller's calls)."""

    def __init__(self, client: redis.Redis, trigger: str, move: Any) -> None:
        self._client = client
        self._trigger = trigger
        self._move = move

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if name != self._trigger or self._move is None:
            return method
        move, self._move = self._move, None
        move()
        return method


def test_stream_idle_sees_a_job_moving_while_it_looks(r: redis.Redis) -> None:
    """A job moving from the group's retry set onto its retry stream (a promotion) while
    stream_idle looks is seen in one place or the other: the look is one snapshot, so the
    group is never reported idle with a retry still to run."""
    stream, group = "moving", "g"
    keys = StreamKeys.for_stream(stream)
    gkeys = keys.group(group)
    r.xgroup_create(stream, group, id="0", mkstream=True)
    r.xadd(stream, {"d": b"x"})
    [[_, [(entry_id, _)]]] = r.xreadgroup(group, "c", {stream: ">"})
    r.xack(stream, group, entry_id)
    r.zadd(gkeys.retries, {b"a retry waiting for its backoff": 1})

    def promote() -> None:  # what the promoter does, at the worst moment for the look
        r.zrem(gkeys.retries, b"a retry waiting for its backoff")
        r.xgroup_create(gkeys.retry, group, id="0", mkstream=True)
        r.xadd(gkeys.retry, {"d": b"x"})

    assert stream_idle(MovesBeforeCall(r, "zcard", promote), stream, group) is False
    if r.zcard(gkeys.retries):  # the look made no zcard call of its own: promote now
        promote()
    assert stream_idle(r, stream, group) is False  # the retry is unread on the retry stream


# ---- message(): a handler's message in a unit test ---------------------------------------


class Orders(sw.StreamWorker):
    """Stages a total, sends a receipt (key derived) and a high-priority mail, checks its
    lease before the mail; a "stop" payload ends early when the job was cancelled."""

    stream = "orders"
    group = "billing"
    read_block = 0.05

    async def handle(self, msg: sw.Message) -> str:
        if msg.cancelled:
            return "cancelled"
        msg.stage("HINCRBY", ["{orders}:totals"], ["eur", msg.payload["cents"]])
        receipt = msg.send("receipts", {"order": msg.key})
        msg.check()
        msg.send_many("mails", [{"to": "ada"}, {"to": "kim"}], order_keys=["ada", "kim"],
                      priority="high", headers={"trace": "t-1"})
        return receipt


def test_message_records_what_a_handler_stages_and_sends() -> None:
    """The message of ``message()`` lets a handler send: each job is recorded in ``sent``
    with its stream, payload, key (given, else the one a worker derives) and the options
    given (per-job ones for their job); ``staged`` holds only the handler's own writes."""
    from streamwork.testing import SentJob, message

    msg = message({"cents": 250}, key="order-7", stream="orders", group="billing")
    receipt = asyncio.run(Orders.from_url("redis://127.0.0.1:1/0").handle(msg))
    assert receipt.startswith("chain-")
    assert msg.sent == [
        SentJob("receipts", {"order": "order-7"}, receipt, {}),
        SentJob("mails", {"to": "ada"}, msg.sent[1].key,
                {"priority": "high", "order_key": "ada", "headers": {"trace": "t-1"}}),
        SentJob("mails", {"to": "kim"}, msg.sent[2].key,
                {"priority": "high", "order_key": "kim", "headers": {"trace": "t-1"}}),
    ]
    assert len({s.key for s in msg.sent}) == 3
    assert msg.staged == [("HINCRBY", (b"{orders}:totals",), (b"eur", b"250"))]
    assert msg.staged_commands() == [("HINCRBY", ["{orders}:totals"], ["eur", "250"])]
    again = message({"cents": 250}, key="order-7", stream="orders", group="billing")
    asyncio.run(Orders.from_url("redis://127.0.0.1:1/0").handle(again))
    assert [s.key for s in again.sent] == [s.key for s in msg.sent], "same keys every attempt"


def test_message_lease_and_cancel_flags_can_be_set() -> None:
    """``lock_lost`` and ``cancelled`` start as given and can be set; with the lease lost
    ``check()`` raises LockLost, as in a worker."""
    from streamwork.testing import message

    worker = Orders.from_url("redis://127.0.0.1:1/0")
    lost = message({"cents": 1}, lock_lost=True)
    with pytest.raises(sw.LockLost, match="lost its lease"):
        asyncio.run(worker.handle(lost))
    assert [s.stream for s in lost.sent] == ["receipts"], "sent before the check"
    later = message({"cents": 1})
    assert not later.lock_lost and not later.cancelled
    later.lock_lost = True
    with pytest.raises(sw.LockLost):
        later.check()
    later.lock_lost = False
    later.check()
    stopped = message({"cents": 1}, cancelled=True)
    assert asyncio.run(worker.handle(stopped)) == "cancelled" and stopped.sent == []
    stopped.cancelled = False
    assert not stopped.cancelled
    assert message(options={"priority": "high"}).priority == "high"
    going = message({})
    going.progress(0.5, "half")
    going.progress(1)
    assert going.progressed == [(0.5, "half"), (1.0, "")]
    with pytest.raises(ValueError, match="fraction"):
        going.progress(2.0)


def test_message_checks_sends_as_a_worker_does() -> None:
    """Bad sends raise the worker's ConfigError at once; a Message built by hand still
    refuses to send (there is no worker behind it), naming the helper to use."""
    from streamwork.testing import message

    msg = message({})
    with pytest.raises(sw.ConfigError, match="whitespace"):
        msg.send("bad name", {})
    with pytest.raises(sw.ConfigError, match="not a job option"):
        msg.send("mails", {}, prio="high")  # type: ignore[call-arg]
    with pytest.raises(sw.ConfigError, match="MessagePack"):
        msg.send("mails", object())
    with pytest.raises(sw.ConfigError, match="normal level only"):
        msg.send("mails", {}, priority="high", delay=5)
    with pytest.raises(sw.PayloadTooLarge):
        message({}, max_payload_bytes=100).send("mails", "x" * 200)
    with pytest.raises(sw.ConfigError, match="priority"):
        message(options={"priority": "urgent"})
    assert msg.sent == []
    by_hand = sw.Message(id="0-1", stream="test", key="k", payload={}, attempt=1,
                         enqueued_at=0.0, headers={})
    with pytest.raises(sw.ConfigError, match="did not come from a worker"):
        by_hand.send("mails", {})


async def test_message_derives_the_keys_a_worker_derives(redis_url: str,
                                                         r: redis.Redis) -> None:
    """The key ``message()`` gives a job sent without one is the key a real worker gives
    it: the receipt a real run sends is found under the key the unit test saw."""
    from streamwork.testing import message

    with sw.Producer.from_url(redis_url) as p:
        p.send("orders", {"cents": 250}, key="order-7")
    await run_until_idle(Orders.from_url(redis_url), r, timeout=60)
    with sw.Producer.from_url(redis_url) as p:
        real = p.status("orders", "order-7", group="billing").result
    unit = message({"cents": 250}, key="order-7", stream="orders", group="billing")
    assert await Orders.from_url(redis_url).handle(unit) == real
    assert int(r.hget("{orders}:totals", "eur") or 0) == 250


# ---- WorkerRunner: the plugin's streamwork_run, without pytest ----------------------------


class Flaky(LedgerWorker):
    """LedgerWorker (payloads say what happens: fail_until, dead) with job records."""

    dedup = True


def test_worker_runner_serves_until_idle_and_says_what_happened(redis_url: str,
                                                               r: redis.Redis) -> None:
    """WorkerRunner runs a worker class (made with the options given) until its stream is
    drained and returns its counters and the job statuses; from a plain test."""
    from streamwork.testing import WorkerRunner

    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * 3, keys=["a", "b", "c"])
        p.send(STREAM, {"fail_until": 2}, key="twice")
        p.send(STREAM, {"dead": True}, key="poison")
    run = WorkerRunner(redis_url)(Flaky, timeout=60, concurrency=2)
    assert run.worker.config.concurrency == 2 and not run.worker.health().alive
    assert (run.counts["acked"], run.counts["retried"], run.counts["dead_lettered"]) == (
        4, 1, 1)
    assert run.status("twice").state == "done" and run.status("poison").state == "dead"
    assert Ledger(r).report(["a", "b", "c", "twice"]).exactly_once
    assert run.counts["cancelled"] == 0  # what did not happen counts 0
    with pytest.raises(sw.ConfigError, match="pass its class"):
        WorkerRunner(redis_url, r)(Flaky.from_url(redis_url), concurrency=2)
    with pytest.raises(sw.ConfigError, match="StreamWorker subclass"):
        WorkerRunner(redis_url, r)(object)  # type: ignore[arg-type]


async def test_worker_runner_in_an_async_test(redis_url: str, r: redis.Redis) -> None:
    """Called inside a running loop, WorkerRunner serves on a loop of its own in a thread;
    ``run_async`` serves on the running one."""
    from streamwork.testing import WorkerRunner

    runner = WorkerRunner(redis_url, r)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="one")
        assert runner(Flaky).counts["acked"] == 1
        p.send(STREAM, {}, key="two")
        assert (await runner.run_async(Flaky)).counts["acked"] == 1
    assert set(Ledger(r).counts()) == {"one", "two"}
