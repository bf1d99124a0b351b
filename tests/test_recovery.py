"""Recovery: heartbeats keep long jobs, stalled processes lose theirs, stale consumers
cannot acknowledge, retries run in order with one effect, delayed sends wait until due."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork import AsyncProducer, Producer
from streamwork._wire.keys import StreamKeys
from streamwork._wire.records import parse
from streamwork.testing import Ledger, await_for, run_until_idle, wait_for
from tests.workers.ledger import LedgerWorker
from tests.workers.recording import RecordingWorker, calls

STREAM, GROUP = "jobs", "testers"
KEYS = StreamKeys.for_stream(STREAM)


def _pending(r: redis.Redis) -> list[dict[str, Any]]:
    return list(r.xpending_range(STREAM, GROUP, min="-", max="+", count=100))


def _attempt_times(r: redis.Redis, key: str) -> list[float]:
    return [float(t) for t in r.lrange("attempt-times:" + key, 0, -1)]


async def test_long_handler_is_not_stolen_by_idle_peer(r: redis.Redis, redis_url: str) -> None:
    """A handler running 4x visibility_timeout is never reclaimed: delivered once, applied once."""
    opts: dict[str, Any] = {"visibility_timeout": 1.0, "reclaim_interval": 0.1}
    busy = LedgerWorker.from_url(redis_url, **opts)
    peer = LedgerWorker.from_url(redis_url, **opts)
    busy_task = asyncio.create_task(busy.serve())
    with Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 4.0}, key="long")
    await await_for(lambda: r.llen("attempt-times:long") == 1, message="the handler to start")
    peer_task = asyncio.create_task(peer.serve())
    max_delivered = 0
    try:
        def finished() -> bool:
            nonlocal max_delivered
            for row in _pending(r):
                max_delivered = max(max_delivered, int(row["times_delivered"]))
            return r.hget("ledger", "long") is not None

        await await_for(finished, timeout=30, message="the long job to finish")
        await await_for(lambda: not _pending(r), message="the long job to be acked")
    finally:
        busy.stop()
        peer.stop()
        await asyncio.gather(busy_task, peer_task)
    assert max_delivered == 1, "the live delivery was redelivered"
    assert peer.counts["reclaimed"] == 0
    assert busy.counts["reclaimed"] == 0
    assert busy.counts["lock_lost"] == 0
    assert len(_attempt_times(r, "long")) == 1
    assert Ledger(r).counts() == {"long": 1}


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "dedup"])
def test_stalled_process_loses_its_job_and_cannot_ack_it(
    r: redis.Redis, redis_url: str, spawn_worker: Callable[..., subprocess.Popen[bytes]],
    dedup: bool,
) -> None:
    """A SIGSTOPped worker's job goes to a peer; resumed, it neither acks nor takes it back."""
    target = "tests.workers.recording:RecordingWorker"
    args = ("--visibility-timeout", "1", "--reclaim-interval", "0.2",
            "--dedup" if dedup else "--no-dedup")
    stale = spawn_worker(target, redis_url, *args)
    with Producer.from_url(redis_url) as p:
        p.send(STREAM, {"first_sleep": 2.5, "gate": 2}, key="paused")
    # tokens:<key> is pushed after calls:<key>: wait for it, so the SIGSTOP cannot land
    # between the two pushes (the stale token would then be pushed after the peer's)
    wait_for(lambda: r.llen("tokens:paused") == 1, timeout=30, message="attempt 1 to start")
    os.kill(stale.pid, signal.SIGSTOP)
    try:
        peer = spawn_worker(target, redis_url, *args)
        wait_for(lambda: r.llen("calls:paused") == 2, timeout=30,
                 message="a peer to reclaim the stalled job")
    finally:
        os.kill(stale.pid, signal.SIGCONT)
    [row] = _pending(r)
    assert row["consumer"].decode().split("-")[-2] == str(peer.pid)
    assert row["times_delivered"] == 2
    # once the resumed worker has drained and exited, whatever it sent to Redis was sent
    stale.send_signal(signal.SIGTERM)
    try:
        assert stale.wait(timeout=30) == 0
    except subprocess.TimeoutExpired:
        pytest.fail("the resumed worker did not exit within 30 s of SIGTERM (shutdown hang)")
    [row] = _pending(r)
    assert row["consumer"].decode().split("-")[-2] == str(peer.pid), \
        "the stale worker acknowledged or took back a job it had lost"
    assert row["times_delivered"] == 2
    # a stale handler that ran on (it is not cancelled) was told its lease was lost
    assert r.lrange("lost:paused", 0, -1) in ([b"1"], [])
    stale_effects = int(r.hget("ledger", "paused") or 0)  # plain at-least-once: 0 or 1
    if dedup:
        record = r.get(KEYS.group(GROUP).job("paused"))
        assert record is None or record[:1] != b"D", "the stale worker wrote a done record"

    r.set("open:paused", 1)
    wait_for(lambda: not _pending(r), timeout=30, message="the peer to finish and ack the job")
    assert int(r.hget("ledger", "paused") or 0) == stale_effects + 1
    assert [a for a, _ in calls(r, "paused")] == [1, 2]
    assert r.xlen(KEYS.dead) == 0
    assert r.zcard(KEYS.group(GROUP).retries) == 0
    if dedup:
        first, second = (int(t) for t in r.lrange("tokens:paused", 0, -1))
        assert second > first > 0, "the reclaimed run must hold a higher fencing token"
        st = parse(STREAM, GROUP, "paused", r.get(KEYS.group(GROUP).job("paused")))
        assert (st.state, st.fencing_token) == ("done", second)


