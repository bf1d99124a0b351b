"""The delivery loop's own rules (consumer.py), against a real redis-server, with workers
served in-process: how much it holds, how many handlers run, where they run, what a
handler's exception becomes, how stop() drains, what health() says, the local done-cache,
and that a fatal error ends serve().

Waits are on conditions (``await_for``); where a rule says something must *not* happen,
the test watches for it while the worker's own loops take several turns (`worker_turns`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._ops.deadletter import list_dead
from streamwork._wire.keys import StreamKeys
from streamwork.errors import WorkerFailed
from streamwork.testing import await_for, run_until_idle, stream_idle
from tests.helpers.serving import serving

STREAM, GROUP = "jobs", "consumer-tests"
KEYS = StreamKeys.for_stream(STREAM)


class Probe(sw.StreamWorker):
    """Async handler that records every call and counts handlers in flight. Payload keys:
    ``block`` - wait until the test sets ``gate``; ``fail`` - raise ValueError;
    ``dead`` - raise DeadLetter with that reason."""

    stream = STREAM
    group = GROUP
    dedup = False
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.05
    drain_timeout = 10.0

    def __init__(self, url: str | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self.calls: list[sw.Message] = []
        self.active = 0
        self.peak = 0
        self.gate = asyncio.Event()

    async def handle(self, msg: sw.Message) -> None:
        self.calls.append(msg)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            p: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
            if p.get("block"):
                await self.gate.wait()
            if p.get("fail"):
                raise ValueError(f"boom on attempt {msg.attempt}")
            if p.get("dead"):
                raise sw.DeadLetter(p["dead"])
        finally:
            self.active -= 1

    def runs(self) -> Counter[str]:
        """How many times the handler was called per job key."""
        return Counter(m.key for m in self.calls)


def where() -> tuple[int, asyncio.AbstractEventLoop | None]:
    """(this thread's id, the event loop running in this thread or None)."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    return threading.get_ident(), loop


class AsyncWhere(Probe):
    """Records where its ``async def`` handler runs."""

    def __init__(self, url: str | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self.places: list[tuple[int, asyncio.AbstractEventLoop | None]] = []

    async def handle(self, msg: sw.Message) -> None:
        self.places.append(where())


class SyncWhere(AsyncWhere):
    """Records where its plain ``def`` handler runs."""

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        self.places.append(where())


def send(url: str, n: int, payload: Any = None, prefix: str = "job") -> list[str]:
    keys = [f"{prefix}-{i}" for i in range(n)]
    with sw.Producer.from_url(url) as p:
        p.send_many(STREAM, [payload if payload is not None else {}] * n, keys=keys)
    return keys


def held_in_redis(r: redis.Redis, consumer: str) -> int:
    """Entries of the group's PEL owned by ``consumer`` (XPENDING summary)."""
    for row in r.xpending(STREAM, GROUP)["consumers"]:
        if row["name"].decode() == consumer:
            return int(row["pending"])
    return 0


def script_calls(r: redis.Redis) -> int:
    stats: dict[str, Any] = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


async def worker_turns(r: redis.Redis, turns: int = 10, watch: Any = None) -> None:
    """Wait until the worker's own loops have made ``turns`` more script calls (its promoter
    makes one every 0.1 s whatever else happens), calling ``watch()`` at every look: the
    window in which a test checks that something does *not* happen."""
    start = script_calls(r)

    def turned() -> bool:
        if watch is not None:
            watch()
        return script_calls(r) >= start + turns

    await await_for(turned, message=f"{turns} turns of the worker's loops")


# ---- how much a worker takes on ---------------------------------------------------------


async def test_never_holds_more_than_concurrency_plus_batch_size(redis_url: str,
                                                                 r: redis.Redis) -> None:
    """While every handler blocks, the worker's consumer owns exactly concurrency +
    batch_size entries in the PEL and reads no more, however many wait in the stream."""
    worker = Probe.from_url(redis_url, concurrency=2, batch_size=3)
    bound = 2 + 3
    async with serving(worker, ready=True, release=worker.gate.set):
        keys = send(redis_url, 40, {"block": True})
        await await_for(lambda: held_in_redis(r, worker.consumer_name) >= bound
                        and worker.active == 2, message=f"{bound} held, 2 running")
        most = 0

        def watch() -> None:
            nonlocal most
            most = max(most, held_in_redis(r, worker.consumer_name))

        await worker_turns(r, watch=watch)
        assert most == bound, f"held {most} deliveries, bound is {bound}"
        assert held_in_redis(r, worker.consumer_name) == bound
        assert r.xpending(STREAM, GROUP)["pending"] == bound
        assert worker.active == 2 and len(worker.calls) == 2
        worker.gate.set()
        await await_for(lambda: stream_idle(r, STREAM, GROUP), message="every job done")
    assert worker.runs() == Counter(keys)
    assert worker.counts["acked"] == 40


async def test_handlers_run_concurrently_up_to_concurrency_never_more(
        redis_url: str, r: redis.Redis) -> None:
    """With more jobs held than runners, exactly `concurrency` handlers are in flight at
    once, never more, also after they start finishing."""
    worker = Probe.from_url(redis_url, concurrency=3)
    async with serving(worker, ready=True, release=worker.gate.set):
        keys = send(redis_url, 12, {"block": True})
        await await_for(lambda: worker.active == 3
                        and held_in_redis(r, worker.consumer_name) == 12,
                        message="3 handlers in flight, all 12 jobs held")
        await worker_turns(r)
        assert worker.active == 3 and worker.peak == 3
        worker.gate.set()
        await await_for(lambda: stream_idle(r, STREAM, GROUP), message="every job done")
    assert worker.peak == 3, f"{worker.peak} handlers ran at once, concurrency is 3"
    assert worker.runs() == Counter(keys)


# ---- where handlers run -----------------------------------------------------------------


async def test_async_handler_runs_on_the_event_loop(redis_url: str, r: redis.Redis) -> None:
    """An ``async def`` handler runs in the thread and event loop that serve() runs in."""
    send(redis_url, 5)
    worker = AsyncWhere.from_url(redis_url)
    await run_until_idle(worker, r)
    here = (threading.get_ident(), asyncio.get_running_loop())
    assert worker.places == [here] * 5


async def test_sync_handler_runs_in_a_thread_off_the_loop(redis_url: str,
                                                          r: redis.Redis) -> None:
    """A plain ``def`` handler runs in a pool thread, never in the loop's thread, and no
    event loop runs in that thread (it may block freely)."""
    send(redis_url, 5)
    worker = SyncWhere.from_url(redis_url, concurrency=2)
    await run_until_idle(worker, r)
    assert len(worker.places) == 5
    threads = {thread for thread, _ in worker.places}
    assert threading.get_ident() not in threads
    assert all(loop is None for _, loop in worker.places)
    assert len(threads) <= 2, "more threads than concurrency"


# ---- what a handler's exception becomes -------------------------------------------------


async def test_exception_is_retried_then_dead_lettered(redis_url: str, r: redis.Redis) -> None:
    """A handler that keeps raising is retried until max_deliveries, then its job goes to
    the dead letters once, with reason max_deliveries, the attempts made and the error."""
    send(redis_url, 1, {"fail": True}, prefix="flaky")
    worker = Probe.from_url(redis_url, max_deliveries=3)
    await run_until_idle(worker, r)
    assert [(m.key, m.attempt) for m in worker.calls] == [("flaky-0", 1), ("flaky-0", 2),
                                                          ("flaky-0", 3)]
    [dead] = list_dead(r, STREAM)
    assert (dead.key, dead.reason, dead.attempts, dead.error_type) == (
        "flaky-0", "max_deliveries", 3, "ValueError")
    assert dead.detail.startswith("boom on attempt 3")
    assert (worker.counts["retried"], worker.counts["dead_lettered"]) == (2, 1)
    assert worker.counts["acked"] == 0
    assert r.xpending(STREAM, GROUP)["pending"] == 0 and r.zcard(KEYS.group(GROUP).retries) == 0


async def test_dead_letter_skips_the_retries(redis_url: str, r: redis.Redis) -> None:
    """A handler raising DeadLetter(reason) sends its job to the dead letters at once, on
    attempt 1, with reason "dead_letter: <reason>"."""
    send(redis_url, 1, {"dead": "card declined"}, prefix="card")
    worker = Probe.from_url(redis_url, max_deliveries=5)
    await run_until_idle(worker, r)
    assert [m.attempt for m in worker.calls] == [1]
    [dead] = list_dead(r, STREAM)
    assert (dead.key, dead.reason, dead.attempts, dead.error_type) == (
        "card-0", "dead_letter: card declined", 1, "DeadLetter")
    assert (worker.counts["retried"], worker.counts["dead_lettered"]) == (0, 1)


# ---- stopping ---------------------------------------------------------------------------


async def test_stop_finishes_what_it_holds_and_reads_no_more(redis_url: str,
                                                             r: redis.Redis) -> None:
    """After stop() the worker reads nothing new; every delivery it held (running or
    queued) still runs once and is acked before serve() returns; unread jobs stay for
    other workers."""
    worker = Probe.from_url(redis_url, concurrency=2, batch_size=3)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.health().ready, message="the worker to be ready")
        send(redis_url, 10, {"block": True})
        await await_for(lambda: held_in_redis(r, worker.consumer_name) == 5
                        and worker.active == 2, message="5 held, 2 running")
        worker.stop()
        await await_for(lambda: worker.health().draining, message="the worker draining")
        worker.gate.set()
    finally:
        worker.gate.set()
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert len(worker.runs()) == 5 and set(worker.runs().values()) == {1}
    assert worker.counts["acked"] == 5
    assert r.xpending(STREAM, GROUP)["pending"] == 0
    unread: Any = r.xreadgroup(GROUP, "someone-else", {STREAM: ">"})
    assert len(unread[0][1]) == 5, "the stopping worker read jobs it did not run"


async def test_stop_gives_up_on_a_stuck_handler_after_drain_timeout(
        redis_url: str, r: redis.Redis) -> None:
    """A handler that never returns does not hold stop() hostage: serve() returns once
    drain_timeout has passed, and the delivery stays pending (not acked, not lost, not
    dead-lettered) for another worker to reclaim."""
    worker = Probe.from_url(redis_url, drain_timeout=0.3)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.health().ready, message="the worker to be ready")
        send(redis_url, 1, {"block": True}, prefix="stuck")
        await await_for(lambda: worker.active == 1, message="the stuck handler to start")
        worker.stop()
        # the gate never opens: only drain_timeout can end serve()
        await asyncio.wait_for(task, 20)
    finally:
        if not task.done():
            worker.gate.set()
            await task
    assert held_in_redis(r, worker.consumer_name) == 1
    assert worker.counts["acked"] == 0 and r.xlen(KEYS.dead) == 0


