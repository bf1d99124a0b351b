"""The producer and worker processes of the cluster benchmark (``benchmarks/cluster.py``
starts them, ends them by their pid).

``python -m benchmarks.cluster_worker produce --url redis+cluster://... --stream S
--partitions 6 --jobs N [--batch B]``
``python -m benchmarks.cluster_worker consume --url redis+cluster://... --stream S
--partitions 6 --only 0,2,4 --expect N [--dedup] [--concurrency C] [--batch-size B]``

Each gets ready (a producer: its jobs made, connected to every master and the script
loaded by a send_many to another stream; a worker: its no-op
:class:`~benchmarks.workers.NoopWorker` built over its partitions, ``only_partitions``),
prints ``{"event": "ready"}`` and waits for a line on stdin, so that all of them start
together. Then it prints one JSON line, ``{"event": "done", ...}``, with times on
``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the machine, so the
parent can compare them), CPU seconds of this process and busy CPU seconds of the whole
machine (``/proc/stat``, every process; Linux only, else null) at the same moments:

* produce: ``send_many`` of its N jobs, B per call: ``start`` and ``end`` of the sends;
* consume: serves, polling its own ``counts["acked"]`` every millisecond, until N jobs are
  acked: ``first_ack`` (the first poll that saw an ack; ``first_count`` the count then) and
  ``last_ack`` (the poll that saw all N); then it drains and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any, Final

from benchmarks.measure import GROUP, make_jobs
from benchmarks.workers import NoopWorker
from streamwork import Producer

POLL: Final = 0.001  #: seconds between polls of the ack counter
TIMEOUT: Final = 120.0  #: seconds after the go by which every job must be acked
WARM: Final = 60  #: jobs of the producer's warm-up send (enough to touch every partition)


def machine_busy() -> float | None:
    """CPU seconds all the machine's CPUs have been busy so far, by every process (Linux
    /proc/stat: user, nice, system, irq, softirq; not idle, iowait, steal), else None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(ticks) < 7:
        return None
    return (sum(ticks[:3]) + ticks[5] + ticks[6]) / os.sysconf("SC_CLK_TCK")


def _say(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _go() -> bool:
    """Say ready and wait for the go (an empty line or EOF: the parent gave up)."""
    _say({"event": "ready"})
    return bool(sys.stdin.readline().strip())


def produce(args: argparse.Namespace) -> None:
    keys, payloads = make_jobs(args.jobs)
    producer = Producer.from_url(args.url, partitions=args.partitions)
    try:
        producer.send_many(f"{args.stream}-warm", [{}] * WARM,
                           [f"warm-{i}" for i in range(WARM)])
        if not _go():
            return
        busy0, cpu0, t0 = machine_busy(), time.process_time(), time.monotonic()
        for i in range(0, len(keys), args.batch):
            producer.send_many(args.stream, payloads[i:i + args.batch], keys[i:i + args.batch])
        t1, cpu1, busy1 = time.monotonic(), time.process_time(), machine_busy()
    finally:
        producer.close()
    _say({"event": "done", "start": t0, "end": t1, "cpu": cpu1 - cpu0, "sent": len(keys),
          "busy_start": busy0, "busy_end": busy1})


async def _serve(worker: NoopWorker, expect: int) -> dict[str, Any]:
    t0 = time.monotonic()
    task = asyncio.create_task(worker.serve())
    first: tuple[float, int, float, float | None] | None = None
    try:
        while True:
            acked = worker.counts["acked"]
            now = time.monotonic()
            if first is None and acked > 0:
                first = (now, acked, time.process_time(), machine_busy())
            if acked >= expect:
                break
            if task.done():
                task.result()
                return {"event": "error", "error": f"the worker stopped at {acked}/{expect}"}
            if now - t0 > TIMEOUT:
                return {"event": "error", "error": f"stalled: {acked}/{expect} acked after "
                                                   f"{TIMEOUT:g} s ({dict(worker.counts)})"}
            await asyncio.sleep(POLL)
        assert first is not None
        return {"event": "done", "go": t0, "first_ack": first[0], "first_count": first[1],
                "last_ack": now, "acked": acked, "cpu_first": first[2],
                "cpu_last": time.process_time(), "busy_first": first[3],
                "busy_last": machine_busy(), "counts": dict(worker.counts)}
    finally:
        worker.stop()
        await task


def consume(args: argparse.Namespace) -> None:
    worker = NoopWorker.from_url(
        args.url, stream=args.stream, group=GROUP, partitions=args.partitions,
        only_partitions=[int(i) for i in args.only.split(",")], dedup=args.dedup,
        concurrency=args.concurrency, batch_size=args.batch_size)
    if _go():
        _say(asyncio.run(_serve(worker, args.expect)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cluster_worker")
    sub = ap.add_subparsers(dest="role", required=True)
    pp = sub.add_parser("produce")
    pp.add_argument("--jobs", type=int, required=True)
    pp.add_argument("--batch", type=int, default=3000)
    cp = sub.add_parser("consume")
    cp.add_argument("--only", required=True, help="comma-separated partition numbers")
    cp.add_argument("--expect", type=int, required=True)
    cp.add_argument("--dedup", action="store_true")
    cp.add_argument("--concurrency", type=int, default=256)
    cp.add_argument("--batch-size", type=int, default=100)
    for p in (pp, cp):
        p.add_argument("--url", required=True)
        p.add_argument("--stream", required=True)
        p.add_argument("--partitions", type=int, required=True)
    args = ap.parse_args(argv)
    (produce if args.role == "produce" else consume)(args)


if __name__ == "__main__":
    main()
