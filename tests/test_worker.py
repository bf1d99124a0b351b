"""StreamWorker against a real redis-server: handlers, serve/stop, bad entries, batching,
and several worker processes sharing one group."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

import streamwork as sw
from streamwork._wire.codec import encode_body
from streamwork._wire.keys import StreamKeys
from streamwork.testing import Ledger, await_for, run_until_idle, stream_idle, wait_for
from tests.workers.ledger import STREAM, LedgerWorker, SyncLedgerWorker
from tests.workers.probes import AsyncProbeWorker, FirstAttemptSlowWorker, SyncProbeWorker

GROUP = LedgerWorker.group


def send_jobs(url: str, n: int, prefix: str = "job", payload: Any = None) -> list[str]:
    keys = [f"{prefix}-{i}" for i in range(n)]
    with sw.Producer.from_url(url) as p:
        for i in range(0, n, 500):
            chunk = keys[i:i + 500]
            p.send_many(STREAM, [payload if payload is not None else {"n": k} for k in chunk],
                        keys=chunk)
    return keys


def pending(r: redis.Redis) -> int:
    return int(r.xpending(STREAM, GROUP)["pending"])


def assert_exactly_once(r: redis.Redis, keys: list[str]) -> None:
    report = Ledger(r).report(keys)
    assert not report.lost, f"{len(report.lost)} jobs never handled, e.g. {report.lost[:5]}"
    assert not report.twice, f"jobs handled twice: {dict(list(report.twice.items())[:5])}"
    assert len(Ledger(r).counts()) == len(keys)


async def wait_async(predicate: Callable[[], Any], timeout: float = 30.0,
                     message: str = "condition") -> Any:
    """wait_for in a thread, so the worker on this loop keeps running meanwhile."""
    return await asyncio.to_thread(wait_for, predicate, timeout, 0.02, message)


# ---- handlers ---------------------------------------------------------------------------


@pytest.mark.parametrize("worker_cls", [LedgerWorker, SyncLedgerWorker],
                         ids=["async", "sync"])
async def test_handler_processes_every_job_once(redis_url: str, r: redis.Redis,
                                                worker_cls: type[LedgerWorker]) -> None:
    """Async and sync handlers handle N jobs once each; all acked, PEL empty."""
    keys = send_jobs(redis_url, 300)
    worker = worker_cls.from_url(redis_url)
    await run_until_idle(worker, r, timeout=60)
    assert_exactly_once(r, keys)
    assert pending(r) == 0
    assert worker.counts["acked"] == 300
    assert worker.counts["consumed"] == 300


async def test_sync_handlers_run_in_a_bounded_thread_pool(redis_url: str,
                                                          r: redis.Redis) -> None:
    """A plain def handle runs off the event loop, up to `concurrency` at once, no more."""
    keys = send_jobs(redis_url, 24, payload={"sleep": 0.1})
    worker = SyncProbeWorker.from_url(redis_url, concurrency=4)
    loop_thread = threading.get_ident()
    await run_until_idle(worker, r, timeout=60)
    assert_exactly_once(r, keys)
    assert loop_thread not in worker.threads
    assert 1 < worker.peak <= 4, f"peak concurrency {worker.peak}, limit 4"
    assert len(worker.threads) <= 4


async def test_async_handlers_run_concurrently_up_to_the_limit(redis_url: str,
                                                               r: redis.Redis) -> None:
    """async handlers run on the loop, several at once, never more than `concurrency`."""
    keys = send_jobs(redis_url, 30, payload={"sleep": 0.1})
    worker = AsyncProbeWorker.from_url(redis_url, concurrency=5)
    await run_until_idle(worker, r, timeout=60)
    assert_exactly_once(r, keys)
    assert worker.threads == {threading.get_ident()}
    assert 1 < worker.peak <= 5, f"peak concurrency {worker.peak}, limit 5"


async def test_message_fields(redis_url: str, r: redis.Redis) -> None:
    """The handler's Message carries id, stream, key, payload, attempt 1, enqueue time,
    headers, and fencing_token None with dedup off / increasing ints with dedup on."""
    before = time.time()
    with sw.Producer.from_url(redis_url) as p:
        first = p.send(STREAM, {"a": [1, 2]}, key="k-1", headers={"tenant": "eu"})
        second = p.send(STREAM, b"\x00raw", key="k-2")
    worker = AsyncProbeWorker.from_url(redis_url)
    await run_until_idle(worker, r, timeout=60)
    by_key = {m.key: m for m in worker.messages}
    m1, m2 = by_key["k-1"], by_key["k-2"]
    assert (m1.id, m1.stream, m1.payload, m1.attempt) == (first, STREAM, {"a": [1, 2]}, 1)
    assert (m2.id, m2.payload) == (second, b"\x00raw")
    assert m1.headers["tenant"] == "eu"
    assert before - 1 <= m1.enqueued_at <= time.time() + 1
    assert m1.fencing_token is None and m2.fencing_token is None

    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, 1, key="k-3")
        p.send(STREAM, 2, key="k-4")
    dedup = AsyncProbeWorker.from_url(redis_url, dedup=True, dedup_window=600.0, group="fenced",
                                      concurrency=1)
    await run_until_idle(dedup, r, timeout=60)
    tokens = [m.fencing_token for m in dedup.messages]
    assert len(tokens) == 4 and all(isinstance(t, int) and t > 0 for t in tokens)
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


# ---- lifecycle --------------------------------------------------------------------------


def test_serve_in_a_thread_stops_when_stop_is_called_from_another(redis_url: str,
                                                                  r: redis.Redis) -> None:
    """serve() running in its own thread's loop returns after stop() from the test thread."""
    worker = LedgerWorker.from_url(redis_url)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            asyncio.run(worker.serve())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    keys = send_jobs(redis_url, 20)
    wait_for(lambda: len(Ledger(r).counts()) == 20, 30, message="20 jobs handled")
    worker.stop()
    thread.join(20)
    assert not thread.is_alive(), "serve() did not return after stop()"
    assert not errors
    assert_exactly_once(r, keys)
    assert pending(r) == 0


