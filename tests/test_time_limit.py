"""The per-job time limit (``timeout``, kept by a watchdog) and shutdown with a stuck
sync handler: a handler past its limit fails with reason ``timeout`` and follows
backoff -> dead letter while other jobs flow; a job finishing in time is unaffected; a
stuck plain ``def`` handler never keeps a stopped worker's process alive."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork.testing import Ledger, run_until_idle, wait_for
from tests.workers.ledger import ClientWorker

STREAM = "limits"
KEYS = StreamKeys.for_stream(STREAM)
LEDGER = KEYS.prefix + ":ledger"
ROOT = Path(__file__).resolve().parent.parent


class _Limited(ClientWorker):
    stream = STREAM
    group = "timers"
    timeout = 0.2
    max_deliveries = 2
    visibility_timeout = 2.0
    read_block = 0.1
    retry_delay = 0.05
    retry_max_delay = 0.1
    concurrency = 4


class AsyncSleeper(_Limited):
    """Sleeps ``sleep`` s (3600: hung), then stages its effect."""

    async def handle(self, msg: sw.Message) -> None:
        self.client().hincrby("runs", msg.key, 1)
        await asyncio.sleep(float(msg.payload.get("sleep", 0)))
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])


class SyncSleeper(_Limited):
    """The same as a plain def; a hung one naps until told its job is gone (msg.lock_lost),
    then still tries to stage its (late) effect, which must be dropped."""

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        self.client().hincrby("runs", msg.key, 1)
        end = time.monotonic() + float(msg.payload.get("sleep", 0))
        while time.monotonic() < end and not msg.lock_lost:
            time.sleep(0.01)
        if msg.lock_lost:
            self.client().hincrby("told", msg.key, 1)
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])


def _dead(r: redis.Redis) -> list[dict[bytes, bytes]]:
    return [values for _, values in r.xrange(KEYS.dead)]


@pytest.mark.parametrize("worker_cls", [AsyncSleeper, SyncSleeper])
async def test_hung_handler_is_timed_out_retried_then_dead_lettered(
        r: redis.Redis, redis_url: str, worker_cls: type[_Limited]) -> None:
    """A handler sleeping 3600 s with timeout=0.2 ends dead-lettered after max_deliveries
    with reason 'timeout', while 30 other jobs flow; each good job takes effect once."""
    good = [f"g{i}" for i in range(30)]
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 3600}, key="hung")
        p.send_many(STREAM, [{"sleep": 0.01}] * len(good), keys=good)
    worker = worker_cls.from_url(redis_url)
    started = time.monotonic()
    await run_until_idle(worker, r, timeout=30)
    assert time.monotonic() - started < 15
    assert Ledger(r, LEDGER).report(good).exactly_once
    assert r.hget(LEDGER, "hung") is None, "a timed-out job's late outcome is dropped"
    (dead,) = _dead(r)
    assert dead[b"reason"] == b"timeout"
    assert dead[b"error_type"] == b"HandlerTimeout"
    assert dead[b"attempts"] == b"2"
    assert r.hget("runs", "hung") == b"2"
    assert worker.counts["timed_out"] == 2
    assert worker.counts["retried"] == 1 and worker.counts["dead_lettered"] == 1
    if worker_cls is SyncSleeper:
        wait_for(lambda: r.hget("told", "hung") == b"2", message="the thread told to stop")


async def test_job_finishing_in_time_is_unaffected(r: redis.Redis, redis_url: str) -> None:
    """A job that takes 0.1 s under a 1 s limit succeeds on its first attempt."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 0.1}, key="quick")
    worker = AsyncSleeper.from_url(redis_url, timeout=1.0)
    await run_until_idle(worker, r, timeout=30)
    assert r.hgetall(LEDGER) == {b"quick": b"1"}
    assert worker.counts["timed_out"] == 0 and r.xlen(KEYS.dead) == 0


async def test_send_timeout_overrides_the_workers(r: redis.Redis, redis_url: str) -> None:
    """send(timeout=0.2) limits that job even on a worker without a limit; the others keep
    the worker's (none)."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 3600}, key="short-leash", timeout=0.2)
        p.send(STREAM, {"sleep": 0.5}, key="no-leash")
    worker = AsyncSleeper.from_url(redis_url, timeout=None, max_deliveries=1)
    await run_until_idle(worker, r, timeout=30)
    assert [d[b"reason"] for d in _dead(r)] == [b"timeout"]
    assert r.hgetall(LEDGER) == {b"no-leash": b"1"}


def test_send_rejects_a_bad_timeout(redis_url: str, r: redis.Redis) -> None:
    """A bad per-job timeout raises ConfigError and enqueues nothing."""
    with sw.Producer.from_url(redis_url) as p:
        for bad in (0, -1, float("nan"), "5s"):
            with pytest.raises(sw.ConfigError, match="timeout"):
                p.send(STREAM, {}, timeout=bad)  # type: ignore[arg-type]
    assert not r.exists(STREAM)


WORKER_MODULE = '''
import time
import redis
import streamwork as sw

class Stuck(sw.StreamWorker):
    stream = "limits"
    group = "timers"
    read_block = 0.1

    def handle(self, msg):
        redis.Redis.from_url(self.url).set("entered", 1)
        time.sleep(60)
'''


def test_stuck_sync_handler_does_not_keep_a_stopped_process_alive(
        r: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    """SIGTERM to `streamwork run` whose plain-def handler is stuck (no time limit):
    the process exits within drain_timeout + a little, not when the handler ends."""
    (tmp_path / "stuck_worker.py").write_text(WORKER_MODULE)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="stuck")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamwork", "run", "stuck_worker:Stuck", "--url", redis_url,
         "--drain-timeout", "1", "--timeout", "none", "--log-level", "WARNING"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: r.exists("entered"), timeout=30, message="the handler stuck")
        os.kill(proc.pid, signal.SIGTERM)
        started = time.monotonic()
        code = proc.wait(timeout=20)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert took < 6, f"exited {took:.1f}s after SIGTERM with drain_timeout=1"
    assert code == 0
    assert r.xpending(STREAM, "timers")["pending"] == 1, "the stuck job stays pending"