class BlockingWorker(sw.StreamWorker):
    """In-process worker whose handler waits for ``release`` (an asyncio.Event), then
    succeeds or, with payload ``{"fail": true}``, raises."""

    stream = STREAM
    group = GROUP
    visibility_timeout = 30.0
    read_block = 0.1
    drain_timeout = 5.0
    dedup_window = 600.0
    retry_delay = 0.05
    retry_max_delay = 0.1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, msg: sw.Message) -> None:
        self.started.set()
        await self.release.wait()
        if msg.payload.get("fail"):
            raise RuntimeError("fails after losing the delivery")


@pytest.mark.parametrize("dedup", [False, True], ids=["plain", "dedup"])
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
async def test_stale_consumer_cannot_ack(r: redis.Redis, redis_url: str, dedup: bool,
                                         fail: bool) -> None:
    """A worker whose delivery was XCLAIMed away cannot ack, retry or mark it done."""
    worker = BlockingWorker.from_url(redis_url, dedup=dedup)
    task = asyncio.create_task(worker.serve())
    try:
        with Producer.from_url(redis_url) as p:
            entry_id = p.send(STREAM, {"fail": fail}, key="owned")
        await asyncio.wait_for(worker.started.wait(), 30)
        claimed = r.xclaim(STREAM, GROUP, "thief", 0, [entry_id], justid=True)
        assert [c.decode() for c in claimed] == [entry_id]
        worker.release.set()
        await await_for(lambda: worker.counts["lock_lost"] == 1,
                        message="the worker to find it lost the delivery")
        await await_for(lambda: not worker._consumer.holdings.inflight,  # type: ignore[union-attr]
                        message="the worker to let go of the delivery")
    finally:
        worker.stop()
        await task
    [row] = _pending(r)
    assert row["message_id"].decode() == entry_id
    assert row["consumer"] == b"thief"
    assert worker.counts["acked"] == 0
    assert worker.counts["retried"] == 0
    assert r.zcard(KEYS.group(GROUP).retries) == 0
    assert r.xlen(KEYS.dead) == 0
    assert not r.exists(KEYS.group(GROUP).job("owned")) or \
        r.get(KEYS.group(GROUP).job("owned"))[:1] in (b"H", b"R"), \
        "nothing but the lease it took"


async def test_retries_run_in_order_until_success_with_one_effect(r: redis.Redis,
                                                                  redis_url: str) -> None:
    """A job failing its first 4 attempts is retried through the backoff: attempts 1..5 run
    once each, in order, and only the successful one takes effect. (The delays themselves
    are the policy's business, checked without a clock in test_retry.py.)"""
    with Producer.from_url(redis_url) as p:
        p.send(STREAM, {"fail_until": 5}, key="flaky")
    worker = RecordingWorker.from_url(redis_url, retry_delay=0.05, retry_max_delay=0.2,
                                      max_deliveries=5)
    await run_until_idle(worker, r, timeout=60)
    assert [a for a, _ in calls(r, "flaky")] == [1, 2, 3, 4, 5]
    assert Ledger(r).counts() == {"flaky": 1}
    assert len(_attempt_times(r, "flaky")) == 1, "the effect ran on one attempt only"
    assert (worker.counts["retried"], worker.counts["acked"]) == (4, 1)
    assert worker.counts["dead_lettered"] == 0 and r.xlen(KEYS.dead) == 0
    assert r.zcard(KEYS.group(GROUP).retries) == 0


