"""Fault: the redis-server under running workers is SIGKILLed and restarted, twice.

A broker crash in small: appendfsync always, a producer sending throughout,
three `streamwork run` processes (LedgerWorker, dedup off: plain at-least-once). Nothing
acknowledged to the producer is lost, the PEL ends empty, the same worker processes are
still alive and reconnected, and duplicates stay within what was in flight at the kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.consumer import max_held
from streamwork.testing import Ledger, stream_idle, wait_for
from tests.helpers.looks import safe
from tests.workers.ledger import STREAM, LedgerWorker

WORKERS = 3
JOBS = 2400
KILLS = 2
GROUP = LedgerWorker.group
# deliveries one process may hold
CAPACITY = max_held(LedgerWorker.concurrency, LedgerWorker.batch_size)



def _handled(r: redis.Redis) -> int:
    return int(safe(lambda: r.hlen("ledger")) or 0)


def _blocked_readers(r: redis.Redis) -> int:
    return sum(1 for c in r.client_list() if c.get("cmd") == "xreadgroup" and "b" in c["flags"])


def test_workers_and_producer_survive_two_redis_crashes(
        make_server: Callable[..., Any],
        spawn_worker: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """Redis SIGKILLed and restarted twice mid-run: every sent job is handled at least once,
    duplicates are bounded by the jobs in flight, PEL empty, the same workers still run."""
    server = make_server(appendfsync="always")
    r = redis.Redis.from_url(server.url, socket_timeout=5)
    logs = [(tmp_path / f"worker-{i}.log").open("wb") for i in range(WORKERS)]
    procs = [spawn_worker("tests.workers.ledger:LedgerWorker", server.url, stdout=log)
             for log in logs]
    pids = {p.pid for p in procs}
    wait_for(lambda: _blocked_readers(r) >= WORKERS, 60, interval=0.1,
             message="worker processes reading")

    sent: list[str] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with sw.Producer.from_url(server.url, retry_timeout=60) as p:
                for i in range(JOBS):
                    key = f"job-{i}"
                    p.send(STREAM, {"i": i}, key=key)
                    sent.append(key)  # acknowledged by Redis: must not be lost
                    if i % 20 == 0:
                        time.sleep(0.02)  # pace: the run spans both crashes
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    pending_at_kill = []
    for kill in range(KILLS):
        target = (kill + 1) * JOBS // (KILLS + 2)
        wait_for(lambda t=target: _handled(r) >= t, 60, interval=0.05,
                 message=f"{target} jobs handled before crash {kill + 1}")
        pending_at_kill.append(int(r.xpending(STREAM, GROUP)["pending"]))
        server.kill()
        time.sleep(0.3 + 0.4 * kill)  # outage length (not an assertion)
        server.start()
        assert all(p.poll() is None for p in procs), "a worker exited because Redis crashed"

    producer.join(120)
    assert not producer.is_alive(), "producer stuck"
    assert not errors, f"producer failed: {errors[0]!r}"
    assert len(sent) == JOBS
    wait_for(lambda: safe(lambda: _handled(r) >= JOBS and stream_idle(r, STREAM, GROUP)), 90,
             interval=0.1, message="every job handled and acknowledged after the crashes")

    report = Ledger(r).report(sent)
    assert not report.lost, f"{len(report.lost)} acknowledged jobs lost, e.g. {report.lost[:5]}"
    assert int(r.xpending(STREAM, GROUP)["pending"]) == 0
    extra = sum(n - 1 for n in report.twice.values())
    bound = KILLS * (WORKERS * CAPACITY + 1)  # in-flight deliveries + one resent XADD per kill
    assert extra <= bound, (f"{extra} duplicate applications (pending at kills: "
                            f"{pending_at_kill}); at most {bound} were in flight")
    assert not r.xlen(StreamKeys.for_stream(STREAM).dead), "no job should have been dead-lettered"

    # the very same processes are alive and talking to the restarted server
    for proc in procs:
        assert proc.poll() is None, f"worker {proc.pid} died"
    wait_for(lambda: pids <= {int(c["name"].decode().rsplit("-", 2)[1])
                              for c in r.xinfo_consumers(STREAM, GROUP) if c["idle"] < 5000},
             30, interval=0.1, message="every worker reading again after the restarts")
    for proc in procs:
        os.kill(proc.pid, signal.SIGTERM)
    for i, proc in enumerate(procs):
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        log_tail = (tmp_path / f"worker-{i}.log").read_text(errors="replace")[-3000:]
        assert code == 0, f"worker {proc.pid} exit code {code} after SIGTERM; log:\n{log_tail}"
    for log in logs:
        log.close()
    r.close()
