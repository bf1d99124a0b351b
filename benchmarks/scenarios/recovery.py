"""Throughput around a SIGKILL: how fast a group is back at full speed after a worker dies.

    python -m benchmarks.scenarios.recovery [--jobs N] [--kill-at S] [--plot FILE.png]

On a private redis-server: N jobs are sent, two worker processes (``streamwork run``) serve
them, each job's handler sleeps 1 ms and counts itself in a per-second bucket (HINCRBY on
the second it finished). ``--kill-at`` seconds after the start one worker is SIGKILLed
while it holds its read-ahead (up to concurrency + batch_size deliveries), and a new one is
started at once, as a supervisor would. The run is made twice, the same in all but one
option:

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
from pathlib import Path
from typing import Any, Final

import redis

from streamwork import Message, Producer, StreamWorker
from streamwork.testing import RedisServer

STREAM: Final = "recovery"
BUCKETS: Final = "recovery:done"
ROOT: Final = Path(__file__).resolve().parents[2]


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


def _spawn(url: str, max_deliveries: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "streamwork", "run",
         "benchmarks.scenarios.recovery:RecoveryWorker", "--url", url,
         "--max-deliveries", str(max_deliveries)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run(jobs: int, kill_at: float, max_deliveries: int) -> tuple[list[int], int]:
    """One run: jobs per second from 2 s before the kill on, and the deliveries the killed
    worker held."""
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        with Producer.from_url(server.url) as producer:
            for i in range(0, jobs, 1000):
                producer.send_many(STREAM, [{"i": j} for j in range(i, min(i + 1000, jobs))])
        workers = [_spawn(server.url, max_deliveries) for _ in range(2)]
        try:
            time.sleep(kill_at)
            victim = workers[0]
            mark = f"-{victim.pid}-".encode()
            killed_at = time.time()
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            workers[0] = _spawn(server.url, max_deliveries)
            held = sum(int(c["pending"]) for c in r.xinfo_consumers(STREAM, "bench")
                       if mark in c["name"])
            deadline = time.time() + 120
            while time.time() < deadline:
                done = sum(int(v) for v in r.hvals(BUCKETS))
                if done >= jobs and int(r.xpending(STREAM, "bench")["pending"]) == 0:
                    break
                time.sleep(0.2)
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
        r.close()
    first = int(killed_at) - 2
    last = max(buckets)
    return [buckets.get(s, 0) for s in range(first, last + 1)], held


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.recovery")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--kill-at", type=float, default=4.0,
                    help="seconds after the workers start that one is SIGKILLed")
    ap.add_argument("--plot", default=None, help="write the two series to this PNG file")
    args = ap.parse_args()
    runs = {}
    for name, max_deliveries in (("batches", 5), ("one at a time", 2)):
        runs[name] = _run(args.jobs, args.kill_at, max_deliveries)
        print(f"{name}: the killed worker held {runs[name][1]} deliveries", file=sys.stderr)
    width = max(len(series) for series, _ in runs.values())
    print("second (0 = the kill) | " + " | ".join(runs))
    for i in range(width):
        cells = [str(series[i]) if i < len(series) else "" for series, _ in runs.values()]
        print(f"{i - 2:>6} | " + " | ".join(cells))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3.5))
        for name, (series, held) in runs.items():
            ax.plot(range(-2, len(series) - 2), series, marker="o", ms=3,
                    label=f"{name} ({held} deliveries held by the killed worker)")
        ax.axvline(0, color="grey", ls="--", lw=1)
        ax.set_xlabel("seconds from the SIGKILL of one of two workers")
        ax.set_ylabel("jobs done per second")
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
