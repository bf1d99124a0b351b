"""Poison jobs: jobs that always raise or always kill their
process end in ``{S}:dead`` after exactly ``max_deliveries`` attempts, while other jobs
keep flowing; ``Retry`` and ``DeadLetter`` raised by handlers behave as documented."""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable
from typing import Any

import redis

from streamwork import Producer
from streamwork._wire.keys import StreamKeys
from streamwork.testing import Ledger, run_until_idle, wait_for
from tests.workers.recording import RecordingWorker, calls

STREAM, GROUP = "jobs", "testers"
KEYS = StreamKeys.for_stream(STREAM)


def _dead(r: redis.Redis) -> list[dict[str, bytes]]:
    return [{k.decode(): v for k, v in values.items()} for _, values in r.xrange(KEYS.dead)]


async def test_always_failing_job_is_dead_lettered_after_max_deliveries(
    r: redis.Redis, redis_url: str
) -> None:
    """An always-raising job runs max_deliveries times, then is dead with its error; others flow."""
    with Producer.from_url(redis_url) as p:
        poison_id = p.send(STREAM, {"always_fail": True}, key="poison")
        others = [f"ok-{i}" for i in range(200)]
        p.send_many(STREAM, [{"n": i} for i in range(200)], keys=others)
    body = r.xrange(STREAM, poison_id, poison_id)[0][1][b"d"]
    worker = RecordingWorker.from_url(redis_url, max_deliveries=3, retry_delay=0.05,
                                      retry_max_delay=0.2)
    await run_until_idle(worker, r, timeout=60)

    assert [a for a, _ in calls(r, "poison")] == [1, 2, 3]
    report = Ledger(r).report(others)
    assert report.exactly_once, report
    assert "poison" not in Ledger(r).counts()
    dead = _dead(r)
    assert len(dead) == 1
    d = dead[0]
    assert d["reason"] == b"max_deliveries"
    assert d["error_type"] == b"RuntimeError"
    assert b"always fails (attempt 3)" in d["detail"]
    assert b"Traceback" in d["detail"]
    assert d["attempts"] == b"3"
    assert d["src_stream"] == STREAM.encode()
    assert d["f.d"] == body, "the dead letter must keep the original body byte for byte"
    assert worker.counts["retried"] == 2
    assert worker.counts["dead_lettered"] == 1
    assert r.xpending(STREAM, GROUP)["pending"] == 0


