"""A job waiting over a limit whose lease is lost meanwhile is let go.

A job over its concurrency key's cap goes back to the run queue after a short pause, held.
If its lease is lost in that pause (another worker took it: this worker stalled, or Redis
was out of reach for longer than the visibility timeout), the worker must forget it: it
counted among the jobs held, so a worker that kept such jobs stopped reading once they
filled its capacity, alive but idle. Found by the nemesis campaign
(tests/faults/test_nemesis.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork.testing import await_for

STREAM = GROUP = "capped"


class Capped(sw.StreamWorker):
    """One job per key at a time; capacity 3 (concurrency 2 + batch 1)."""

    stream, group = STREAM, GROUP
    concurrency = 2
    batch_size = 1
    concurrency_per_key = 1
    visibility_timeout = 4.0
    # the thief never acks, so its deliveries go idle: this worker's reclaimer would take
    # them back (rightly: the thief looks dead) if a sweep came before a heartbeat noticed
    # the theft, as one did on a loaded machine; then that job is held again, waiting over
    # its cap, and is not lost. What is tested is the heartbeat letting stolen jobs go, so
    # no sweep runs within the test
    reclaim_interval = 3600.0
    read_block = 0.05

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.ran: list[str] = []

    def concurrency_key(self, msg: sw.Message) -> str:
        return str(msg.payload["k"])

    async def handle(self, msg: sw.Message) -> None:
        self.ran.append(msg.key)


@contextlib.asynccontextmanager
async def three_stolen(redis_url: str, r: redis.Redis, worker: type[Capped],
                       **claim: Any) -> AsyncIterator[tuple[Capped, sw.Producer, str]]:
    """Three jobs of key "x" held by a ``worker`` while they wait over the key's cap (a
    holder outside the worker has it), then taken over by a consumer "thief" (XCLAIM with
    ``claim``); yields the worker, a producer and the key's semaphore."""
    semaphore = StreamKeys.for_stream(STREAM).group(GROUP).semaphore("x")
    r.zadd(semaphore, {"someone-else": int(time.time() * 1000) + 3_600_000})
    with sw.Producer.from_url(redis_url) as p:
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        for i in range(3):
            p.send(STREAM, {"k": "x"}, key=f"x{i}")
        w = worker.from_url(redis_url)
        task = asyncio.create_task(w.serve())
        try:
            # admitted, not only read: a theft between XREADGROUP and the worker's claim of
            # the job records is answered "not ours" by the claim (let go, counted
            # not_ours), as one was on a busy machine; what is tested here is the heartbeat
            await await_for(lambda: all(p.status(STREAM, f"x{i}", group=GROUP).state == "queued"
                                        for i in range(3)), timeout=30,
                            message="the three jobs to be claimed, waiting over the key's cap")
            ids = [e["message_id"] for e in r.xpending_range(STREAM, GROUP, "-", "+", 10)]
            r.xclaim(STREAM, GROUP, "thief", 0, ids, justid=True, **claim)
            yield w, p, semaphore
        finally:
            w.stop()
            await asyncio.wait_for(task, 30)


async def test_waiting_jobs_whose_lease_is_lost_are_let_go(redis_url: str,
                                                           r: redis.Redis) -> None:
    """Three jobs of key "x" wait over its cap and fill the worker's capacity; another
    consumer takes them over, so their leases are lost; the worker must let them go and go
    on reading: a job of key "y" sent then runs."""
    async with three_stolen(redis_url, r, Capped) as (w, p, _):
        await await_for(lambda: w.counts["lock_lost"] == 3, timeout=30)
        p.send(STREAM, {"k": "y"}, key="y0")
        await await_for(lambda: "y0" in w.ran, timeout=30,
                        message="the job of key y to run (the lost jobs filled the worker)")
        assert not any(k.startswith("x") for k in w.ran)


class Sweeping(Capped):
    """`Capped` whose reclaimer sweeps often."""

    visibility_timeout = 1.0
    reclaim_interval = 0.1


async def test_stolen_waiting_jobs_taken_back_by_the_reclaimer_run_once(
        redis_url: str, r: redis.Redis) -> None:
    """The same theft, but the thief's deliveries look long idle at once (XCLAIM ... IDLE),
    so this worker's reclaimer may take them back before or after its heartbeat sees them
    gone (the first leaves them held as they were, the second lets them go and takes them
    back as new deliveries). Once the key's cap frees, every job still runs
    exactly once."""
    async with three_stolen(redis_url, r, Sweeping, idle=60_000) as (w, _, semaphore):
        await await_for(lambda: not any(
            e["consumer"] == b"thief"
            for e in r.xpending_range(STREAM, GROUP, "-", "+", 10)), timeout=30,
            message="the worker to hold the stolen deliveries again")
        r.delete(semaphore)
        await await_for(lambda: sorted(w.ran) == ["x0", "x1", "x2"], timeout=30,
                        message="each job of key x to run once")
        await await_for(lambda: int(r.xpending(STREAM, GROUP)["pending"]) == 0, timeout=30)
        assert sorted(w.ran) == ["x0", "x1", "x2"]