async def test_stop_from_another_thread_ends_serve_in_this_loop(redis_url: str,
                                                                r: redis.Redis) -> None:
    """await worker.serve() in a running loop returns once stop() is called from a thread."""
    worker = LedgerWorker.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    keys = send_jobs(redis_url, 10)
    await wait_async(lambda: len(Ledger(r).counts()) == 10, message="10 jobs handled")
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    await asyncio.wait_for(task, 20)
    stopper.join()
    assert_exactly_once(r, keys)


async def test_stop_before_serve_returns_at_once(redis_url: str) -> None:
    """stop() called before serve() makes serve() return without waiting for jobs."""
    worker = LedgerWorker.from_url(redis_url)
    worker.stop()
    await asyncio.wait_for(worker.serve(), 20)


async def test_stop_drains_the_job_in_flight(redis_url: str, r: redis.Redis) -> None:
    """A job running when stop() is called finishes and is acked before serve() returns."""
    worker = LedgerWorker.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 1.0}, key="slow")
    await wait_async(lambda: r.exists("attempt-times:slow"), message="slow job started")
    worker.stop()
    await asyncio.wait_for(task, 20)
    assert Ledger(r).counts() == {"slow": 1}
    assert pending(r) == 0


async def test_job_past_drain_timeout_stays_pending_and_is_reclaimed(redis_url: str,
                                                                     r: redis.Redis) -> None:
    """A job still running at drain_timeout is left pending (never lost, never acked) and
    another worker reclaims and completes it."""
    worker = FirstAttemptSlowWorker.from_url(redis_url, drain_timeout=0.2)
    task = asyncio.create_task(worker.serve())
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 30}, key="stuck")
    await wait_async(lambda: r.exists("attempt-times:stuck"), message="stuck job started")
    started = time.monotonic()
    worker.stop()
    await asyncio.wait_for(task, 20)
    assert time.monotonic() - started < 10, "serve() waited past drain_timeout"
    assert pending(r) == 1 and Ledger(r).counts() == {}

    rescuer = FirstAttemptSlowWorker.from_url(redis_url, visibility_timeout=0.5,
                                              reclaim_interval=0.1)
    await run_until_idle(rescuer, r, timeout=60)
    assert rescuer.counts["reclaimed"] == 1
    assert Ledger(r).counts() == {"stuck": 1}
    assert r.llen("attempt-times:stuck") == 2
    assert pending(r) == 0