# ---- health -----------------------------------------------------------------------------


async def test_health_is_alive_and_ready_while_serving_and_not_after_stop(
        redis_url: str, r: redis.Redis) -> None:
    """health(): nothing alive before serve(); alive, ready, Redis answering and no dead
    task while serving; not ready while draining; neither alive nor ready after stop."""
    worker = Probe.from_url(redis_url)
    assert worker.health() == sw.Health(False, False, False, False, ())
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.health().ready, message="the worker to be ready")
        assert worker.health() == sw.Health(alive=True, ready=True, draining=False,
                                            redis_ok=True, dead_tasks=())
        send(redis_url, 1, {"block": True})
        await await_for(lambda: worker.active == 1, message="the handler to start")
        worker.stop()
        await await_for(lambda: worker.health().draining, message="the worker draining")
        assert not worker.health().ready, "a draining worker must not say it is ready"
    finally:
        worker.gate.set()
        worker.stop()
        await task
    health = worker.health()
    assert not health.alive and not health.ready


# ---- the local done-cache ---------------------------------------------------------------


async def test_local_cache_duplicate_is_acked_without_running(redis_url: str,
                                                              r: redis.Redis) -> None:
    """With dedup on, copies of a key sent after its first run finished are acked from the
    in-process cache alone: the handler does not run again and no lease is taken, even
    though Redis no longer has the job's done record."""
    worker = Probe.from_url(redis_url, dedup=True, dedup_window=600.0)
    async with serving(worker, ready=True, release=worker.gate.set):
        send(redis_url, 1, prefix="once")
        # counted once the worker has the reply, so its cache has the key by then
        await await_for(lambda: worker.counts["acked"] == 1, message="the first run acked")
        record = KEYS.group(GROUP).job("once-0")
        assert r.get(record)[:1] == b"D", "the done record of the first run"
        r.delete(record)  # only the local cache knows the job is done now
        fence = r.get(KEYS.fence)
        send(redis_url, 1, prefix="once")
        send(redis_url, 1, prefix="once")
        await await_for(lambda: stream_idle(r, STREAM, GROUP), message="both copies acked")
    assert worker.runs() == {"once-0": 1}
    assert (worker.counts["consumed"], worker.counts["deduplicated"]) == (1, 2)
    assert r.get(KEYS.fence) == fence, "a lease was taken for a copy the cache knew"
    assert r.xlen(STREAM) == 3 and r.xpending(STREAM, GROUP)["pending"] == 0


