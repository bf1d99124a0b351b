"""Throughput around a SIGKILL: how fast a group is back at full speed after a worker dies.

    python -m benchmarks.scenarios.recovery [--jobs N] [--kill-at S] [--plot FILE.png]

Part of ``python -m benchmarks`` in a bounded form (its ``recovery`` section,
:func:`section`: a few seconds before and after the kill; skip it with ``--no-recovery``);
this command runs it alone until every job is done. N jobs are sent, two worker processes
(``streamwork run``) serve them, each job's handler sleeps 1 ms and counts itself in a
per-second bucket (HINCRBY on the second it finished). ``--kill-at`` seconds after the
first job is done one worker is SIGKILLed while it holds its read-ahead (up to concurrency
+ batch_size deliveries), and a new one is started at once, as a supervisor would. The run
is made twice, the same in all but one option:

* ``batches``: max_deliveries 5, so the deliveries of the killed worker (delivered once)
  are reclaimed as a batch;
* ``one at a time``: max_deliveries 2, which leaves no lone try after a batch, so each of
  those deliveries is reclaimed alone (reading pauses while it runs): what every reclaim
  did before batches.

It prints jobs per second in 1-s buckets from 2 s before the kill to the end of the run,
for both, and with ``--plot`` draws them (needs matplotlib). The workers are ended by their
pid; only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import redis

from streamwork import Message, Producer, StreamWorker
from streamwork.errors import BenchError
from streamwork.testing import RedisServer

STREAM: Final = "recovery"
BUCKETS: Final = "recovery:done"
ROOT: Final = Path(__file__).resolve().parents[2]
#: the two modes: (name, max_deliveries)
MODES: Final = (("batches", 5), ("one_at_a_time", 2))
DRAIN_LIMIT: Final = 120.0  #: s the unbounded run (this command) waits for every job


class RecoveryWorker(StreamWorker):
    """Sleeps 1 ms per job, then counts it in the bucket of the second it finished."""

    stream = STREAM
    group = "bench"
    concurrency = 16
    batch_size = 100
    visibility_timeout = 2.0
    read_block = 0.1
    _client: Any = None

    async def handle(self, msg: Message) -> None:
        await asyncio.sleep(0.001)
        if self._client is None:
            self._client = redis.asyncio.Redis.from_url(self.url)
        await self._client.hincrby(BUCKETS, str(int(time.time())), 1)


@dataclass(frozen=True, slots=True)
class Plan:
    """One recovery run: ``jobs`` sent, the kill ``kill_at`` s after the first job is done,
    then ``after`` s watched (None: until every job is done)."""

    jobs: int
    kill_at: float
    after: float | None
    visibility_timeout: float

    @classmethod
    def bench(cls, quick: bool) -> Plan:
        """The bench's bounded run: 3 s before the kill, 5 s after (full); --quick: 2 s
        and 2 s with a 0.5 s visibility timeout. Enough jobs not to run dry."""
        if quick:
            return cls(jobs=30_000, kill_at=2.0, after=2.0, visibility_timeout=0.5)
        return cls(jobs=100_000, kill_at=3.0, after=5.0, visibility_timeout=2.0)


def _spawn(url: str, max_deliveries: int, visibility_timeout: float
           ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "streamwork", "run",
         "benchmarks.scenarios.recovery:RecoveryWorker", "--url", url,
         "--max-deliveries", str(max_deliveries),
         "--visibility-timeout", str(visibility_timeout)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _done(r: redis.Redis) -> int:
    return sum(int(v) for v in r.hvals(BUCKETS))


def _joined(r: redis.Redis, workers: list[subprocess.Popen[bytes]]) -> bool:
    """Whether every worker process has a consumer in the group (consumer names hold the
    pid)."""
    try:
        names = [c["name"] for c in r.xinfo_consumers(STREAM, "bench")]
    except redis.ResponseError:  # no group yet
        return False
    return all(any(f"-{w.pid}-".encode() in n for n in names) for w in workers)


def run_once(url: str, plan: Plan, max_deliveries: int) -> dict[str, Any]:
    """One run on the (loopback, emptied here) Redis at ``url``: jobs done per second from
    2 s before the kill to the last whole second watched, and the deliveries the killed
    worker held."""
    r = redis.Redis.from_url(url)
    try:
        r.flushall()
        with Producer.from_url(url) as producer:
            for i in range(0, plan.jobs, 1000):
                producer.send_many(STREAM, [{"i": j}
                                            for j in range(i, min(i + 1000, plan.jobs))])
        workers = [_spawn(url, max_deliveries, plan.visibility_timeout) for _ in range(2)]
        try:
            deadline = time.time() + 60
            while not (_done(r) and _joined(r, workers)):
                if time.time() > deadline or any(w.poll() is not None for w in workers):
                    raise BenchError("recovery: the workers did not start work")
                time.sleep(0.01)
            first_work = time.time()
            time.sleep(plan.kill_at)
            victim = workers[0]
            mark = f"-{victim.pid}-".encode()
            killed_at = time.time()
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            workers[0] = _spawn(url, max_deliveries, plan.visibility_timeout)
            held = sum(int(c["pending"]) for c in r.xinfo_consumers(STREAM, "bench")
                       if mark in c["name"])
            limit = DRAIN_LIMIT if plan.after is None else plan.after
            while time.time() < killed_at + limit:
                if (plan.after is None and _done(r) >= plan.jobs
                        and int(r.xpending(STREAM, "bench")["pending"]) == 0):
                    break
                time.sleep(0.05 if plan.after is not None else 0.2)
            stopped_at = time.time()
            left = sum(int(c["pending"]) for c in r.xinfo_consumers(STREAM, "bench")
                       if mark in c["name"])
        finally:
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        buckets = {int(k): int(v) for k, v in r.hgetall(BUCKETS).items()}
        done = _done(r)
    finally:
        r.close()
    kill_s = int(killed_at)
    last = int(stopped_at) - 1 if plan.after is not None else max(buckets)
    series = [buckets.get(s, 0) for s in range(kill_s - 2, last + 1)]
    # whole seconds before the kill's second, after the first job was done
    pre = [buckets.get(s, 0) for s in range(int(first_work) + 1, kill_s)]
    return {"series": series, "first_second": -2, "held": held,
            "left_with_the_killed_worker": left, "pre_kill_buckets": len(pre),
            "ran_dry": done >= plan.jobs and plan.after is not None,
            # run to the end (this command), the last second is partial: not in the dip
            **_dip(pre, series[2:] if plan.after is not None else series[2:-1])}


def _dip(pre: list[int], after: list[int]) -> dict[str, Any]:
    """The pre-kill level (mean of the whole seconds before the kill), the lowest second
    from the kill on and its ratio to that level, and the seconds of work lost (the
    shortfall of every second from the kill on, in seconds at the pre-kill level)."""
    level = sum(pre) / len(pre) if pre else 0.0
    low = min(after) if after else 0
    return {"pre_kill_per_s": round(level, 1), "min_after_kill_per_s": low,
            "dip_ratio": round(low / level, 3) if level else 0.0,
            "lost_s": round(sum(max(level - x, 0) for x in after) / level, 2) if level else 0.0}


def section(url: str, quick: bool, say: Callable[[str], None] = lambda _: None
            ) -> dict[str, Any]:
    """The bench's ``recovery`` section: the bounded run (:meth:`Plan.bench`) in both
    modes; each mode's dip is a ratio to its own pre-kill level, and the modes are compared
    by their dips and the seconds of work they lost."""
    started = time.time()
    plan = Plan.bench(quick)
    modes: dict[str, Any] = {}
    for name, max_deliveries in MODES:
        modes[name] = {"max_deliveries": max_deliveries, **run_once(url, plan, max_deliveries)}
        m = modes[name]
        say(f"recovery {name.replace('_', ' ')}: {m['pre_kill_per_s']:,.0f} jobs/s before "
            f"the kill, lowest second after {m['min_after_kill_per_s']:,} "
            f"({m['dip_ratio']:.2f}x), {m['lost_s']} s of work lost, {m['held']} held")
    return {"plan": asdict(plan), "modes": modes, "seconds": round(time.time() - started, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.recovery")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--kill-at", type=float, default=3.0,
                    help="seconds after the first job is done that one worker is SIGKILLed")
    ap.add_argument("--plot", default=None, help="write the two series to this PNG file")
    args = ap.parse_args()
    plan = Plan(jobs=args.jobs, kill_at=args.kill_at, after=None, visibility_timeout=2.0)
    runs = {}
    with RedisServer() as server:
        for name, max_deliveries in MODES:
            runs[name] = run_once(server.url, plan, max_deliveries)
            print(f"{name}: the killed worker held {runs[name]['held']} deliveries",
                  file=sys.stderr)
    width = max(len(run["series"]) for run in runs.values())
    print("second (0 = the kill) | " + " | ".join(runs))
    for i in range(width):
        cells = [str(run["series"][i]) if i < len(run["series"]) else ""
                 for run in runs.values()]
        print(f"{i - 2:>6} | " + " | ".join(cells))
    for name, run in runs.items():
        print(f"{name}: {run['pre_kill_per_s']:,.0f} jobs/s before the kill, lowest second "
              f"after {run['min_after_kill_per_s']:,} ({run['dip_ratio']:.2f}x), "
              f"{run['lost_s']} s of work lost")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3.5))
        for name, run in runs.items():
            series = run["series"]
            ax.plot(range(-2, len(series) - 2), series, marker="o", ms=3,
                    label=f"{name.replace('_', ' ')} ({run['held']} deliveries held by "
                          "the killed worker)")
        ax.axvline(0, color="grey", ls="--", lw=1)
        ax.set_xlabel("seconds from the SIGKILL of one of two workers")
        ax.set_ylabel("jobs done per second")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
