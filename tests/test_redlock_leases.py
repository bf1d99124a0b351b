"""Job leases taken from a Redlock over independent masters (worker option lock_urls)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys, redlock_resource
from streamwork._worker.config import WorkerConfig
from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.redlock_lease import RedlockLease
from streamwork.testing import Ledger, await_for, run_until_idle, wait_for
from tests.workers.dedup import StagedLedgerWorker

STREAM = "jobs"


@pytest.fixture(name="masters")
def _masters(make_server: Any) -> list[Any]:
    return [make_server() for _ in range(3)]


def test_lock_urls_are_checked() -> None:
    """lock_urls must be Redis URLs and needs dedup on."""
    with pytest.raises(sw.ConfigError, match="lock_urls"):
        WorkerConfig(stream="s", group="g", lock_urls=("http://x",))
    with pytest.raises(sw.ConfigError, match="dedup"):
        WorkerConfig(stream="s", group="g", dedup=False, lock_urls=("redis://127.0.0.1:1",))


async def test_redlock_leases_apply_each_key_once(
    redis_url: str, r: redis.Redis, masters: list[Any]
) -> None:
    """Jobs sent 3x, two workers leasing from 3 Redlock masters: each key applied once,
    tokens come from the Redlock (per job key, not the stream's counter), no lease left."""
    keys = [f"k{i}" for i in range(200)]
    producer = sw.Producer.from_url(redis_url)
    for _ in range(3):
        producer.send_many(STREAM, [{}] * len(keys), keys=keys)
    urls = [m.url for m in masters]
    # no lease may expire, even on a machine so busy that read-ahead jobs wait seconds for
    # a slot (5 s was seen running out at load 11)
    opts: dict[str, Any] = {"lock_urls": urls, "local_cache_size": 0,
                            "visibility_timeout": 30.0}
    w1 = StagedLedgerWorker.from_url(redis_url, **opts)
    w2 = StagedLedgerWorker.from_url(redis_url, **opts)
    other = asyncio.create_task(w2.serve())
    await run_until_idle(w1, r, timeout=60)
    w2.stop()
    await other
    report = Ledger(r).report(keys)
    assert report.exactly_once, (report.lost[:3], list(report.twice.items())[:3])
    assert w1.counts["deduplicated"] + w2.counts["deduplicated"] == 400, (w1.counts, w2.counts)
    assert not r.exists(StreamKeys.for_stream(STREAM).fence)
    assert w1.counts["lock_lost"] + w2.counts["lock_lost"] == 0
    granted = [int(t) for t in r.lrange("granted", 0, -1)]
    assert len(granted) == 200 and min(granted) >= 1, "a handler ran twice for one key"
    for m in masters:
        client = redis.Redis.from_url(m.url)
        assert not [k for k in client.scan_iter("redlock:*") if not k.endswith(b":fence")]
        client.close()
    producer.close()


async def test_job_waits_while_its_redlock_lease_is_held_elsewhere(
    redis_url: str, r: redis.Redis, masters: list[Any]
) -> None:
    """A job whose resource is locked by another Redlock holder does not run until released."""
    urls = [m.url for m in masters]
    outside = sw.AsyncRedlock(urls, ttl=30.0)
    held = await outside.acquire(redlock_resource(STREAM, "invoice-7"))
    sw.Producer.from_url(redis_url).send(STREAM, {}, key="invoice-7")
    worker = StagedLedgerWorker.from_url(redis_url, lock_urls=urls, visibility_timeout=5.0)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.counts["lock_contended"] >= 1,
                        message="the worker to find the lease held elsewhere")
        assert Ledger(r).counts() == {}
        await held.release()
        await await_for(lambda: worker.counts["acked"] >= 1,
                        message="the job to run once the lease is released")
        assert Ledger(r).counts() == {"invoice-7": 1}
        token = int(r.lrange("granted", 0, -1)[-1])
        assert token > held.fencing_token
    finally:
        worker.stop()
        await task
        await outside.aclose()