async def test_delayed_sends_wait_until_due(r: redis.Redis, redis_url: str) -> None:
    """Jobs sent with delay= or at= (sync and async) are handled only once due, and soon after."""
    worker = LedgerWorker.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    try:
        # the delays (1 s and more) leave room for the five sends on a busy machine: the
        # undelayed one, sent last, must still go out before the first delayed one is due
        sent: dict[str, tuple[float, float]] = {}  # key -> (send time, due time)
        with Producer.from_url(redis_url) as p:
            t = time.time()
            p.send(STREAM, {}, key="sync-delay", delay=1.0)
            sent["sync-delay"] = (t, t + 1.0)
            at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1.6)
            t = time.time()
            p.send(STREAM, {}, key="sync-at", at=at)
            sent["sync-at"] = (t, at.timestamp())
        async with AsyncProducer.from_url(redis_url) as ap:
            t = time.time()
            await ap.send(STREAM, {}, key="async-delay", delay=1.2)
            sent["async-delay"] = (t, t + 1.2)
            at = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=1.4)
            t = time.time()
            await ap.send(STREAM, {}, key="async-at", at=at)
            sent["async-at"] = (t, at.timestamp())
        with Producer.from_url(redis_url) as p:
            p.send(STREAM, {}, key="now")
        await await_for(lambda: len(Ledger(r).counts()) == 5, message="all jobs handled")
    finally:
        worker.stop()
        await task
    assert r.zcard(KEYS.group(GROUP).retries) == 0
    for key, (_, due) in sent.items():
        [handled] = _attempt_times(r, key)
        assert handled >= due - 0.02, f"{key} handled {due - handled:.3f}s before it was due"
        assert handled <= due + 1.0, f"{key} handled {handled - due:.3f}s after it was due"
    [now_handled] = _attempt_times(r, "now")
    assert now_handled < min(due for _, due in sent.values()), \
        "an undelayed job waited behind delayed ones"


async def test_a_crashed_workers_read_ahead_is_reclaimed_in_batches(
    r: redis.Redis, redis_url: str, spawn_worker: Callable[..., subprocess.Popen[bytes]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker process holding 2 running jobs and 100 read ahead is SIGKILLed: another
    worker takes the 102 back in a few batches (they were delivered once: innocents most
    likely), not one at a time each running alone, and every job takes effect once."""
    blockers = ["blocker-0", "blocker-1"]
    rest = [f"job-{i}" for i in range(120)]
    with Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{"first_sleep": 60}] * 2, keys=blockers)
        p.send_many(STREAM, [{}] * len(rest), keys=rest)
    proc = spawn_worker("tests.workers.recording:RecordingWorker", redis_url,
                        "--concurrency", "2", "--batch-size", "100",
                        "--visibility-timeout", "1", "--read-block", "0.1")
    def held() -> int:
        try:
            return int(r.xpending(STREAM, GROUP)["pending"])
        except redis.ResponseError:  # its group is not created yet
            return 0

    wait_for(lambda: held() == 102, timeout=30,
             message="the worker to hold 2 running and 100 read-ahead jobs")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    caplog.set_level(logging.WARNING, logger="streamwork.worker")
    worker = RecordingWorker.from_url(redis_url, concurrency=8, batch_size=100,
                                      visibility_timeout=1.0, reclaim_interval=0.2)
    await run_until_idle(worker, r, timeout=60)

    assert Ledger(r).report(blockers + rest).exactly_once
    assert worker.counts["reclaimed"] == 102, worker.counts
    lines = [rec.getMessage() for rec in caplog.records if "reclaimed" in rec.getMessage()]
    assert not [line for line in lines if "suspect" in line], lines
    batches = [line for line in lines if "run as a batch" in line]
    assert 1 <= len(batches) <= 3, lines
