"""`streamwork run --processes N` (a supervisor over N worker processes) and several workers
in one process, on a real redis-server; children are found through the consumer names
(host-pid-random) of the group and /proc (Linux)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

import streamwork as sw
from streamwork._hosting.processes import BACKOFF_MAX, BACKOFF_RESET, restart_delay
from streamwork.testing import stream_idle, wait_for
from tests.workers.ops import OTHER_STREAM, STREAM, OpsWorker, OtherOpsWorker, ledger_key

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="finds child processes through /proc")

ROOT = Path(__file__).resolve().parent.parent
OPS = "tests.workers.ops:OpsWorker"
OTHER = "tests.workers.ops:OtherOpsWorker"
Spawn = Callable[..., subprocess.Popen[bytes]]
INFO = ("--log-level", "INFO")  # after spawn_worker's WARNING: the "worker started" lines


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process, from /proc; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text.rsplit(")", 1)[1].split()[:2]
    return state, int(ppid)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped yet counts as exited)."""
    state = _proc_state(pid)
    return state is None or state[0] in "ZX"


def _consumer_pids(r: redis.Redis, stream: str, group: str) -> set[int]:
    """The pids in the names of the group's consumers (host-pid-random); a consumer shows
    once something was delivered to it."""
    try:
        consumers = r.xinfo_consumers(stream, group)
    except redis.ResponseError:  # no stream or group yet
        return set()
    return {int(c["name"].decode().rsplit("-", 2)[1]) for c in consumers}


def _pending_of(r: redis.Redis, pid: int) -> int:
    """Deliveries the OpsWorker consumer of process ``pid`` holds (not acked yet)."""
    return sum(int(c["pending"]) for c in r.xinfo_consumers(STREAM, OpsWorker.group)
               if int(c["name"].decode().rsplit("-", 2)[1]) == pid)


