"""Jobs a worker holds keep their promise through odd server states: an entry deleted while
its handler runs, a duplicate waiting behind a long first copy, a blocking read as long as
the lease, batches larger than Lua's unpack limit, and staged writes refused while Redis is
out of memory."""

from __future__ import annotations

import asyncio

import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork.testing import Ledger, await_for, run_until_idle, stream_idle
from tests.workers.ledger import ClientWorker

STREAM = "held"
KEYS = StreamKeys.for_stream(STREAM)
LEDGER = KEYS.prefix + ":ledger"


class _Worker(ClientWorker):
    stream = STREAM
    group = "holders"
    visibility_timeout = 1.0
    read_block = 0.1
    retry_delay = 0.05
    retry_max_delay = 0.2
    reclaim_interval = 0.2
    dedup_window = 600.0


class SlowStaged(_Worker):
    """Sleeps ``sleep`` s (async), then stages its effect, or raises when ``fail`` is set."""

    async def handle(self, msg: sw.Message) -> None:
        p = msg.payload
        self.client().hincrby("runs", msg.key, 1)
        await asyncio.sleep(float(p.get("sleep", 0)))
        if p.get("fail"):
            raise RuntimeError("failing on purpose")
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])


class Noop(_Worker):
    """Does nothing: thousands finish in the same instant, so they are flushed together."""

    async def handle(self, msg: sw.Message) -> None:
        return None


class DirectLedger(_Worker):
    """Applies its effect directly in the handler (not staged): a second run shows."""

    async def handle(self, msg: sw.Message) -> None:
        await asyncio.sleep(float(msg.payload.get("sleep", 0)))
        self.client().hincrby(LEDGER, msg.key, 1)


async def _serve(worker: sw.StreamWorker) -> asyncio.Task[None]:
    task = asyncio.create_task(worker.serve())
    await await_for(lambda: worker.health().ready or task.done(), message="worker ready")
    return task


async def _stop(worker: sw.StreamWorker, task: asyncio.Task[None]) -> None:
    worker.stop()
    await task


def _idle(r: redis.Redis, group: str) -> bool:
    return stream_idle(r, STREAM, group)


async def test_entry_deleted_while_its_handler_runs_still_gets_its_outcome(
        r: redis.Redis, redis_url: str) -> None:
    """XDEL of a pending entry mid-handler (item 4): the success still counts (its staged
    write lands, once); the failure becomes a dead letter carrying the body the worker
    held, reason deleted_while_pending. Nothing is left pending or parked."""
    p = sw.Producer.from_url(redis_url)
    ok_id = p.send(STREAM, {"sleep": 1.6}, key="ok")
    bad_id = p.send(STREAM, {"sleep": 1.6, "fail": True}, key="bad")
    bad_body = r.xrange(STREAM, bad_id, bad_id)[0][1][b"d"]
    # a 3 s lease (heartbeat every 1 s, still inside the handlers' 1.6 s): with the class's
    # 1 s, a loaded machine could miss a heartbeat and the entries were reclaimed meanwhile
    worker = SlowStaged.from_url(redis_url, max_deliveries=3, visibility_timeout=3.0)
    task = await _serve(worker)
    try:
        await await_for(lambda: r.hlen("runs") == 2, message="both handlers running")
        assert r.xdel(STREAM, ok_id, bad_id) == 2
        await await_for(lambda: r.xlen(KEYS.dead) == 1 and r.hget(LEDGER, "ok") == b"1"
                        and worker.health().ready and not worker._consumer.holdings.inflight,  # type: ignore[union-attr]
                        timeout=20, message="both outcomes recorded")
    finally:
        await _stop(worker, task)
    (_, dead), = r.xrange(KEYS.dead)
    assert dead[b"reason"] == b"deleted_while_pending"
    assert dead[b"f.d"] == bad_body, "the dead letter carries the payload the worker held"
    assert dead[b"src_id"] == bad_id.encode()
    assert r.hgetall(LEDGER) == {b"ok": b"1"}
    assert r.hgetall("runs") == {b"ok": b"1", b"bad": b"1"}
    assert r.xpending(STREAM, "holders")["pending"] == 0
    assert r.zcard(KEYS.group(_Worker.group).retries) == 0, \
        "the adoption's safety net is removed with the outcome"
    assert worker.counts["acked"] == 1 and worker.counts["deleted_while_pending"] == 2