def test_job_that_kills_its_process_is_dead_lettered_after_max_deliveries(
    r: redis.Redis, redis_url: str, spawn_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """A job that os._exit()s every time is dead-lettered after max_deliveries deaths."""
    max_deliveries = 3
    args = ("--max-deliveries", str(max_deliveries), "--visibility-timeout", "1",
            "--reclaim-interval", "0.2", "--read-block", "0.1", "--concurrency", "1")
    target = "tests.workers.recording:RecordingWorker"
    with Producer.from_url(redis_url) as p:
        p.send(STREAM, {"exit": True}, key="suicide")
    proc = spawn_worker(target, redis_url, *args)
    deaths = 0
    while True:  # a tiny supervisor: restart the worker each time it dies
        wait_for(lambda p=proc: p.poll() is not None or r.xlen(KEYS.dead) > 0, timeout=60,
                 message="the worker to die or the job to be dead-lettered")
        if proc.poll() is None:
            break
        assert proc.returncode == 1
        deaths += 1
        assert deaths <= max_deliveries, "the poison job keeps killing workers"
        proc = spawn_worker(target, redis_url, *args)

    assert deaths == max_deliveries
    assert [a for a, _ in calls(r, "suicide")] == list(range(1, max_deliveries + 1))
    dead = _dead(r)
    assert len(dead) == 1
    assert dead[0]["reason"] == b"max_deliveries"
    assert dead[0]["error_type"] == b"DeliveryLimit"
    assert dead[0]["attempts"] == str(max_deliveries).encode()
    wait_for(lambda: r.xpending(STREAM, GROUP)["pending"] == 0, timeout=30,
             message="the PEL to be empty")
    # the surviving worker still serves
    with Producer.from_url(redis_url) as p:
        p.send(STREAM, {"n": 1}, key="after")
    wait_for(lambda: r.hget("ledger", "after") == b"1", timeout=30,
             message="the next job to be handled")
    assert proc.poll() is None


async def test_handler_retry_and_dead_letter_exceptions(r: redis.Redis, redis_url: str) -> None:
    """Retry(delay) re-runs after >= delay; DeadLetter(reason) dead-letters at once, with reason."""
    with Producer.from_url(redis_url) as p:
        p.send(STREAM, {"retry_until": 3, "retry_delay": 0.3}, key="retry-explicit")
        p.send(STREAM, {"retry_until": 2}, key="retry-backoff")
        p.send(STREAM, {"dead": True}, key="doomed")
    worker = RecordingWorker.from_url(redis_url, max_deliveries=5, retry_delay=0.05,
                                      retry_max_delay=0.5)  # Retry(delay=) is capped by it
    await run_until_idle(worker, r, timeout=60)

    explicit = calls(r, "retry-explicit")
    assert [a for a, _ in explicit] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(explicit)]
    assert all(g >= 0.3 - 0.02 for g in gaps), gaps
    assert [a for a, _ in calls(r, "retry-backoff")] == [1, 2]
    counts = Ledger(r).counts()
    assert counts.get("retry-explicit") == 1
    assert counts.get("retry-backoff") == 1
    assert "doomed" not in counts
    assert [a for a, _ in calls(r, "doomed")] == [1]
    dead: list[dict[str, Any]] = _dead(r)
    assert len(dead) == 1
    assert dead[0]["reason"] == b"dead_letter: asked to"
    assert dead[0]["error_type"] == b"DeadLetter"
    assert dead[0]["attempts"] == b"1"
    assert worker.counts["retried"] == 3
    assert worker.counts["dead_lettered"] == 1


def test_process_killing_poison_costs_only_itself(
    r: redis.Redis, redis_url: str, spawn_worker: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """concurrency=1, max_deliveries=3: a job that kills its process, with 20 good jobs
    sent behind it, and a supervisor that restarts the worker each time it dies. Only the
    killer is dead-lettered; the 20 others run once: deliveries read but
    never started do not use up attempts, and reclaimed suspects run alone."""
    args = ("--max-deliveries", "3", "--visibility-timeout", "1", "--reclaim-interval", "0.2",
            "--read-block", "0.1", "--concurrency", "1")
    target = "tests.workers.recording:RecordingWorker"
    good = [f"good-{i}" for i in range(20)]
    with Producer.from_url(redis_url) as p:
        p.send(STREAM, {"exit": True}, key="killer")
        p.send_many(STREAM, [{}] * len(good), keys=good)
    proc = spawn_worker(target, redis_url, *args)
    deaths = 0
    while True:  # a tiny supervisor: restart the worker each time it dies
        wait_for(lambda p=proc: p.poll() is not None or (
            r.xlen(KEYS.dead) > 0 and r.hlen("ledger") == len(good)), timeout=90,
            message="the worker to die, or the killer dead and every good job done")
        if proc.poll() is None:
            break
        deaths += 1
        assert deaths <= 3, "the poison job keeps killing workers"
        proc = spawn_worker(target, redis_url, *args)

    report = Ledger(r).report(good)
    assert report.exactly_once, report
    dead = _dead(r)
    assert [d["reason"] for d in dead] == [b"max_deliveries"], dead
    assert b"killer" in dead[0]["f.d"]
    assert [a for a, _ in calls(r, "killer")] == [1, 2, 3]
    assert all(len(calls(r, k)) == 1 for k in good), "a good job ran more than once"
    wait_for(lambda: r.xpending(STREAM, GROUP)["pending"] == 0, timeout=30,
             message="nothing pending")
    assert proc.poll() is None, "the last worker serves on"