def _children(parent: int) -> set[int]:
    """The live child processes of ``parent``."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            state = _proc_state(int(entry.name))
            if state is not None and state[1] == parent and state[0] not in "ZX":
                pids.add(int(entry.name))
    return pids


def _started(log_path: Path, stream: str = STREAM) -> set[int]:
    """The pids whose worker logged that it joined the group of ``stream`` and serves."""
    pattern = re.compile(rf"worker started stream={re.escape(stream)} .*consumer=\S+-(\d+)-")
    return {int(m.group(1)) for m in pattern.finditer(log_path.read_text(errors="replace"))}


def _wait_children(log_path: Path, parent: int, n: int,
                   other_than: set[int] | None = None) -> set[int]:
    """Wait until ``n`` children of ``parent`` serve (not exactly ``other_than``)."""

    def all_serve() -> set[int] | None:
        pids = _children(parent) & _started(log_path)
        return pids if len(pids) == n and pids != other_than else None

    return wait_for(all_serve, 60, interval=0.05, message=f"{n} child processes serving"
                    + (f" besides {sorted(other_than)}" if other_than else ""))


def _ledger(r: redis.Redis, stream: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in r.hgetall(ledger_key(stream)).items()}


def _send(url: str, stream: str, n: int, payload: dict[str, object]) -> list[str]:
    keys = [f"{stream}-job-{i}" for i in range(n)]
    with sw.Producer.from_url(url) as producer:
        producer.send_many(stream, [payload] * n, keys=keys)
    return keys


def test_a_killed_child_is_restarted_and_sigterm_drains_all(
        redis_url: str, r: redis.Redis, spawn_worker: Spawn, tmp_path: Path) -> None:
    """`--processes 3`: a SIGKILLed child is restarted (a new pid serves, the restart is
    logged with the pid, signal and count), every job takes effect exactly once; SIGTERM to
    the supervisor drains every child, it exits 0 and no child is left."""
    log_path = tmp_path / "supervisor.log"
    with log_path.open("wb") as log:
        parent = spawn_worker(OPS, redis_url, "--processes", "3", *INFO, stdout=log)
    first = _wait_children(log_path, parent.pid, 3)
    keys = _send(redis_url, STREAM, 400, {"sleep": 0.05})
    wait_for(lambda: len(_ledger(r, STREAM)) >= 60, 60, message="60 jobs done before the kill")

    # the child holding the most deliveries right now, so the kill leaves jobs in flight
    victim = max(first, key=lambda pid: _pending_of(r, pid))
    os.kill(victim, signal.SIGKILL)
    now = _wait_children(log_path, parent.pid, 3, other_than=first)
    [restarted] = now - first
    assert victim not in now
    assert parent.poll() is None, "the supervisor must survive a child's death"

    wait_for(lambda: len(_ledger(r, STREAM)) == len(keys) and stream_idle(
        r, STREAM, OpsWorker.group), 60, interval=0.05, message="every job done and acked")
    ledger = _ledger(r, STREAM)
    assert sorted(ledger) == sorted(keys)
    assert {k: n for k, n in ledger.items() if n != 1} == {}, "a job applied twice"
    restart_lines = [line for line in log_path.read_text().splitlines()
                     if "worker process died; restarting it" in line]
    assert len(restart_lines) == 1, restart_lines
    assert f"pid={victim}" in restart_lines[0]
    assert "signal=SIGKILL" in restart_lines[0] and "restarts=1" in restart_lines[0]

    os.kill(parent.pid, signal.SIGTERM)
    assert parent.wait(timeout=30) == 0, log_path.read_text()[-3000:]
    for pid in first | now:
        assert _gone(pid), f"child {pid} outlived the supervisor"
    assert restarted not in first


def test_children_stop_when_the_supervisor_is_sigkilled(
        redis_url: str, spawn_worker: Spawn, tmp_path: Path) -> None:
    """The options given reach every child. SIGKILL to the supervisor (no chance to forward
    anything): its children get SIGTERM from the kernel (PR_SET_PDEATHSIG), drain and
    exit; none is left orphaned."""
    log_path = tmp_path / "supervisor.log"
    with log_path.open("wb") as log:
        parent = spawn_worker(OPS, redis_url, "--processes", "2", *INFO, "--concurrency", "3",
                              "--timeout", "none", "--no-heartbeat", stdout=log)
    children = _wait_children(log_path, parent.pid, 2)
    for pid in children:  # the options given reach every child; --processes does not
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        assert "--processes" not in argv
        for option in (["--concurrency", "3"], ["--timeout", "none"], ["--no-heartbeat"]):
            at = argv.index(option[0])
            assert argv[at:at + len(option)] == option, argv
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=10)
    wait_for(lambda: all(_gone(pid) for pid in children), 30, interval=0.05,
             message=f"children {sorted(children)} to exit after their supervisor died")


def test_a_failed_child_stops_the_supervisor_with_status_1(
        redis_url: str, r: redis.Redis, spawn_worker: Spawn, tmp_path: Path) -> None:
    """A child that stops on an error no restart cures (WorkerFailed: the stream's key
    holds a string) exits 1: the supervisor stops the other children and exits 1."""
    log_path = tmp_path / "supervisor.log"
    with log_path.open("wb") as log:
        parent = spawn_worker(OPS, redis_url, "--processes", "2", *INFO, stdout=log)
    children = _wait_children(log_path, parent.pid, 2)
    with r.pipeline(transaction=True) as tx:
        tx.delete(STREAM).set(STREAM, "not a stream").execute()
    assert parent.wait(timeout=60) == 1
    out = log_path.read_text()
    assert "WorkerFailed" in out and "a worker process failed" in out, out[-3000:]
    assert "worker process died; restarting it" not in out
    for pid in children:
        assert _gone(pid)


def test_two_workers_in_one_process(redis_url: str, r: redis.Redis,
                                    spawn_worker: Spawn) -> None:
    """`run A B`: one process serves both streams (both groups' consumers carry its pid);
    SIGTERM drains both and it exits 0, every job of each stream applied once."""
    proc = spawn_worker(OPS, redis_url, OTHER)
    ops = _send(redis_url, STREAM, 40, {"sleep": 0.01})
    other = _send(redis_url, OTHER_STREAM, 30, {"sleep": 0.01})
    wait_for(lambda: stream_idle(r, STREAM, OpsWorker.group) and stream_idle(
        r, OTHER_STREAM, OtherOpsWorker.group), 60, interval=0.05,
        message="both streams done")
    assert _consumer_pids(r, STREAM, OpsWorker.group) == {proc.pid}
    assert _consumer_pids(r, OTHER_STREAM, OtherOpsWorker.group) == {proc.pid}
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert _ledger(r, STREAM) == dict.fromkeys(ops, 1)
    assert _ledger(r, OTHER_STREAM) == dict.fromkeys(other, 1)


def test_one_failing_worker_stops_the_process_with_status_1(
        redis_url: str, r: redis.Redis, spawn_worker: Spawn, tmp_path: Path) -> None:
    """Two workers in one process; one stops on an error it cannot ride out (its stream's
    key turns into a string): the other is stopped too, and the process exits 1."""
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = spawn_worker(OPS, redis_url, OTHER, *INFO, stdout=log)
    wait_for(lambda: _started(log_path) and _started(log_path, OTHER_STREAM), 60,
             interval=0.05, message="both workers serving")
    with r.pipeline(transaction=True) as tx:
        tx.delete(OTHER_STREAM).set(OTHER_STREAM, "not a stream").execute()
    assert proc.wait(timeout=60) == 1
    out = log_path.read_text()
    assert "WorkerFailed" in out, out[-3000:]
    assert "stopping the other workers" in out, out[-3000:]


def test_two_workers_on_one_stream_and_group_are_refused() -> None:
    """Options that put two workers of one process on the same stream and group (their
    jobs would be split between two handlers) fail at once, saying what to do."""
    proc = subprocess.run(
        [sys.executable, "-m", "streamwork", "run", OPS, OTHER, "--stream", "same",
         "--group", "same", "--url", "redis://127.0.0.1:1/0"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "would both consume stream 'same' as group 'same'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_restart_backoff_doubles_to_its_cap_and_resets_after_a_good_run() -> None:
    """A child dying again and again waits 0.5, 1, 2, ... s, never more than 30 s; one that
    ran 60 s fine before dying waits 0.5 s again."""
    delays, delay = [], 0.0
    for _ in range(10):
        delay = restart_delay(delay, ran=1.0)
        delays.append(delay)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
    assert BACKOFF_MAX == 30.0
    assert restart_delay(30.0, ran=BACKOFF_RESET) == 0.5
    assert restart_delay(30.0, ran=BACKOFF_RESET - 1) == 30.0
