"""Latency with dedup on, local done-cache on vs off, and the gen-2 GC pauses behind it.

    python -m benchmarks.scenarios.latency_gc [--rate 9600] [--seconds 4] [--repeats 2]

Serves a steady single-job load (a producer child process, as in ``streamwork bench``) with
a dedup-on worker twice per repeat: once with the default local cache
(``local_cache_size=100_000``) and once with ``local_cache_size=0``, and prints p50/p99/max
enqueue->start latency with the gen-2 garbage collections seen during the run. It found
that cachetools' ``TTLCache`` (one GC-tracked object per completed job) set off full
collections that stalled the loop 25-85 ms; streamwork._worker.core.done_cache.RecentKeys
replaced it.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from benchmarks.harness import Harness
from benchmarks.measure import GROUP, Params, percentile
from benchmarks.pacing import paced
from benchmarks.workers import LatencyWorker
from streamwork.testing import RedisServer


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.latency_gc")
    ap.add_argument("--rate", type=float, default=9600.0, help="jobs/s offered")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=100)
    args = ap.parse_args()
    n = round(args.rate * args.seconds)
    with RedisServer() as server:
        h = Harness(server.url, server.port, Params.make(jobs=n), print)
        for _ in range(args.repeats):
            for cache in (100_000, 0):
                stream = h.fresh_stream("latency-gc")
                worker = LatencyWorker.from_url(
                    server.url, stream=stream, group=GROUP, dedup=True,
                    concurrency=args.concurrency, batch_size=args.batch_size,
                    local_cache_size=cache)
                events: list[tuple[float, str]] = []

                def note(phase: str, info: dict[str, Any], out: list[tuple[float, str]] = events
                         ) -> None:
                    if info.get("generation") == 2:
                        out.append((time.perf_counter(), phase))

                gc.callbacks.append(note)
                try:
                    asyncio.run(paced(worker, server.url, stream, n, args.rate))
                finally:
                    gc.callbacks.remove(note)
                starts = [t for t, phase in events if phase == "start"]
                stops = [t for t, phase in events if phase == "stop"]
                pauses = [round((b - a) * 1000, 1) for a, b in zip(starts, stops, strict=False)]
                lat = sorted(worker.latencies)
                print(f"local_cache_size={cache:>6}: p50 {percentile(lat, 0.5) * 1000:6.2f} ms"
                      f"  p99 {percentile(lat, 0.99) * 1000:6.2f} ms"
                      f"  max {lat[-1] * 1000:6.1f} ms  gen-2 GC pauses (ms): {pauses}")
        h.close()


if __name__ == "__main__":
    main()