async def test_minority_of_lock_masters_down_still_works_majority_down_waits(
    redis_url: str, r: redis.Redis, masters: list[Any]
) -> None:
    """One of three lock masters down: jobs run. Two down: jobs stay pending (handed back
    to the group: the worker cannot lock them), none lost, the worker is not ready, and
    they run once the masters are back."""
    urls = [m.url for m in masters]
    producer = sw.Producer.from_url(redis_url)
    masters[0].kill()
    producer.send_many(STREAM, [{}] * 20, keys=[f"a{i}" for i in range(20)])
    await run_until_idle(StagedLedgerWorker.from_url(redis_url, lock_urls=urls), r, timeout=60)
    assert len(Ledger(r).counts()) == 20
    masters[1].kill()
    producer.send_many(STREAM, [{}] * 10, keys=[f"b{i}" for i in range(10)])
    worker = StagedLedgerWorker.from_url(redis_url, lock_urls=urls)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.counts["lock_unreachable"] >= 10,
                        message="all 10 jobs handed back for want of a lease quorum")
        assert len(Ledger(r).counts()) == 20, "no job may run without a lease quorum"
        assert not worker.health().ready and not worker.health().locks_ok
        masters[0].start()
        masters[1].start()
        await await_for(lambda: len(Ledger(r).counts()) == 30, timeout=60,
                        message="the waiting jobs to run once the masters are back")
        assert Ledger(r).report([f"b{i}" for i in range(10)]).exactly_once
    finally:
        worker.stop()
        await task
    producer.close()


async def test_any_job_key_and_tagged_stream_work_with_redlock_leases(
    redis_url: str, r: redis.Redis, masters: list[Any]
) -> None:
    """Job keys with spaces, braces or 300 bytes, on a stream named like '{orders}:eu',
    all run once with Redlock leases (the lock's resource name is a digest, so any key fits)."""
    stream = "{orders}:eu"
    keys = ["a b", "{x}", "k" * 300, "tab\there", "ünï"]
    sw.Producer.from_url(redis_url).send_many(stream, [{}] * len(keys), keys=keys)
    worker = StagedLedgerWorker.from_url(redis_url, stream=stream,
                                         lock_urls=[m.url for m in masters])
    await run_until_idle(worker, r, timeout=60)
    assert Ledger(r).report(keys).exactly_once
    assert not worker.health().alive and not worker.health().dead_tasks  # stopped cleanly
    assert worker.counts["acked"] == len(keys)
    assert len({redlock_resource(stream, k) for k in keys}) == len(keys)


async def test_jobs_wait_for_a_lock_quorum_instead_of_dying(
    redis_url: str, r: redis.Redis, masters: list[Any]
) -> None:
    """While two of three Redlock masters are down, jobs wait pending in the group, handed
    back by the worker that cannot lock them (no attempt used up: their delivery counts go
    back to 0), for several visibility timeouts; once the quorum is back they run once,
    and none is dead-lettered as max_deliveries."""
    for m in masters[1:]:
        m.kill()
    keys = [f"q{i}" for i in range(20)]
    sw.Producer.from_url(redis_url).send_many(STREAM, [{}] * len(keys), keys=keys)
    # a 2 s visibility timeout: with 1 s a busy machine let held leases run out between
    # heartbeats (each Redlock call waits out the down masters' timeouts)
    worker = StagedLedgerWorker.from_url(redis_url, lock_urls=[m.url for m in masters],
                                         max_deliveries=2, visibility_timeout=2.0)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.counts["lock_unreachable"] >= len(keys), timeout=20,
                        message="every job handed back for want of the lock quorum")
        await asyncio.sleep(6.5)  # the outage lasts over three visibility timeouts
        assert r.hlen("ledger") == 0
        assert r.xlen(StreamKeys.for_stream(STREAM).dead) == 0
        pending = r.xpending_range(STREAM, "billing", min="-", max="+", count=100)
        assert len(pending) == len(keys)
        assert {int(p["times_delivered"]) for p in pending} == {0}, pending[:3]
        for m in masters[1:]:
            m.start()
        await await_for(lambda: r.hlen("ledger") == len(keys), timeout=30,
                        message="every job run once the quorum is back")
    finally:
        worker.stop()
        await task
    assert Ledger(r).report(keys).exactly_once
    assert r.xlen(StreamKeys.for_stream(STREAM).dead) == 0
    assert worker.counts["reclaimed"] == len(keys)  # taken back once the quorum was back