async def test_jobs_sent_before_the_first_worker_are_delivered(redis_url: str,
                                                               r: redis.Redis) -> None:
    """The group is created at id 0: jobs enqueued before any worker ran are handled."""
    keys = send_jobs(redis_url, 50, prefix="early")
    assert r.xinfo_groups(STREAM) == []
    worker = LedgerWorker.from_url(redis_url)
    await run_until_idle(worker, r, timeout=60)
    assert_exactly_once(r, keys)
    assert pending(r) == 0


# ---- entries that do not decode ---------------------------------------------------------


GARBAGE: list[tuple[dict[bytes, bytes], str]] = [
    ({b"d": b"\xc1 not msgpack \xff"}, "decode_error:FormatError"),
    ({b"x": b"\x00\xff raw", b"\xfe\xff": b"bin\x00"}, "schema:no_data_field"),
    ({b"d": msgpack.packb({"v": 4, "k": "v4", "t": 1, "h": {}, "p": 1}), b"a": b"1"},
     "unknown_version"),
    ({b"d": encode_body("extra", 1) + b"junk"}, "decode_error:extra_data"),
    ({b"d": msgpack.packb([1, 2, 3])}, "schema:envelope_not_map"),
]


async def test_garbage_entries_go_to_dead_letters_byte_for_byte(redis_url: str,
                                                               r: redis.Redis) -> None:
    """Undecodable entries are dead-lettered with their reason and original fields byte for
    byte under f.<name>, acked, not retried, and the worker goes on with good jobs."""
    keys = send_jobs(redis_url, 5, prefix="before")
    garbage_ids = [r.xadd(STREAM, fields).decode() for fields, _ in GARBAGE]
    keys += send_jobs(redis_url, 5, prefix="after")
    worker = LedgerWorker.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    try:
        await wait_async(lambda: stream_idle(r, STREAM, GROUP), message="first batch done")
        # garbage arriving while the worker runs is handled the same way
        late_id = r.xadd(STREAM, {b"d": b""}).decode()
        keys += send_jobs(redis_url, 5, prefix="late")
        await wait_async(lambda: len(Ledger(r).counts()) == 15 and
                         stream_idle(r, STREAM, GROUP), message="late good jobs handled")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 20)

    assert_exactly_once(r, keys)
    assert pending(r) == 0
    dead = r.xrange(StreamKeys.for_stream(STREAM).dead)
    expected = [*((gid, fields, reason) for gid, (fields, reason)
                  in zip(garbage_ids, GARBAGE, strict=True)),
                (late_id, {b"d": b""}, "decode_error:incomplete")]
    assert len(dead) == len(expected), "each bad entry is dead-lettered exactly once"
    for (_, values), (src_id, fields, reason) in zip(dead, expected, strict=True):
        assert values[b"reason"].decode() == reason
        assert values[b"src_id"].decode() == src_id
        assert values[b"src_stream"].decode() == STREAM
        original = {k[2:]: v for k, v in values.items() if k.startswith(b"f.")}
        assert original == fields, "original fields must be kept byte for byte"
    assert worker.counts["undecodable"] == len(expected)
    assert worker.counts["retried"] == 0


async def test_acks_are_batched(redis_url: str, r: redis.Redis) -> None:
    """500 jobs with dedup off are completed with far fewer script calls than jobs."""
    keys = send_jobs(redis_url, 500)
    r.config_resetstat()
    worker = LedgerWorker.from_url(redis_url, concurrency=16, dedup=False)
    await run_until_idle(worker, r, timeout=60)
    assert_exactly_once(r, keys)
    stats = r.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {}).get("calls", 0)
    evals = stats.get("cmdstat_eval", {}).get("calls", 0)
    bare_acks = stats.get("cmdstat_xack", {}).get("calls", 0)
    assert evalsha + evals < 500 // 2, f"{evalsha} EVALSHA + {evals} EVAL for 500 jobs"
    assert bare_acks < 500 // 2, f"{bare_acks} XACK calls for 500 jobs"


