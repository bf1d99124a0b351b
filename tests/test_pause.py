"""Pausing a consumer group: within about a second its workers start no job, while jobs
keep arriving; what they hold stays theirs (heartbeated, never reclaimed, no delivery
counted) however long the pause; resumed, every job runs exactly once. The pause lives in
Redis: it outlives a worker restart and a redis-server restart, and every worker of the
group sees it."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork._wire.priorities import sibling_streams
from streamwork._worker.features.pause import Pausing
from streamwork.testing import await_for, free_port, stream_idle

STREAM, GROUP = "pausing", "payments"
PAUSED_KEY = StreamKeys.for_stream(STREAM).group(GROUP).paused
#: s after a worker shows the pause within which a start may still land: a runner that
#: took its job just before (its start check on the way to Redis); generous for a busy box
GRACE = 1.0
#: s a worker may take to see a pause: its one-second poll, plus a busy machine's delays
SEES_WITHIN = 1.0 + 3.0


class Recorder(sw.StreamWorker):
    """Records when each job starts (loop clock) and how often each key completes."""

    stream, group = STREAM, GROUP
    read_block = 0.05
    visibility_timeout = 2.0
    concurrency = 4
    retry_delay = 0.05

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.starts: list[tuple[str, float]] = []
        self.done: Counter[str] = Counter()
        self.attempts: dict[str, int] = {}


class Pausable(Recorder):
    async def handle(self, msg: sw.Message) -> None:
        self.starts.append((msg.key, time.monotonic()))
        self.attempts[msg.key] = max(msg.attempt, self.attempts.get(msg.key, 0))
        await asyncio.sleep(float(msg.payload.get("sleep", 0)))
        self.done[msg.key] += 1


class BatchPausable(Recorder):
    batch_max = 5
    batch_wait = 0.02

    async def handle_batch(self, msgs: list[sw.Message]) -> None:
        for msg in msgs:
            self.starts.append((msg.key, time.monotonic()))
        await asyncio.sleep(0.01)
        for msg in msgs:
            self.done[msg.key] += 1


FN_STARTS: list[tuple[str, float]] = []
FN_DONE: Counter[str] = Counter()


@sw.worker(STREAM, group=GROUP, read_block=0.05, concurrency=4)
async def pausable_fn(msg: sw.Message) -> None:
    FN_STARTS.append((msg.key, time.monotonic()))
    FN_DONE[msg.key] += 1


def _paused(w: sw.StreamWorker) -> bool:
    return w.health().paused is not None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _taken_over(w: sw.StreamWorker, n: int) -> Callable[[], bool]:
    """Whether ``w`` is paused and has reclaimed ``n`` deliveries."""
    return lambda: _paused(w) and w.counts["reclaimed"] >= n


def _idle(r: redis.Redis) -> bool:
    return stream_idle(r, STREAM, GROUP)


async def _send(p: sw.AsyncProducer, n: int, prefix: str, **payload: Any) -> list[str]:
    keys = [f"{prefix}-{i}" for i in range(n)]
    for key in keys:
        await p.send(STREAM, dict(payload), key=key)
    return keys


def _late(starts: list[tuple[str, float]], seen: float) -> list[str]:
    """Jobs started after the pause was seen (plus the grace)."""
    return [key for key, at in starts if at > seen + GRACE]


@pytest.mark.parametrize("dedup", [True, False], ids=["dedup", "no-dedup"])
async def test_pause_stops_new_starts_while_jobs_keep_arriving(
        redis_url: str, r: redis.Redis, dedup: bool) -> None:
    """Paused under a steady flow of jobs, the worker sees it within about a second and
    starts nothing after (but a start already on its way); resumed, every job sent runs
    exactly once."""
    w = Pausable.from_url(redis_url, dedup=dedup)
    sent: list[str] = []
    stop = asyncio.Event()
    async with sw.AsyncProducer.from_url(redis_url) as p:

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                key = f"flow-{i}"
                await p.send(STREAM, {"sleep": 0.005}, key=key)
                sent.append(key)
                i += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(w.serve())
        sender = asyncio.create_task(produce())
        try:
            await await_for(lambda: len(w.starts) >= 20, timeout=30, message="jobs running")
            asked = time.monotonic()
            state = await p.pause(STREAM, GROUP, reason="card processor down")
            assert state.reason == "card processor down"
            assert abs(state.since - time.time()) < 60
            await await_for(lambda: _paused(w), timeout=10, message="the pause seen")
            seen = time.monotonic()
            assert seen - asked < SEES_WITHIN
            at_seen = len(sent)
            # jobs keep arriving for a while (two polls of the pause at least)
            await await_for(lambda: len(sent) >= at_seen + 150, timeout=60,
                            message="jobs sent while paused")
            assert _late(w.starts, seen) == []
            assert max(at for _, at in w.starts) - asked < SEES_WITHIN + GRACE
            assert w.health().ready, "a paused worker stays ready"
            assert w.health().paused == await p.paused(STREAM, GROUP)
            assert await p.resume(STREAM, GROUP) is True
            assert await p.paused(STREAM, GROUP) is None
            assert await p.resume(STREAM, GROUP) is False
            stop.set()
            await sender
            await await_for(lambda: set(w.done) >= set(sent) and _idle(r), timeout=60,
                            message="every job done after the resume")
        finally:
            stop.set()
            w.stop()
            await task
    assert set(w.done) == set(sent)
    assert [k for k, n in w.done.items() if n != 1] == []
    assert not _paused(w)


async def test_held_deliveries_are_kept_through_a_pause_longer_than_the_visibility_timeout(
        redis_url: str, r: redis.Redis) -> None:
    """What a paused worker holds stays its own: a second worker of the group reclaims
    nothing during a pause of three visibility timeouts, no delivery count grows, and after
    the resume each job runs once, on its first attempt."""
    a = Pausable.from_url(redis_url, concurrency=1, visibility_timeout=1.0, batch_size=10)
    b = Pausable.from_url(redis_url, concurrency=1, visibility_timeout=1.0, batch_size=10)
    async with sw.AsyncProducer.from_url(redis_url) as p:
        keys = await _send(p, 12, "held", sleep=0.3)
        ta = asyncio.create_task(a.serve())
        tb: asyncio.Task[None] | None = None
        try:
            await await_for(lambda: len(a.starts) >= 1, timeout=20, message="a runs a job")
            await p.pause(STREAM, GROUP)
            await await_for(lambda: _paused(a), timeout=10, message="a sees the pause")
            seen = time.monotonic()
            # the job running when the pause landed finishes; the rest stay held by a
            await await_for(lambda: sum(a.done.values()) == len(a.starts) == a.counts["acked"],
                            timeout=10, message="the running job finished and acknowledged")
            held = r.xpending_range(STREAM, GROUP, min="-", max="+", count=100)
            assert len(held) >= 5, held
            owner = {_text(row["consumer"]) for row in held}
            assert owner == {a.consumer_name}
            tb = asyncio.create_task(b.serve())
            await await_for(lambda: _paused(b), timeout=10, message="b starts paused")
            await asyncio.sleep(3 * a.config.visibility_timeout)  # the window a reclaim needs
            rows = r.xpending_range(STREAM, GROUP, min="-", max="+", count=100)
            assert {row["message_id"] for row in rows} == {row["message_id"] for row in held}
            assert {_text(row["consumer"]) for row in rows} == {a.consumer_name}
            assert {row["times_delivered"] for row in rows} == {1}
            assert b.counts["reclaimed"] == 0 and b.starts == []
            assert _late(a.starts, seen) == []
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(a.done) | set(b.done) >= set(keys) and _idle(r),
                            timeout=60, message="every job done after the resume")
        finally:
            a.stop()
            b.stop()
            await ta
            if tb is not None:
                await tb
    done = a.done + b.done
    assert set(done) == set(keys) and set(done.values()) == {1}
    assert set(a.attempts.values()) | set(b.attempts.values()) == {1}
    assert a.counts["lock_lost"] == 0


async def test_two_workers_both_pause_and_resume(redis_url: str, r: redis.Redis) -> None:
    """Every worker of the group reads the pause: two of them start nothing while it lasts
    and share the work after it, each job once."""
    ws = [Pausable.from_url(redis_url) for _ in range(2)]
    tasks = [asyncio.create_task(w.serve()) for w in ws]
    try:
        await await_for(lambda: all(w.health().ready for w in ws), timeout=20)
        async with sw.AsyncProducer.from_url(redis_url) as p:
            await p.pause(STREAM, GROUP, reason="both")
            await await_for(lambda: all(_paused(w) for w in ws), timeout=10,
                            message="both workers see the pause")
            assert {w.health().paused.reason for w in ws  # type: ignore[union-attr]
                    } == {"both"}
            keys = await _send(p, 40, "two")
            await asyncio.sleep(2.0)  # a window for starts that must not happen
            assert [w.starts for w in ws] == [[], []]
            info = r.xinfo_groups(STREAM)[0]
            # at most a read already blocked in Redis when the pause was seen got some: held
            assert info["pending"] + info["lag"] == 40, info
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(ws[0].done) | set(ws[1].done) >= set(keys)
                            and _idle(r), timeout=60, message="all done after the resume")
    finally:
        for w in ws:
            w.stop()
        await asyncio.gather(*tasks)
    done = ws[0].done + ws[1].done
    assert set(done) == set(keys) and set(done.values()) == {1}


@pytest.mark.parametrize("kind", ["batch", "ordered", "function"])
async def test_batch_ordered_and_function_workers_honour_the_pause(
        redis_url: str, r: redis.Redis, kind: str) -> None:
    """A batch handler, an ordered worker and a function worker start nothing while their
    group is paused, and run everything once after."""
    FN_STARTS.clear()
    FN_DONE.clear()
    if kind == "batch":
        w: Any = BatchPausable.from_url(redis_url)
    elif kind == "ordered":
        w = Pausable.from_url(redis_url, ordered=True)
    else:
        w = pausable_fn.from_url(redis_url)
    starts = FN_STARTS if kind == "function" else w.starts
    done = FN_DONE if kind == "function" else w.done
    task = asyncio.create_task(w.serve())
    try:
        async with sw.AsyncProducer.from_url(redis_url) as p:
            first = await _send(p, 10, "before")
            await await_for(lambda: set(done) >= set(first), timeout=30)
            await p.pause(STREAM, GROUP)
            await await_for(lambda: _paused(w), timeout=10, message="the pause seen")
            seen = time.monotonic()
            keys = await _send(p, 30, "during")
            await asyncio.sleep(2.0)  # a window for starts that must not happen
            assert _late(starts, seen) == [] and not set(done) & set(keys)
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(done) >= set(keys) and _idle(r), timeout=60,
                            message="all done after the resume")
    finally:
        w.stop()
        await task
    assert set(done) == set(first + keys) and set(done.values()) == {1}


async def test_cancel_a_queued_job_while_paused(redis_url: str, r: redis.Redis) -> None:
    """A job a paused worker holds (queued, not started) can be cancelled: it never runs,
    its status says cancelled, and the others run once after the resume."""
    w = Pausable.from_url(redis_url, concurrency=1, batch_size=10)
    async with sw.AsyncProducer.from_url(redis_url) as p:
        keys = await _send(p, 8, "c", sleep=0.3)
        task = asyncio.create_task(w.serve())
        try:
            await await_for(lambda: len(w.starts) >= 1, timeout=20)
            await p.pause(STREAM, GROUP)
            await await_for(lambda: _paused(w), timeout=10)
            held = {row["message_id"] for row in
                    r.xpending_range(STREAM, GROUP, min="-", max="+", count=100)}
            assert len(held) >= 3
            assert await p.cancel(STREAM, keys[-1], group=GROUP, reason="no") == "queued"
            await await_for(lambda: w.counts["cancelled"] == 1, timeout=15,
                            message="the cancel acknowledged while paused")
            assert keys[-1] not in w.done
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(w.done) >= set(keys[:-1]) and _idle(r), timeout=60)
            st = await p.status(STREAM, keys[-1], group=GROUP)
        finally:
            w.stop()
            await task
    assert st.state == "cancelled"
    assert set(w.done) == set(keys[:-1]) and set(w.done.values()) == {1}


async def test_restarts_during_a_pause_let_go_at_once_and_use_no_attempt(
        redis_url: str, r: redis.Redis) -> None:
    """A worker stopped while paused does not sit out its drain: what it held is let go
    (still pending) with its delivery count taken back, so the next worker takes it over
    without counting a delivery; after two such restarts and the resume each job runs once,
    on its first attempt."""
    vt = 1.0
    workers = [Pausable.from_url(redis_url, concurrency=1, batch_size=10, drain_timeout=60.0,
                                 visibility_timeout=vt, max_deliveries=3) for _ in range(3)]
    a, b, c = workers
    async with sw.AsyncProducer.from_url(redis_url) as p:
        keys = await _send(p, 10, "stop", sleep=0.2)
        task = asyncio.create_task(a.serve())
        await await_for(lambda: len(a.starts) >= 1, timeout=20)
        await p.pause(STREAM, GROUP)
        await await_for(lambda: _paused(a), timeout=10)
        for w, nxt in ((a, b), (b, c)):
            began = time.monotonic()
            w.stop()
            await task
            assert time.monotonic() - began < 20, "the stop waited out the drain"
            rows = r.xpending_range(STREAM, GROUP, min="-", max="+", count=100)
            assert len(rows) >= 3 and {row["times_delivered"] for row in rows} == {0}
            task = asyncio.create_task(nxt.serve())
            # the next worker, paused too, takes them over once idle for the timeout
            await await_for(_taken_over(nxt, len(rows)), timeout=30,
                            message="the held jobs taken over")
        try:
            assert {row["times_delivered"] for row in
                    r.xpending_range(STREAM, GROUP, min="-", max="+", count=100)} == {1}
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(sum((w.done for w in workers), Counter())) >= set(keys)
                            and _idle(r), timeout=60, message="all done after the resume")
        finally:
            c.stop()
            await task
    done: Counter[str] = sum((w.done for w in workers), Counter())
    assert set(done) == set(keys) and set(done.values()) == {1}
    assert {n for w in workers for n in w.attempts.values()} == {1}
    assert r.xlen(StreamKeys.for_stream(STREAM).dead) == 0


async def test_a_worker_stopped_while_paused_hands_back_high_priority_jobs_too(
        redis_url: str, r: redis.Redis) -> None:
    """Deliveries read from a priority level's own stream are handed back like the others:
    still pending, their delivery count taken back to 0, run once after the resume."""
    high = sibling_streams(StreamKeys.for_stream(STREAM))[0]
    workers = [Pausable.from_url(redis_url, concurrency=1, batch_size=10, drain_timeout=60.0,
                                 visibility_timeout=1.0) for _ in range(2)]
    a, b = workers
    async with sw.AsyncProducer.from_url(redis_url) as p:
        keys = [f"urgent-{i}" for i in range(20)]
        await p.send_many(STREAM, [{"sleep": 0.3}] * len(keys), keys=keys, priority="high")
        task = asyncio.create_task(a.serve())
        await await_for(lambda: len(a.starts) >= 1, timeout=20)
        await p.pause(STREAM, GROUP)
        await await_for(lambda: _paused(a), timeout=10)
        a.stop()
        await task
        rows = r.xpending_range(high, GROUP, min="-", max="+", count=100)
        assert len(rows) >= 3 and {row["times_delivered"] for row in rows} == {0}, rows
        await p.resume(STREAM, GROUP)
        task = asyncio.create_task(b.serve())
        try:
            await await_for(lambda: set(a.done + b.done) >= set(keys) and _idle(r),
                            timeout=60, message="all done after the resume")
        finally:
            b.stop()
            await task
    assert set((a.done + b.done).values()) == {1}
    assert {n for w in workers for n in w.attempts.values()} == {1}


async def test_the_pause_outlives_a_redis_restart(make_server: Callable[..., Any]) -> None:
    """The pause is in Redis: after redis-server is killed and started again (AOF), the
    reconnected worker is still paused, starts nothing, and runs everything once after the
    resume."""
    server = make_server(appendfsync="always")
    r = redis.Redis.from_url(server.url)
    w = Pausable.from_url(server.url)
    task = asyncio.create_task(w.serve())
    try:
        await await_for(lambda: w.health().ready, timeout=20)
        async with sw.AsyncProducer.from_url(server.url) as p:
            await p.pause(STREAM, GROUP, reason="maintenance")
            await await_for(lambda: _paused(w), timeout=10)
        server.kill()
        await await_for(lambda: not w.health().redis_ok, timeout=20,
                        message="the worker notices the outage")
        server.start()
        await await_for(lambda: w.health().ready, timeout=60, message="reconnected")
        assert _paused(w)
        async with sw.AsyncProducer.from_url(server.url) as p:
            assert (await p.paused(STREAM, GROUP)) is not None
            keys = await _send(p, 20, "restart")
            seen = time.monotonic()
            await asyncio.sleep(2.0)  # a window for starts that must not happen
            assert _paused(w) and _late(w.starts, seen) == [] and not w.starts
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(w.done) >= set(keys)
                            and stream_idle(r, STREAM, GROUP), timeout=60)
    finally:
        w.stop()
        await task
        r.close()
    assert set(w.done) == set(keys) and set(w.done.values()) == {1}


def _probe(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_a_pause_survives_a_worker_restart_and_readyz_says_paused(
        redis_url: str, r: redis.Redis,
        spawn_worker: Callable[..., Any]) -> None:
    """Paused with the CLI, a worker process stays ready (/readyz 200, saying paused);
    stopped and started again (as two processes), the new ones are paused from their start
    and run nothing until `streamwork resume`; then every job runs once (ledger)."""
    from tests.workers.ledger import STREAM as LSTREAM
    from tests.workers.ledger import LedgerWorker

    group = LedgerWorker.group
    port = free_port()
    first = spawn_worker("tests.workers.ledger:LedgerWorker", redis_url,
                         "--health-port", str(port))
    with sw.Producer.from_url(redis_url) as p:
        before = [f"b-{i}" for i in range(10)]
        for key in before:
            p.send(LSTREAM, {}, key=key)
        wait = _waiter()
        wait(lambda: r.hlen("ledger") == 10, "the first jobs handled")
        out = _cli("pause", LSTREAM, "--group", group, "--reason", "deploy", "--url", redis_url)
        assert out.exit_code == 0, out.output
        assert f"{LSTREAM}/{group}: paused (deploy)" in out.output
        wait(lambda: _probe(port)[1].get("paused"), "readyz says paused")
        code, body = _probe(port)
        assert code == 200 and body["status"] == "ok"
        assert body["paused"] == [f"{LSTREAM}/{group}"]
        assert body["workers"][0]["paused"] is True
        assert body["workers"][0]["pause_reason"] == "deploy"
        first.terminate()
        assert first.wait(timeout=60) == 0

        # started again, as two processes under a supervisor: both paused from the start
        port = free_port()
        spawn_worker("tests.workers.ledger:LedgerWorker", redis_url, "--health-port", str(port),
                     "--processes", "2")
        wait(lambda: [w["paused"] for c in _probe(port)[1].get("processes", ())
                      for w in c.get("workers", ())] == [True, True],
             "both new processes say paused")
        code, body = _probe(port)
        assert code == 200 and body["paused"] == [f"{LSTREAM}/{group}"]
        during = [f"d-{i}" for i in range(20)]
        for key in during:
            p.send(LSTREAM, {}, key=key)
        time.sleep(2.0)  # a window for starts that must not happen
        assert r.hlen("ledger") == 10
        assert not any(r.exists(f"attempt-times:{k}") for k in during)
        shown = _cli("inspect", LSTREAM, "--url", redis_url)
        assert "paused: deploy" in shown.output, shown.output
        as_json = json.loads(_cli("inspect", LSTREAM, "--json", "--url", redis_url).output)
        assert as_json["groups"][0]["paused"]["reason"] == "deploy"
        out = _cli("resume", LSTREAM, "--group", group, "--url", redis_url)
        assert out.exit_code == 0 and f"{LSTREAM}/{group}: resumed" in out.output
        wait(lambda: r.hlen("ledger") == 30 and stream_idle(r, LSTREAM, group),
             "every job handled after the resume")
        wait(lambda: "paused" not in _probe(port)[1], "readyz says running")
        assert [w["paused"] for c in _probe(port)[1]["processes"] for w in c["workers"]
                ] == [False, False]
    counts = {_text(k): int(v) for k, v in r.hgetall("ledger").items()}
    assert set(counts) == set(before + during) and set(counts.values()) == {1}
    assert "running" in _cli("inspect", LSTREAM, "--url", redis_url).output


def _waiter() -> Callable[[Callable[[], Any], str], Any]:
    from streamwork.testing import wait_for

    return lambda predicate, what: wait_for(predicate, 60, interval=0.05, message=what)


def test_cli_refuses_unknown_streams_and_groups(redis_url: str, r: redis.Redis) -> None:
    """pause and resume exit 1 with a clear line for a stream or group that does not exist,
    and pause nothing."""
    out = _cli("pause", "nosuch", "--group", "g", "--url", redis_url)
    assert out.exit_code == 1 and "stream 'nosuch' does not exist" in out.output
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    out = _cli("pause", STREAM, "--group", "typo", "--url", redis_url)
    assert out.exit_code == 1
    assert f"has no consumer group 'typo'; its groups are '{GROUP}'" in out.output
    out = _cli("resume", STREAM, "--group", "typo", "--url", redis_url)
    assert out.exit_code == 1 and "no consumer group 'typo'" in out.output
    r.xgroup_destroy(STREAM, GROUP)
    out = _cli("pause", STREAM, "--group", GROUP, "--url", redis_url)
    assert out.exit_code == 1 and "has no consumer group yet" in out.output
    assert r.keys("*paused*") == []
    out = _cli("pause", STREAM, "--url", redis_url)
    assert out.exit_code == 2 and "--group" in out.output
    port = free_port()
    out = _cli("pause", STREAM, "--group", GROUP, "--url", f"redis://127.0.0.1:{port}/0")
    assert out.exit_code == 1 and "Error:" in out.output


def test_producer_checks_and_partitions(redis_url: str, r: redis.Redis) -> None:
    """The Python API: a typo'd group is refused (GroupNotFound) and pauses nothing; a
    group may be paused before any worker created it; a partitioned stream's group is
    paused in every partition; a reason that is not text is a ConfigError."""
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    with sw.Producer.from_url(redis_url) as p:
        with pytest.raises(sw.StreamworkError, match="no consumer group 'typo'"):
            p.pause(STREAM, "typo")
        assert r.keys("*paused*") == []
        with pytest.raises(sw.ConfigError, match="reason"):
            p.pause(STREAM, GROUP, reason=7)  # type: ignore[arg-type]
        assert p.pause("fresh", "g").reason == ""  # no stream yet: its workers may come
        assert p.paused("fresh", "g") is not None
        assert r.exists(PAUSED_KEY) == 0
    with sw.Producer.from_url(redis_url, partitions={"split": 3}) as p:
        p.pause("split", "g", reason="all of it")
        states = [p.paused(name, "g") for name in partition_names("split", 3)]
        assert [s.reason if s else None for s in states] == ["all of it"] * 3
        assert p.resume("split", "g") is True
        assert p.paused("split", "g") is None


async def test_a_partitioned_worker_pauses_on_every_partition(redis_url: str,
                                                              r: redis.Redis) -> None:
    """On a partitioned stream the pause is written to every partition and each partition's
    consumer honours it: nothing runs on any partition until the resume, then all once."""
    w = Pausable.from_url(redis_url, partitions=3)
    task = asyncio.create_task(w.serve())
    try:
        await await_for(lambda: w.health().ready and len(w.partitions_served) == 3,
                        timeout=30)
        async with sw.AsyncProducer.from_url(redis_url, partitions=3) as p:
            await p.pause(STREAM, GROUP, reason="split")
            consumers = w._partitioned.consumers.values()  # type: ignore[union-attr]
            await await_for(lambda: _paused(w) and all(c.feature(Pausing).state()
                                                       for c in consumers),
                            timeout=10, message="every partition's consumer paused")
            seen = time.monotonic()
            keys = await _send(p, 30, "part")
            assert [r.exists(StreamKeys.for_stream(name).group(GROUP).paused)
                    for name in partition_names(STREAM, 3)] == [1, 1, 1]
            await asyncio.sleep(2.0)  # a window for starts that must not happen
            assert _late(w.starts, seen) == [] and not set(w.done) & set(keys)
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(w.done) >= set(keys) and all(
                stream_idle(r, name, GROUP) for name in partition_names(STREAM, 3)),
                timeout=60, message="all done after the resume")
            assert not _paused(w)
    finally:
        w.stop()
        await task
    assert set(w.done) == set(keys) and set(w.done.values()) == {1}


@pytest.mark.parametrize("kind", [Pausable, BatchPausable], ids=["handle", "handle_batch"])
async def test_a_job_waiting_for_a_rate_token_does_not_start_once_paused(
        redis_url: str, r: redis.Redis, kind: type[Recorder]) -> None:
    """With a real group-wide rate limit (60/m: a token a second) runners wait for tokens;
    the pause lands meanwhile: no job starts after the worker saw it, though tokens came
    due in that window (the gate is looked at again after the wait); all run once resumed."""
    w = kind.from_url(redis_url, rate_limit="60/m", concurrency=4)
    async with sw.AsyncProducer.from_url(redis_url) as p:
        keys = await _send(p, 6, "rated")
        task = asyncio.create_task(w.serve())
        try:
            await await_for(lambda: len(w.starts) >= 1, timeout=20, message="a first start")
            await p.pause(STREAM, GROUP, reason="rate x pause")
            await await_for(lambda: _paused(w), timeout=SEES_WITHIN, message="pause seen")
            seen = time.monotonic()
            started = len(w.starts)
            await asyncio.sleep(3.5)  # 3 tokens come due: none may start a job now
            assert _late(w.starts, seen) == [], (w.starts, seen)
            assert len(w.starts) <= started + 1  # one whose start was on its way, at most
            await p.resume(STREAM, GROUP)
            await await_for(lambda: set(w.done) >= set(keys) and _idle(r), timeout=60,
                            message="every job done after the resume")
        finally:
            w.stop()
            await task
    assert [k for k, n in w.done.items() if n != 1] == []


@pytest.mark.parametrize("loss", ["restart", "flushall"])
async def test_a_pause_lost_with_redis_data_is_written_back(
        make_server: Any, loss: str, caplog: pytest.LogCaptureFixture) -> None:
    """Redis comes back empty (restarted without persistence, or FLUSHALL) while the group
    is paused: the worker that had seen the pause writes it back and says so; a job sent
    after it does not run until the group is resumed."""
    server = make_server()
    url = server.url
    r = redis.Redis.from_url(url)
    w = Pausable.from_url(url, visibility_timeout=1.5)
    task = asyncio.create_task(w.serve())
    try:
        async with sw.AsyncProducer.from_url(url) as p:
            await await_for(lambda: w.health().ready, timeout=20, message="worker ready")
            await p.pause(STREAM, GROUP, reason="maintenance")
            await await_for(lambda: _paused(w), timeout=SEES_WITHIN, message="pause seen")
            with caplog.at_level(logging.WARNING, logger="streamwork"):
                if loss == "restart":
                    server.restart()
                else:
                    r.flushall()
                await await_for(lambda: r.exists(PAUSED_KEY) == 1, timeout=20,
                                message="the pause written back")
                await await_for(lambda: any("pause was lost with Redis's data" in m
                                            for m in caplog.messages), timeout=5,
                                message="the WARNING that says so")
            assert r.hget(PAUSED_KEY, "reason") == b"maintenance"
            await await_for(lambda: w.health().ready, timeout=20, message="ready again")
            await p.send(STREAM, {}, key="after-the-loss")
            await asyncio.sleep(2.0)  # a window for a start that must not happen
            assert w.starts == [] and _paused(w)
            assert await p.resume(STREAM, GROUP) is True
            await await_for(lambda: w.done["after-the-loss"] == 1, timeout=20,
                            message="runs once resumed")
    finally:
        w.stop()
        await task
        r.close()
    assert w.counts["pause_restored"] == 1
