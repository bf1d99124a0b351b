"""A steady offered load for the latency run: a producer child process sends jobs as they
fall due while the worker under test is served in this process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

from benchmarks.measure import RUN_TIMEOUT, make_jobs
from benchmarks.workers import LatencyWorker
from streamwork import Producer
from streamwork.errors import BenchError

#: the directory holding the ``benchmarks`` package, put on the child process's path
_ROOT: Final = str(Path(__file__).resolve().parent.parent)


def pace_sends(url: str, stream: str, n: int, rate: float) -> None:
    """Offer n jobs at a steady ``rate``: each job is sent when it falls due, alone with
    ``send`` or, when the loop woke late and several are due, together with ``send_many``
    (one Python process cannot do ~10k single round trips/s on a small machine). Prints
    the achieved rate as JSON."""
    keys, payloads = make_jobs(n)
    producer = Producer.from_url(url)
    try:
        start = time.perf_counter()
        sent = 0
        while sent < n:
            now = time.perf_counter()
            due = min(n, int((now - start) * rate) + 1)
            if due > sent:  # the send time, at full resolution (the body's t is whole ms)
                sent_at = time.time()
                for i in range(sent, due):
                    payloads[i]["sent_at"] = sent_at
            if due - sent == 1:
                producer.send(stream, payloads[sent], key=keys[sent])
            elif due > sent:
                producer.send_many(stream, payloads[sent:due], keys[sent:due])
            else:
                time.sleep(max(0.0, start + sent / rate - now))
                continue
            sent = due
        elapsed = time.perf_counter() - start
    finally:
        producer.close()
    print(json.dumps({"achieved_per_s": n / elapsed if elapsed > 0 else 0.0}))


def _pace_in_child(url: str, stream: str, n: int, rate: float) -> float:
    """Run :func:`pace_sends` in a child Python process, so the producer's CPU, GIL and
    objects do not disturb the worker being measured (producers are other processes in
    production too); return the rate it achieved."""
    code = (f"import sys; sys.path.insert(0, {_ROOT!r}); "
            f"from benchmarks.pacing import pace_sends; "
            f"pace_sends({url!r}, {stream!r}, {n!r}, {rate!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          timeout=RUN_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise BenchError("the latency run's producer process failed: "
                         + proc.stderr.decode(errors="replace")[-800:])
    return float(json.loads(proc.stdout.decode().strip().splitlines()[-1])["achieved_per_s"])


async def paced(worker: LatencyWorker, url: str, stream: str, n: int, rate: float) -> float:
    """Serve ``worker`` while a producer process offers ``rate`` jobs/s, until all ran;
    return the rate the producer achieved."""
    task = asyncio.create_task(worker.serve())
    try:
        await asyncio.sleep(0.3)  # let the worker create its group and block in XREADGROUP
        achieved = await asyncio.to_thread(_pace_in_child, url, stream, n, rate)
        deadline = time.monotonic() + RUN_TIMEOUT
        while worker.counts["acked"] < n:
            if task.done():
                task.result()
                raise BenchError("the worker stopped before every job was acknowledged")
            if time.monotonic() > deadline:
                raise BenchError(f"latency run stalled ({dict(worker.counts)})")
            await asyncio.sleep(0.01)
        return achieved
    finally:
        worker.stop()
        await task