# ---- several worker processes -----------------------------------------------------------


def blocked_readers(r: redis.Redis) -> int:
    """Connections blocked in XREADGROUP right now (a worker that is up and reading)."""
    return sum(1 for c in r.client_list() if c.get("cmd") == "xreadgroup" and "b" in c["flags"])


def test_three_worker_processes_share_the_work(
        redis_url: str, r: redis.Redis,
        spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """3 `streamwork run` processes handle 3000 jobs once each, PEL empty; SIGTERM -> exit 0."""
    procs = [spawn_worker("tests.workers.ledger:LedgerWorker", redis_url) for _ in range(3)]
    wait_for(lambda: blocked_readers(r) >= 3, 60, interval=0.1,
             message="3 worker processes waiting in XREADGROUP")
    keys = send_jobs(redis_url, 3000)
    wait_for(lambda: len(Ledger(r).counts()) >= 3000 and stream_idle(r, STREAM, GROUP), 60,
             interval=0.1, message="3000 jobs handled and acked")
    assert_exactly_once(r, keys)
    assert pending(r) == 0
    consumers = r.xinfo_consumers(STREAM, GROUP)
    pids = {int(c["name"].decode().rsplit("-", 2)[1]) for c in consumers}
    assert pids == {p.pid for p in procs}, "each process is its own consumer"
    for proc in procs:
        assert proc.poll() is None, "a worker process died"
        os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=30) == 0


async def test_lifecycle_hooks_run_once_around_serving(redis_url: str, r: Any) -> None:
    """on_start runs before the first job, on_stop after the drain, sync or async."""
    from streamwork.testing import run_until_idle
    from tests.workers.ledger import LedgerWorker

    events: list[str] = []

    class Hooked(LedgerWorker):
        async def on_start(self) -> None:
            events.append("start")

        def on_stop(self) -> None:  # type: ignore[override]
            events.append("stop")
            super().on_stop()

        async def handle(self, msg: sw.Message) -> None:
            events.append("job")

    sw.Producer.from_url(redis_url).send_many("jobs", [{}] * 3)
    await run_until_idle(Hooked.from_url(redis_url), r)
    assert events == ["start", "job", "job", "job", "stop"]


@pytest.mark.parametrize("partitions", [1, 3])
async def test_stop_while_redis_never_answered_returns_at_once(partitions: int) -> None:
    """A worker still waiting for Redis at start (nothing listens on its port) stops as soon
    as it is asked, instead of retrying until Redis answers."""
    from streamwork._redis.server import free_port

    w = LedgerWorker.from_url(f"redis://127.0.0.1:{free_port()}/0", partitions=partitions)
    task = asyncio.create_task(w.serve())

    def backing_off() -> bool:  # it met the refused connection and waits to try again
        if w._partitioned is not None:
            sup = w._partitioned.start_sup
            return sup is not None and sup.failures > 0
        return w._consumer is not None and w._consumer.sup.failures > 0

    await await_for(backing_off, timeout=10, message="the worker to retry its connection")
    assert not task.done() and not w.health().ready
    w.stop()
    await asyncio.wait_for(task, 3.0)  # before the fix: retried until Redis answered


def test_sigterm_while_redis_down_exits_promptly(spawn_worker: Any, tmp_path: Path) -> None:
    """`streamwork run` against a Redis that never answers: SIGTERM ends it (exit 0)."""
    from streamwork._redis.server import free_port

    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = spawn_worker("tests.workers.ledger:LedgerWorker",
                            f"redis://127.0.0.1:{free_port()}/0", stdout=out)
        wait_for(lambda: b"redis unavailable, retrying" in log.read_bytes(), timeout=30,
                 message="the worker to back off from the unreachable Redis")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