async def test_duplicates_acked_by_a_slow_claim_are_not_counted_lost(
    redis_url: str, r: redis.Redis, masters: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Copies of done jobs read with fresh ones, one master paused (it answers nothing, so
    each Redlock call waits out its timeout): the claim acknowledges the copies at once,
    then takes the fresh ones' leases slowly, over a heartbeat. That heartbeat must leave
    the copies to their claim (deduplicated), not report their never-held lease lost; and
    each lease keeps its own validity, not one shortened by the whole batch's wait."""
    done = [f"d{i}" for i in range(40)]
    fresh = [f"f{i}" for i in range(48)]
    urls = [m.url for m in masters]
    # every time here scales with the visibility timeout (per-master timeout a tenth of it,
    # heartbeat a third): 9 s leaves the leases 3.6 s after the slow claim, 4.5 s left 1.8 s,
    # which a very busy machine (load 14) used up before the handlers started
    opts: dict[str, Any] = {"lock_urls": urls, "visibility_timeout": 9.0, "batch_size": 200}
    producer = sw.Producer.from_url(redis_url)
    producer.send_many(STREAM, [{}] * len(done), keys=done)
    await run_until_idle(StagedLedgerWorker.from_url(redis_url, **opts), r, timeout=60)
    producer.send_many(STREAM, [{}] * (len(done) + len(fresh)), keys=done + fresh)
    producer.close()
    # a lease now takes two 0.9 s timeouts (acquire, fencing token), 16 at a time: the
    # 48 fresh ones about 5.4 s, over the 3 s heartbeat interval, and the first of them
    # taken lives on for about 3.6 s after the last one is (9 s from its own request)
    worker = StagedLedgerWorker.from_url(redis_url, **opts)
    caplog.set_level(logging.ERROR, logger="streamwork.worker")
    os.kill(masters[2].pid, signal.SIGSTOP)
    try:
        await run_until_idle(worker, r, timeout=60)
    finally:
        os.kill(masters[2].pid, signal.SIGCONT)
    assert Ledger(r).report(done + fresh).exactly_once
    assert worker.counts["deduplicated"] == len(done), worker.counts
    lost = [rec.getMessage() for rec in caplog.records if "lease lost" in rec.getMessage()]
    assert not lost, lost
    assert worker.counts["lock_lost"] == worker.counts["reclaimed"] == 0, worker.counts


async def test_closing_redlock_leases_waits_for_the_releases_under_way(
    masters: list[Any]
) -> None:
    """A worker stopping while its outcome flusher releases Redlock leases: the flusher is
    cancelled, the release (shielded) goes on, then the leases' clients are closed. The
    close waits for that release, so no connection is opened after it (left open, such
    connections were garbage-collected at the end of a test: unraisable warnings)."""
    cfg = WorkerConfig(stream=STREAM, group="g", lock_urls=tuple(m.url for m in masters))
    no_scripts: Any = None  # release and close use only the Redlock masters
    lease = RedlockLease(no_scripts, StreamKeys.for_stream(STREAM).group("g"), cfg, "c", "o")
    ds = []
    for i in range(40):  # more than run at once: most releases wait for a slot
        msg = sw.Message(f"{i}-1", STREAM, f"k{i}", {}, 1, 0.0, {})
        d = Delivery(f"{i}-1".encode(), 0, msg, b"", None, f"{i}-1".encode())
        d.grant = await lease.redlock.acquire(redlock_resource(STREAM, msg.key))
        ds.append(d)
    flushing = asyncio.create_task(lease.release(ds))
    await asyncio.sleep(0)  # the release has started
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    await lease.close()
    clients = [redis.Redis.from_url(m.url) for m in masters]
    try:
        for c in clients:
            assert not [k for k in c.scan_iter("redlock:*") if not k.endswith(b":fence")]
            # only this client is left connected
            wait_for(lambda c=c: c.info("clients")["connected_clients"] == 1, timeout=10,
                     message="every connection of the closed leases to be closed")
    finally:
        for c in clients:
            c.close()
