"""Jobs per second of a batch handler against the same work done one message at a time.

    python -m benchmarks.scenarios.batch_handlers [--jobs N] [--batch-max M] [--repeat R]

On a private redis-server, N jobs are sent, then one worker process (``streamwork run``)
serves them and the clock runs from its first effect to its last. The work is a row
write to a Redis hash:

* ``handle``: one ``HSET`` per message (a round trip per job, ``concurrency`` 16);
* ``handle_batch``: one ``HSET`` with a field per message for the whole call, and an
  ``INCR`` counting calls, in one pipeline (a round trip per call, ``concurrency`` 4, up
  to ``batch_max`` messages per call).

Each is run with ``dedup`` on (job records, once-only) and off, R times each, and the best
run is printed as a table with the jobs/s and, for the batch handler, its mean call size.
The worker is ended by its pid; only loopback addresses are used.
"""

from __future__ import annotations

import argparse
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

STREAM: Final = "bench-rows"
ROWS: Final = "{bench-rows}:rows"
CALLS: Final = "{bench-rows}:calls"
ROOT: Final = Path(__file__).resolve().parents[2]


class _Client(StreamWorker):
    stream = STREAM
    group = "bench"
    read_block = 0.1
    _client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = redis.asyncio.Redis.from_url(self.url)
        return self._client


class PerMessage(_Client):
    """One HSET per message."""

    concurrency = 16

    async def handle(self, msg: Message) -> None:
        await self.client().hset(ROWS, msg.key, msg.payload["i"])


class Batched(_Client):
    """One HSET (a field per message) per call."""

    concurrency = 4

    async def handle_batch(self, msgs: list[Message]) -> None:
        pipe = self.client().pipeline(transaction=False)  # one round trip
        pipe.hset(ROWS, mapping={m.key: m.payload["i"] for m in msgs})
        pipe.incr(CALLS)  # counts the calls (for the mean batch size)
        await pipe.execute()


def _run(kind: str, jobs: int, dedup: bool, batch_max: int) -> tuple[float, float]:
    """One run: jobs per second from the first effect to the last, and the mean number of
    messages per handler call."""
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        with Producer.from_url(server.url) as producer:
            for i in range(0, jobs, 1000):
                n = min(1000, jobs - i)
                producer.send_many(STREAM, [{"i": j} for j in range(i, i + n)],
                                   keys=[f"row-{j}" for j in range(i, i + n)])
        args = [sys.executable, "-m", "streamwork", "run",
                f"benchmarks.scenarios.batch_handlers:{kind}", "--url", server.url,
                "--dedup" if dedup else "--no-dedup", "--log-level", "WARNING"]
        if kind == "Batched":
            args += ["--batch-max", str(batch_max)]
        worker = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            first = last = 0.0
            before = 0
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                done = int(r.hlen(ROWS))
                now = time.monotonic()
                if done and not first:
                    first, before = now, done
                if done >= jobs:
                    last = now
                    break
                time.sleep(0.005)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        calls = int(r.get(CALLS) or 0)
        r.close()
    if not last:
        raise SystemExit(f"{kind}: not all {jobs} jobs done within 300 s")
    return (jobs - before) / max(last - first, 1e-9), jobs / calls if calls else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.batch_handlers")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--batch-max", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the best is shown")
    args = ap.parse_args()
    print(f"{args.jobs} jobs, one HSET per message vs one per call (batch_max "
          f"{args.batch_max}); best of {args.repeat}")
    print(f"{'handler':<14} | {'dedup':<5} | {'jobs/s':>8} | {'per call':>8}")
    for dedup in (True, False):
        for kind, label in (("PerMessage", "handle"), ("Batched", "handle_batch")):
            best = max((_run(kind, args.jobs, dedup, args.batch_max)
                        for _ in range(args.repeat)), key=lambda run: run[0])
            print(f"{label:<14} | {'on' if dedup else 'off':<5} | {best[0]:>8,.0f} | "
                  f"{best[1]:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