# ---- fatal errors -----------------------------------------------------------------------


async def test_a_non_stream_key_in_the_way_at_start_fails_serve(redis_url: str,
                                                                r: redis.Redis) -> None:
    """A string where the stream should be (WRONGTYPE) is no outage to ride out: serve()
    raises WorkerFailed at start, naming the cause."""
    r.set(STREAM, "not a stream")
    worker = Probe.from_url(redis_url)
    with pytest.raises(WorkerFailed) as info:
        await asyncio.wait_for(worker.serve(), 30)
    assert "WRONGTYPE" in str(info.value)
    assert not worker.health().alive
    assert worker.calls == []


async def test_a_non_stream_key_in_the_way_while_serving_fails_serve(
        redis_url: str, r: redis.Redis) -> None:
    """The stream replaced by a string while the worker serves: serve() stops by itself
    and raises WorkerFailed naming WRONGTYPE; the worker is no longer alive."""
    worker = Probe.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.health().ready, message="the worker to be ready")
        send(redis_url, 3)
        await await_for(lambda: len(worker.calls) == 3, message="the first jobs handled")
        r.set(STREAM, "not a stream")  # SET replaces a key of any type
        with pytest.raises(WorkerFailed) as info:
            await asyncio.wait_for(asyncio.shield(task), 30)
    finally:
        worker.stop()
        with contextlib.suppress(WorkerFailed):
            await task
    assert "WRONGTYPE" in str(info.value)
    assert not worker.health().alive
