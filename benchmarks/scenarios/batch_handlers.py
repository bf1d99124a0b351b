"""Jobs per second of a batch handler against the same work done one message at a time.

    python -m benchmarks.scenarios.batch_handlers [--jobs N] [--batch-max M] [--repeat R]

Part of ``python -m benchmarks`` (its ``batch_handlers`` section, :func:`section`; skip it
with ``--no-batch-handlers``); this command runs it alone, bigger. N jobs are sent, then
one worker process (``streamwork run``) serves them and the clock runs from its first
effect to its last. The work is a row write to a Redis hash:

* ``handle``: one ``HSET`` per message (a round trip per job, ``concurrency`` 16);
* ``handle_batch``: one ``HSET`` with a field per message for the whole call, and an
  ``INCR`` counting calls, in one pipeline (a round trip per call, ``concurrency`` 4, up
  to ``batch_max`` messages per call);
* the raw baseline (:func:`raw_batches`): redis-py in this process doing the same work
  without streamwork: ``XREADGROUP COUNT batch_max``, decode each body, then the one
  ``HSET`` of the batch, the ``INCR`` and the ``XACK`` in one pipeline.

Each handler is run with ``dedup`` on (job records, once-only) and off. The command prints
the best of R runs of each with its jobs/s and, for the batch handler, its mean call size.
The worker is ended by its pid; only loopback addresses are used.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgpack
import redis

from benchmarks.harness import _entries
from streamwork import Message, Producer, StreamWorker
from streamwork._wire.codec import BODY_FIELD
from streamwork.errors import BenchError
from streamwork.testing import RedisServer

STREAM: Final = "bench-rows"
ROWS: Final = "{bench-rows}:rows"
CALLS: Final = "{bench-rows}:calls"
ROOT: Final = Path(__file__).resolve().parents[2]
RUN_LIMIT: Final = 300.0  #: s one run may take
#: the handlers measured, in order: (worker class here, handler name, dedup)
KINDS: Final = (("PerMessage", "handle", True), ("Batched", "handle_batch", True),
                ("PerMessage", "handle", False), ("Batched", "handle_batch", False))


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


def _send(r: redis.Redis, url: str, jobs: int) -> None:
    """Empty the server, then send the jobs (untimed)."""
    r.flushall()
    with Producer.from_url(url) as producer:
        for i in range(0, jobs, 1000):
            n = min(1000, jobs - i)
            producer.send_many(STREAM, [{"i": j} for j in range(i, i + n)],
                               keys=[f"row-{j}" for j in range(i, i + n)])


def run_worker(url: str, kind: str, jobs: int, dedup: bool, batch_max: int,
               window: float | None = None) -> tuple[float, float]:
    """One run on the (loopback, emptied here) Redis at ``url``: jobs per second from the
    worker's first effect (the last poll that saw none) to its last (or, with ``window``,
    to that many seconds after the first, if the jobs last longer), and the mean number
    of messages per handler call."""
    r = redis.Redis.from_url(url)
    try:
        _send(r, url, jobs)
        args = [sys.executable, "-m", "streamwork", "run",
                f"benchmarks.scenarios.batch_handlers:{kind}", "--url", url,
                "--dedup" if dedup else "--no-dedup", "--log-level", "WARNING"]
        if kind == "Batched":
            args += ["--batch-max", str(batch_max)]
        worker = subprocess.Popen(args, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            first = last = 0.0
            done = calls = 0
            # the clock starts at the last poll that saw nothing done: the first effect
            # came after it (a poll that found some done already would lose them, or all
            # of them when one poll finds the run over: a busy machine polls seldom)
            idle_at = time.monotonic()
            deadline = idle_at + RUN_LIMIT
            while time.monotonic() < deadline:
                pipe = r.pipeline(transaction=False)
                done, got = pipe.hlen(ROWS).get(CALLS).execute()
                now = time.monotonic()
                if not done:
                    idle_at = now
                elif not first:
                    first = idle_at
                if done >= jobs or (first and window is not None and now - first >= window):
                    last, calls = now, int(got or 0)
                    break
                if worker.poll() is not None:
                    raise BenchError(f"{kind}: the worker exited ({worker.returncode}) with "
                                     f"{done} of {jobs} jobs done")
                time.sleep(0.005)
        finally:
            _end(worker)
    finally:
        r.close()
    if not last:
        raise BenchError(f"{kind}: not all {jobs} jobs done within {RUN_LIMIT:.0f} s")
    return done / max(last - first, 1e-9), done / calls if calls else 1.0


def _end(worker: subprocess.Popen[bytes]) -> None:
    """End the worker by its pid: SIGTERM, SIGKILL after 30 s."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def raw_batches(url: str, jobs: int, batch_max: int) -> float:
    """The raw baseline: the batch handler's work with redis-py alone, in this process;
    jobs per second from the first read to the last pipeline."""
    r = redis.Redis.from_url(url)
    try:
        _send(r, url, jobs)
        r.xgroup_create(STREAM, "raw", id="0")
        left = jobs
        start = time.perf_counter()
        while left > 0:
            entries = _entries(r.xreadgroup("raw", "c1", {STREAM: ">"}, count=batch_max))
            rows = {}
            for _, fields in entries:
                body = msgpack.unpackb(fields[BODY_FIELD])
                rows[body["k"]] = body["p"]["i"]
            pipe = r.pipeline(transaction=False)  # one round trip per batch
            pipe.hset(ROWS, mapping=rows)
            pipe.incr(CALLS)
            pipe.xack(STREAM, "raw", *(eid for eid, _ in entries))
            pipe.execute()
            left -= len(entries)
        seconds = time.perf_counter() - start
        if int(r.hlen(ROWS)) != jobs:
            raise BenchError("raw batch loop: rows missing")
    finally:
        r.close()
    return jobs / max(seconds, 1e-9)


