"""Sections 4 and the RSS soak of 5: ``streamwork run`` worker processes served from a
backlog on the harness's Redis, timed from one instant every process sees at once.

Each run prefills the stream and creates the group at its end, starts the processes and
waits until every one of them waits in XREADGROUP (INFO clients: blocked clients); then
one pipeline moves the group back to the start and adds one more job, which wakes every
read at once. Progress is read from Redis (XINFO GROUPS: entries read less pending)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

from benchmarks.cluster_worker import machine_busy
from benchmarks.harness import Harness
from benchmarks.measure import GROUP, RUN_TIMEOUT, Run, end_process, make_jobs, redis_cpu
from benchmarks.peers import _proc_cpu
from benchmarks.scaling.load import _wake_body
from benchmarks.scaling.sizes import ScalingSizes
from streamwork.errors import BenchError

ROOT: Final = Path(__file__).resolve().parents[2]
WORKER: Final = "benchmarks.workers:NoopWorker"
PREFILL_CHUNK: Final = 50_000  #: jobs made and sent at a time (a 1M backlog stays lean here)


def _spawn(url: str, stream: str, dedup: bool, processes: int | None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "streamwork", "run", WORKER, "--url", url,
            "--stream", stream, "--group", GROUP, "--dedup" if dedup else "--no-dedup"]
    if processes is not None:
        argv += ["--processes", str(processes)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux /proc)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        kids += [int(x) for x in task.read_text().split()]
    return kids


def rss(pid: int) -> int:
    """Resident set of process ``pid`` in bytes (0 if gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def acked(h: Harness, stream: str) -> int:
    """Entries the group has read and acknowledged (entries-read less pending)."""
    for g in h.r.xinfo_groups(stream):
        name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
        if name == GROUP:
            return int(g.get("entries-read") or 0) - int(g["pending"])
    return 0


def prefill(h: Harness, stream: str, n: int) -> None:
    """n jobs in the stream, made and sent in chunks; the group created at the end."""
    for i in range(0, n, PREFILL_CHUNK):
        keys, payloads = make_jobs(min(PREFILL_CHUNK, n - i))
        h.prefill(stream, keys, payloads, group=False)
    h.r.xgroup_create(stream, GROUP, id="$")


def _wait_consumers(h: Harness, stream: str, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT
    while int(h.r.info("clients")["blocked_clients"]) < n:  # each waits in XREADGROUP
        if proc.poll() is not None:
            raise BenchError(f"streamwork run exited ({proc.returncode}) before it read")
        if time.monotonic() > deadline:
            raise BenchError("the worker processes did not start reading")
        time.sleep(0.02)


def _go(h: Harness, stream: str) -> None:
    pipe = h.r.pipeline(transaction=False)
    pipe.xgroup_setid(stream, GROUP, "0", entries_read=0)
    pipe.xadd(stream, {b"d": _wake_body()})
    pipe.execute()


def _watch(h: Harness, stream: str, total: int, proc: subprocess.Popen[bytes],
           tick: Callable[[int], None], timeout: float = RUN_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        done = acked(h, stream)
        tick(done)
        if done >= total:
            return
        if proc.poll() is not None:
            raise BenchError(f"streamwork run exited ({proc.returncode}) at {done}/{total}")
        if time.monotonic() > deadline:
            raise BenchError(f"stalled: {done}/{total} acked")
        time.sleep(0.005)


def processes_once(h: Harness, n: int, jobs: int, dedup: bool) -> dict[str, Any]:
    """``streamwork run --processes n`` on a backlog of ``jobs``: jobs/s and where the
    CPU went (workers, redis-server, everything else on the machine)."""
    stream = h.fresh_stream(f"procs-{n}")
    prefill(h, stream, jobs)
    proc = _spawn(h.url, stream, dedup, n)
    try:
        _wait_consumers(h, stream, n, proc)
        pids = [proc.pid, *children(proc.pid)]
        cpu0, rcpu0, busy0 = sum(map(_proc_cpu, pids)), redis_cpu(h.r), machine_busy()
        t0 = time.perf_counter()
        _go(h, stream)
        _watch(h, stream, jobs + 1, proc, lambda _: None)
        seconds = time.perf_counter() - t0
        cpu, rcpu, busy = sum(map(_proc_cpu, pids)) - cpu0, redis_cpu(h.r) - rcpu0, machine_busy()
    finally:
        end_process(proc)
    run = Run(jobs + 1, seconds, cpu, rcpu)
    others = None
    if busy0 is not None and busy is not None:
        others = round(max(0.0, 100 * (busy - busy0 - cpu - rcpu) / seconds), 1)
    return {"run": run, "others_cpu_pct": others}


def processes(h: Harness, sizes: ScalingSizes, say: Callable[[str], None]
              ) -> list[dict[str, Any]]:
    """1, 2, 4 worker processes (``--processes``), dedup off and on, on the same backlog;
    the ratio is to one raw XREADGROUP+XACK client on the same backlog."""
    from benchmarks.scaling.load import _sized, point

    _sized(h, sizes.processes_jobs)
    raw = h.raw_consume_once()
    rows = []
    for n in sizes.processes:
        row: dict[str, Any] = {"processes": n, "raw_consume": point(raw)}
        for dedup in (False, True):
            mode = "dedup_on" if dedup else "dedup_off"
            got = processes_once(h, n, sizes.processes_jobs, dedup)
            run = got.pop("run")
            row[mode] = {**point(run, raw), **got}
            say(f"{n} processes {mode}: {run.rate:,.0f} jobs/s ({run.rate / raw.rate:.2f}x "
                f"raw), CPU workers {row[mode]['client_cpu_pct']}% redis "
                f"{row[mode]['redis_cpu_pct']}% others {got['others_cpu_pct']}%")
        rows.append(row)
    return rows


# ---- the soak: one worker process's RSS against jobs done ----

def _steps(total: int, samples: int) -> Iterator[int]:
    step = max(1, total // samples)
    yield from range(step, total + 1, step)


def soak(h: Harness, sizes: ScalingSizes, dedup: bool, say: Callable[[str], None]
         ) -> dict[str, Any]:
    """``soak_jobs`` jobs through one ``streamwork run`` process; its RSS sampled at every
    ``soak_jobs / soak_samples`` jobs done. The slope is fitted after the warm-up (the
    first fifth of the jobs: connections, scripts, and with dedup on the local done-cache,
    which fills to its size cap)."""
    total = sizes.soak_jobs
    stream = h.fresh_stream("soak-on" if dedup else "soak-off")
    prefill(h, stream, total)
    proc = _spawn(h.url, stream, dedup, None)
    samples: list[tuple[int, int]] = []
    marks = list(_steps(total, sizes.soak_samples))
    try:
        _wait_consumers(h, stream, 1, proc)
        samples.append((0, rss(proc.pid)))
        t0 = time.perf_counter()
        _go(h, stream)

        def tick(done: int) -> None:
            while marks and done >= marks[0]:
                samples.append((done, rss(proc.pid)))
                marks.pop(0)

        # a soak is long by nature: allow it 1 ms per job, at least the usual run time
        _watch(h, stream, total + 1, proc, tick, max(RUN_TIMEOUT, total / 1000))
        seconds = time.perf_counter() - t0
    finally:
        end_process(proc)
    warm = [(j, b) for j, b in samples if j >= total // 5]
    slope = _slope(warm)
    say(f"soak dedup {'on' if dedup else 'off'}: {total:,} jobs in {seconds:.1f} s, RSS "
        f"{samples[0][1] / 2**20:.1f} -> {samples[-1][1] / 2**20:.1f} MiB, slope after "
        f"warm-up {slope:+,.0f} B per 1k jobs")
    return {"jobs": total, "seconds": round(seconds, 2), "samples": samples,
            "warm_up_jobs": total // 5, "slope_bytes_per_1k_jobs": round(slope, 1),
            "rss_start_bytes": samples[0][1], "rss_end_bytes": samples[-1][1],
            "rss_max_bytes": max(b for _, b in samples)}


def _slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS against jobs, in bytes per 1,000 jobs."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(j for j, _ in points) / n
    my = sum(b for _, b in points) / n
    var = sum((j - mx) ** 2 for j, _ in points)
    cov = sum((j - mx) * (b - my) for j, b in points)
    return 1000 * cov / var if var else 0.0