async def test_duplicate_waits_behind_a_long_first_copy_without_using_attempts(
        r: redis.Redis, redis_url: str) -> None:
    """A second copy of a job arriving while the first runs for several visibility
    timeouts waits (held, heartbeated) and is then acked as a duplicate (item 6); it is
    never dead-lettered as max_deliveries, and the job takes effect once."""
    p = sw.Producer.from_url(redis_url)
    p.send(STREAM, {"sleep": 3.5}, key="long")
    p.send(STREAM, {"sleep": 3.5}, key="long")
    worker = SlowStaged.from_url(redis_url, max_deliveries=2, concurrency=2)
    await run_until_idle(worker, r, timeout=30)
    assert r.xlen(KEYS.dead) == 0, r.xrange(KEYS.dead)
    assert r.hgetall(LEDGER) == {b"long": b"1"}
    assert r.hgetall("runs") == {b"long": b"1"}
    assert worker.counts["deduplicated"] == 1
    assert worker.counts["reclaimed"] == 0


async def test_lease_deadline_counts_from_arrival_not_from_a_blocking_read(
        r: redis.Redis, redis_url: str) -> None:
    """With read_block close to visibility_timeout, a job that arrives late in a blocking
    read is not marked lost at its first heartbeat and does not run twice (item 7)."""
    worker = DirectLedger.from_url(redis_url, read_block=0.95, visibility_timeout=1.0)
    task = await _serve(worker)
    keys = [f"late-{i}" for i in range(4)]
    try:
        with sw.Producer.from_url(redis_url) as p:
            for key in keys:  # each arrives ~0.8 s into the read that the previous one began
                await asyncio.sleep(0.8)
                p.send(STREAM, {"sleep": 0.7}, key=key)
        await await_for(lambda: _idle(r, "holders") and r.hlen(LEDGER) == len(keys),
                        timeout=20, message="every job handled")
        await asyncio.sleep(0)  # let the last completion's bookkeeping run
    finally:
        await _stop(worker, task)
    report = Ledger(r, LEDGER).report(keys)
    assert report.exactly_once, report
    assert worker.counts["lock_lost"] == 0
    assert worker.counts["acked"] == len(keys)


async def test_batches_larger_than_luas_unpack_limit(r: redis.Redis, redis_url: str) -> None:
    """batch_size 9000 (above the ~8000 values Lua's unpack takes): every job is read,
    leased and acknowledged (item 10)."""
    keys = [f"b{i}" for i in range(9000)]
    with sw.Producer.from_url(redis_url) as p:
        for i in range(0, len(keys), 1000):
            p.send_many(STREAM, [{}] * 1000, keys=keys[i:i + 1000])
    for dedup in (False, True):  # one flush of ~9000 acks; then leases and done-markers
        r.xgroup_create(STREAM, f"big-{dedup}", id="0")
        # a lease long enough for 9000 handlers, their starts and their heartbeats on a
        # busy machine: with 1 s, leases ran out before the heartbeat came round, and each
        # lost job was then reclaimed one at a time
        worker = Noop.from_url(redis_url, group=f"big-{dedup}", dedup=dedup,
                               batch_size=9000, concurrency=9000, visibility_timeout=30.0)
        await run_until_idle(worker, r, timeout=120)
        assert worker.counts["acked"] == len(keys)
        assert r.xpending(STREAM, f"big-{dedup}")["pending"] == 0


class Gated(_Worker):
    """Stages its effect, then waits for the test's gate (an in-process event)."""

    dedup = False
    entered: asyncio.Event
    gate: asyncio.Event

    async def handle(self, msg: sw.Message) -> None:
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])
        self.entered.set()
        await self.gate.wait()


async def test_staged_writes_and_ack_are_all_or_nothing_under_oom(
        r: redis.Redis, redis_url: str) -> None:
    """A job finishing while Redis is out of memory (dedup off) is not acknowledged
    without its staged write: the outcome waits and lands once memory is back (item 13)."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="oom")
    worker = Gated.from_url(redis_url)
    worker.entered, worker.gate = asyncio.Event(), asyncio.Event()
    task = await _serve(worker)
    try:
        await asyncio.wait_for(worker.entered.wait(), 20)
        r.config_set("maxmemory", 1)
        worker.gate.set()
        await await_for(lambda: worker._consumer.sup.failures > 0,  # type: ignore[union-attr]
                        timeout=20, message="the completion refused while out of memory")
        assert r.hget(LEDGER, "oom") is None
        assert r.xpending(STREAM, "holders")["pending"] == 1, "not acked without its write"
        assert worker.counts["acked"] == 0
        r.config_set("maxmemory", 0)
        await await_for(lambda: r.hget(LEDGER, "oom") == b"1" and _idle(r, "holders"),
                        timeout=20, message="the outcome written once memory is back")
        assert worker.health().alive
    finally:
        r.config_set("maxmemory", 0)
        await _stop(worker, task)
    assert r.hgetall(LEDGER) == {b"oom": b"1"}
    assert worker.counts["acked"] == 1
