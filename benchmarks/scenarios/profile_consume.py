"""Profile streamwork's consume path with cProfile.

    python -m benchmarks.scenarios.profile_consume [--dedup on|off] [--jobs N]
        [--concurrency C] [--batch-size B] [--top N] [--out FILE.pstats] [--no-cprofile]

Starts a private redis-server, enqueues N jobs, serves them with a no-op worker under
cProfile and prints the functions with the most own time (tottime) and cumulative time.
cProfile slows Python code down (about 1.5-2x), so read the shares, not the rate. With
``--no-cprofile`` it only runs, for a sampling profiler attached from outside:

    py-spy record -o consume.svg -- python -m benchmarks.scenarios.profile_consume \
        --no-cprofile --jobs 100000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats

from benchmarks.harness import Harness, serve_until
from benchmarks.measure import GROUP, Params, Span, make_jobs
from benchmarks.workers import NoopWorker
from streamwork.testing import RedisServer


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.profile_consume")
    ap.add_argument("--dedup", choices=("on", "off"), default="on")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="also write the raw stats to this file")
    ap.add_argument("--no-cprofile", action="store_true", help="run without cProfile")
    args = ap.parse_args()
    with RedisServer() as server:
        h = Harness(server.url, server.port, Params.make(jobs=args.jobs), print)
        stream = h.fresh_stream("profile")
        keys, payloads = make_jobs(args.jobs)
        h.prefill(stream, keys, payloads, group=False)
        worker = NoopWorker.from_url(server.url, stream=stream, group=GROUP,
                                     dedup=args.dedup == "on", concurrency=args.concurrency,
                                     batch_size=args.batch_size)
        prof = cProfile.Profile()
        if not args.no_cprofile:
            prof.enable()
        run = asyncio.run(serve_until(worker, args.jobs, Span(h.r)))
        prof.disable()
        h.close()
    print(f"{run.rate:,.0f} jobs/s{'' if args.no_cprofile else ' under cProfile'} (client cpu "
          f"{100 * run.client_cpu / run.seconds:.0f}%, redis cpu "
          f"{100 * run.redis_cpu / run.seconds:.0f}%)")
    if args.no_cprofile:
        return
    stats = pstats.Stats(prof)
    if args.out:
        stats.dump_stats(args.out)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