def _label(handler: str, dedup: bool) -> str:
    return f"{handler}_dedup_{'on' if dedup else 'off'}"


def section(url: str, jobs: int, repeats: int, window: float, batch_max: int = 100,
            say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The bench's ``batch_handlers`` section: per repeat, the raw loop then the four
    handler runs, in turn (paired, as the bench's ratios are), each timed over ``jobs``
    jobs or ``window`` s from its first effect, whichever ends first; figures are medians,
    and each ratio is the median of the repeats' ratios: to the raw loop of the same
    repeat, and (``handle_batch``) to ``handle`` with the same dedup setting."""
    started = time.time()
    raw: list[float] = []
    rates: dict[str, list[float]] = {_label(h, d): [] for _, h, d in KINDS}
    per_call: dict[str, list[float]] = {key: [] for key in rates}
    for i in range(repeats):
        raw.append(raw_batches(url, jobs, batch_max))
        say(f"batch handlers [{i + 1}/{repeats}]: raw redis-py loop {raw[-1]:,.0f} jobs/s")
        for kind, handler, dedup in KINDS:
            rate, size = run_worker(url, kind, jobs, dedup, batch_max, window)
            rates[_label(handler, dedup)].append(rate)
            per_call[_label(handler, dedup)].append(size)
            say(f"batch handlers [{i + 1}/{repeats}]: {handler} dedup "
                f"{'on' if dedup else 'off'} {rate:,.0f} jobs/s ({rate / raw[-1]:.2f}x raw)")
    rows: dict[str, Any] = {"raw_batch": {"jobs_per_s": round(statistics.median(raw), 1),
                                          "runs_jobs_per_s": [round(x, 1) for x in raw]}}
    for _, handler, dedup in KINDS:
        key = _label(handler, dedup)
        row = {"handler": handler, "dedup": dedup,
               "jobs_per_s": round(statistics.median(rates[key]), 1),
               "runs_jobs_per_s": [round(x, 1) for x in rates[key]],
               "messages_per_call": round(statistics.median(per_call[key]), 1),
               "ratio_to_raw": _median_ratio(rates[key], raw)}
        if handler == "handle_batch":
            row["ratio_to_handle"] = _median_ratio(rates[key], rates[_label("handle", dedup)])
        rows[key] = row
    return {"jobs": jobs, "window_s": window, "repeats": repeats, "batch_max": batch_max,
            "baseline": "raw_batch", "results": rows,
            "seconds": round(time.time() - started, 1)}


def _median_ratio(values: list[float], bases: list[float]) -> float:
    return round(statistics.median(v / b for v, b in zip(values, bases, strict=True)
                                   if b > 0), 3)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.scenarios.batch_handlers")
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--batch-max", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the best is shown")
    args = ap.parse_args()
    print(f"{args.jobs} jobs, one HSET per message vs one per call (batch_max "
          f"{args.batch_max}); best of {args.repeat}")
    print(f"{'handler':<14} | {'dedup':<5} | {'jobs/s':>8} | {'per call':>8}")
    with RedisServer() as server:
        raw = max(raw_batches(server.url, args.jobs, args.batch_max)
                  for _ in range(args.repeat))
        print(f"{'raw redis-py':<14} | {'-':<5} | {raw:>8,.0f} | {args.batch_max:>8.1f}",
              flush=True)
        for kind, label, dedup in KINDS:
            best = max((run_worker(server.url, kind, args.jobs, dedup, args.batch_max)
                        for _ in range(args.repeat)), key=lambda run: run[0])
            print(f"{label:<14} | {'on' if dedup else 'off':<5} | {best[0]:>8,.0f} | "
                  f"{best[1]:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
