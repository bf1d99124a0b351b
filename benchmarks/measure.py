"""What one bench run measures, and how a timed section is measured.

The run's settings (:class:`Params`, batch sizes, the consume sweep, time limits), one timed
run (:class:`Run`: wall time plus the CPU of both sides, taken by :class:`Span`), the
median summary of repeated runs, and the jobs every scenario enqueues.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis

from streamwork._worker.config import WorkerOptions
from streamwork.errors import BenchError

BATCH: Final = 500  #: jobs per pipeline / XREADGROUP COUNT / send_many call of the baselines
GROUP: Final = "bench"
LEASE_MS: Final = 30_000  #: lease TTL of the naive safety loop (streamwork's default)
DONE_MS: Final = 3_600_000  #: done-marker TTL of the naive safety loop (streamwork's default)
LOAD_FRACTION: Final = 0.2  #: offered load of the latency run, as a fraction of the max
RUN_TIMEOUT: Final = 300.0  #: seconds one consume run may take before the bench gives up
#: (concurrency, batch_size) pairs the consume scenarios try (a read returns at most
#: batch_size entries, fewer when the worker has less room); :meth:`Params.make` adds the
#: default setting when a sweep lacks it
FULL_SWEEP: Final = ((16, 100), (64, 100), (64, 500), (256, 100), (256, 500), (1024, 100),
                     (1024, 500))
QUICK_SWEEP: Final = ((16, 100), (64, 500))


def default_setting() -> tuple[int, int]:
    """(concurrency, batch_size) a worker gets when it sets neither: the defaults of
    ``WorkerOptions``, read when the bench runs (never a copy of them here), so the
    figures at the defaults follow the library's defaults."""
    return WorkerOptions.concurrency, WorkerOptions.batch_size


def default_options() -> dict[str, Any]:
    """The default options the bench measures (dedup is the default's, ``True``: the
    dedup-off scenarios turn it off and keep every other default)."""
    concurrency, batch_size = default_setting()
    return {"concurrency": concurrency, "batch_size": batch_size,
            "dedup": WorkerOptions.dedup}


@dataclass(frozen=True, slots=True)
class Params:
    """What one bench run measures; :meth:`make` fills in the defaults."""

    jobs: int
    repeats: int
    quick: bool
    sweep: tuple[tuple[int, int], ...]
    latency_seconds: float
    accounting_jobs: int

    @classmethod
    def make(cls, *, jobs: int | None = None, repeats: int = 3, quick: bool = False) -> Params:
        if repeats < 1:
            raise BenchError("--repeats must be >= 1")
        n = jobs if jobs is not None else (600 if quick else 20_000)
        if n < 1:
            raise BenchError("--jobs must be >= 1")
        sweep = QUICK_SWEEP if quick else FULL_SWEEP
        if default_setting() not in sweep:  # the defaults are always among those tried
            sweep = (default_setting(), *sweep)
        return cls(
            jobs=n,
            repeats=repeats,
            quick=quick,
            sweep=sweep,
            latency_seconds=0.5 if quick else 4.0,
            accounting_jobs=min(n, 10_000),
        )


@dataclass(frozen=True, slots=True)
class Run:
    """One timed run: wall time and the CPU both sides spent in it."""

    jobs: int
    seconds: float
    client_cpu: float  # CPU seconds of this process (all threads)
    redis_cpu: float  # CPU seconds of redis-server
    #: CPU seconds of the whole machine (/proc/stat, in clock ticks: coarse for a span of
    #: a few ms); None where unknown
    machine_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


class Span:
    """Measures wall time, this process's CPU, redis-server's CPU and the whole machine's
    CPU of a timed section."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._t = self._cpu = self._rcpu = self._mcpu = 0.0

    def start(self) -> None:
        self._rcpu = redis_cpu(self.r)
        self._mcpu = machine_cpu()
        self._cpu = time.process_time()
        self._t = time.perf_counter()

    def elapsed(self) -> float:
        """Wall seconds since :meth:`start`."""
        return time.perf_counter() - self._t

    def stop(self, jobs: int) -> Run:
        seconds = time.perf_counter() - self._t
        cpu = time.process_time() - self._cpu
        machine = max(0.0, machine_cpu() - self._mcpu) if self._mcpu > 0 else None
        return Run(jobs, seconds, cpu, redis_cpu(self.r) - self._rcpu, machine)


@contextlib.contextmanager
def frozen_gc() -> Iterator[None]:
    """Run an in-process worker as ``streamwork run`` runs one: what exists before it starts
    (here: the harness, its prefilled jobs) moved out of the collector's sight with
    ``gc.freeze()``, so full collections traverse only what the worker allocates. Without
    it, a worker served in this process pays for the harness's heap: 12-56 ms gen-2
    pauses in a 0.14-0.45 s consume run."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def redis_cpu(r: redis.Redis) -> float:
    """CPU seconds redis-server has used so far (system + user)."""
    info: dict[str, Any] = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def machine_cpu() -> float:
    """CPU seconds the whole machine has been busy so far (``/proc/stat``: user, nice,
    system, irq, softirq, steal of every CPU); 0.0 where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
        ticks = [int(x) for x in fields[1:9]]
    except (OSError, ValueError, IndexError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def summary(runs: Sequence[Run]) -> dict[str, Any]:
    """The median rate, every run's rate, the CPU shares of the median run, and the CPU
    each side spent per job (µs, the median over the runs)."""
    ordered = sorted(runs, key=lambda r: r.rate)
    mid = ordered[(len(ordered) - 1) // 2]
    return {
        "jobs_per_s": round(statistics.median(r.rate for r in runs), 1),
        "runs_jobs_per_s": [round(r.rate, 1) for r in runs],
        "jobs": mid.jobs,
        "client_cpu_pct": round(100 * mid.client_cpu / mid.seconds, 1),
        "redis_cpu_pct": round(100 * mid.redis_cpu / mid.seconds, 1),
        **cpu_per_job(runs),
    }


def cpu_per_job(runs: Sequence[Run]) -> dict[str, float]:
    """Wall time and CPU per job in µs, each the median over ``runs``: the client's (the
    process that ran the loop or the worker), redis-server's (INFO cpu deltas) and, where
    the machine's CPU is known, every other process's (``others``)."""
    runs = [r for r in runs if r.jobs > 0]
    if not runs:
        return {}
    out = {
        "wall_us_per_job": round(statistics.median(1e6 * r.seconds / r.jobs for r in runs), 3),
        "client_cpu_us_per_job": round(
            statistics.median(1e6 * r.client_cpu / r.jobs for r in runs), 3),
        "redis_cpu_us_per_job": round(
            statistics.median(1e6 * r.redis_cpu / r.jobs for r in runs), 3),
    }
    others = [max(0.0, r.machine_cpu - r.client_cpu - r.redis_cpu) / r.jobs
              for r in runs if r.machine_cpu is not None]
    if others:  # every other process of the machine: other people's work on a shared VM
        out["others_cpu_us_per_job"] = round(1e6 * statistics.median(others), 3)
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values; 0.0 when there are none."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def make_jobs(n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """n job keys (uuid4 hex, as the producer's default) and small payloads."""
    keys = [uuid.uuid4().hex for _ in range(n)]
    payloads: list[dict[str, Any]] = [
        {"order": i, "amount_cents": 1999, "currency": "EUR"} for i in range(n)
    ]
    return keys, payloads


def end_process(proc: subprocess.Popen[bytes]) -> None:
    """End a child process the run started, by its pid: SIGTERM, then SIGKILL after 5 s;
    then close the pipes this side holds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
