"""Sections 1-3 of the scaling study, in this process on the harness's Redis: throughput
and latency against the backlog, streams served by one process, payload size. Each
throughput is given with its ratio to the raw redis-py loop run at the same point."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import msgpack

from benchmarks.harness import Harness
from benchmarks.measure import BATCH, GROUP, LOAD_FRACTION, RUN_TIMEOUT, Run, Span, make_jobs
from benchmarks.scaling.sizes import (
    BATCH_SIZE,
    CONCURRENCY,
    MAX_PAYLOAD_BYTES,
    PIPELINE_BYTES,
    ScalingSizes,
)
from benchmarks.workers import NoopWorker
from streamwork._hosting.multi import serve_all
from streamwork.errors import BenchError


def point(run: Run, base: Run | None = None) -> dict[str, Any]:
    """One measured point: jobs/s, the CPU shares, and the ratio to ``base`` if any."""
    row: dict[str, Any] = {
        "jobs": run.jobs, "seconds": round(run.seconds, 3), "jobs_per_s": round(run.rate, 1),
        "client_cpu_pct": round(100 * run.client_cpu / run.seconds, 1) if run.seconds else 0,
        "redis_cpu_pct": round(100 * run.redis_cpu / run.seconds, 1) if run.seconds else 0}
    if base is not None:
        row["ratio"] = round(run.rate / base.rate, 3) if base.rate > 0 else 0.0
    return row


def _sized(h: Harness, jobs: int) -> None:
    h.params = dataclasses.replace(h.params, jobs=jobs, accounting_jobs=min(jobs, 10_000))


# ---- 1. backlog ----

def backlog(h: Harness, sizes: ScalingSizes, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Per backlog size: drain it (raw XREADGROUP+XACK, then streamwork dedup off and on),
    then p99 enqueue -> handler start of fresh jobs at 20 % of the drain rate on that same
    stream (it still holds the backlog's entries, and with dedup on its done records)."""
    rows = []
    for n in sizes.backlogs:
        _sized(h, n)
        raw = h.raw_consume_once()
        row: dict[str, Any] = {"backlog": n, "raw_consume": point(raw)}
        say(f"backlog {n:,}: raw XREADGROUP+XACK {raw.rate:,.0f} jobs/s")
        for dedup in (False, True):
            mode = "dedup_on" if dedup else "dedup_off"
            run, extra = h.consume_once(dedup, CONCURRENCY, BATCH_SIZE)
            rate = max(10.0, LOAD_FRACTION * run.rate)
            lat = h.latency_once(dedup, rate, CONCURRENCY, BATCH_SIZE, stream=extra["stream"])
            row[mode] = {**point(run, raw), "latency": lat,
                         "stream_length": int(h.r.xlen(extra["stream"]))}
            say(f"backlog {n:,} {mode}: {run.rate:,.0f} jobs/s ({run.rate / raw.rate:.2f}x), "
                f"p99 {lat['p99_ms']} ms at {rate:,.0f} jobs/s")
        rows.append(row)
    return rows


# ---- 2. streams served by one process ----

def _prefill_streams(h: Harness, names: list[str], per: int, group_at: str | None) -> None:
    for name in names:
        keys, payloads = make_jobs(per)
        h.prefill(name, keys, payloads, group=False)
        if group_at is not None:
            h.r.xgroup_create(name, GROUP, id=group_at)


def _by_stream(reply: Any) -> list[tuple[Any, list[Any]]]:
    """(stream, entries) of a many-stream XREADGROUP reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(stream, value[0]) for stream, value in reply.items()]
    return [(stream, entries) for stream, entries in reply]


def raw_streams_once(h: Harness, names: list[str], per: int) -> Run:
    """The raw loop over many streams: one XREADGROUP of all of them (COUNT 500 each),
    then one XACK per stream that answered, pipelined."""
    h.r.flushall()
    _prefill_streams(h, names, per, group_at="0")
    r, left = h.r, per * len(names)
    span = Span(r)
    span.start()
    while left > 0:
        reply = r.xreadgroup(GROUP, "c1", {name: ">" for name in names}, count=BATCH)
        pipe = r.pipeline(transaction=False)
        for stream, entries in _by_stream(reply):
            pipe.xack(stream, GROUP, *(entry_id for entry_id, _ in entries))
            left -= len(entries)
        pipe.execute()
    return span.stop(per * len(names))


async def _serve_streams(h: Harness, names: list[str], total: int, dedup: bool,
                         idle_seconds: float, limit: float) -> dict[str, Any]:
    """Host a worker per stream with ``serve_all``; time them from one go (every group
    moved back to the start of its stream at once) until ``total`` jobs are acked or
    ``limit`` seconds passed; then watch the process idle."""
    workers = [NoopWorker.from_url(h.url, stream=name, group=GROUP, dedup=dedup,
                                   concurrency=CONCURRENCY, batch_size=BATCH_SIZE)
               for name in names]
    started = time.perf_counter()
    task = asyncio.create_task(serve_all(workers))
    try:
        while not all(w.health().ready for w in workers):
            if task.done():
                task.result()
                raise BenchError("the workers stopped before they all joined")
            if time.perf_counter() - started > RUN_TIMEOUT:
                raise BenchError("the workers did not all join their groups")
            await asyncio.sleep(0.02)
        joined = time.perf_counter() - started
        # every worker waits in XREADGROUP on a group set at the end of its stream; now
        # move every group back to the start and wake each read with one more job
        clients = int(h.r.info("clients")["connected_clients"])
        span = Span(h.r)
        span.start()
        pipe = h.r.pipeline(transaction=False)
        for name in names:
            pipe.xgroup_setid(name, GROUP, "0", entries_read=0)
        for name in names:
            pipe.xadd(name, {b"d": _wake_body()})
        pipe.execute()
        done = 0
        while done < total and span.elapsed() < limit:
            if task.done():
                task.result()
                raise BenchError("a worker stopped before every job was acknowledged")
            await asyncio.sleep(0.01)
            done = sum(w.counts["acked"] for w in workers)
        # past the time limit the row says how far it got (jobs acked so far / time)
        run = span.stop(done)
        idle = await _idle(h, idle_seconds)
    finally:
        for w in workers:
            w.stop()
        await task
    return {"run": run, "finished": done >= total, "jobs_sent": total,
            "join_seconds": round(joined, 2), "clients": clients, **idle}


@functools.cache
def _wake_body() -> bytes:
    from streamwork._wire.codec import encode_body

    return encode_body("wake", {"wake": True})


async def _idle(h: Harness, seconds: float) -> dict[str, Any]:
    """What the served process and Redis spend while there is no work at all, and how
    late the event loop runs a 10 ms timer meanwhile (a saturated loop is late)."""
    h.r.config_resetstat()
    span = Span(h.r)
    span.start()
    lags: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append(time.perf_counter() - t - 0.01)
    run = span.stop(0)
    stats = h.r.info("commandstats")
    calls = sum(int(s["calls"]) for s in stats.values())
    scripts = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    lags.sort()
    return {"idle_client_cpu_pct": round(100 * run.client_cpu / run.seconds, 1),
            "idle_redis_cpu_pct": round(100 * run.redis_cpu / run.seconds, 1),
            "idle_commands_per_s": round(calls / run.seconds, 1),  # also those in scripts
            "idle_script_calls_per_s": round(scripts / run.seconds, 1),
            "idle_loop_lag_ms_p50": round(1000 * lags[len(lags) // 2], 1),
            "idle_loop_lag_ms_max": round(1000 * lags[-1], 1)}


def streams(h: Harness, sizes: ScalingSizes, say: Callable[[str], None]
            ) -> list[dict[str, Any]]:
    """The same jobs spread over 1..N streams, one worker per stream hosted in this one
    process (streamwork's multi-worker hosting, as ``streamwork run a:A b:B`` does)."""
    rows = []
    for count in sizes.stream_counts:
        per = max(1, sizes.streams_jobs // count)
        names = [f"scale-{count}-{i}" for i in range(count)]
        raw = raw_streams_once(h, names, per)
        h.r.flushall()
        _prefill_streams(h, names, per, group_at="$")
        got = asyncio.run(_serve_streams(h, names, (per + 1) * count, True,
                                         sizes.idle_seconds, sizes.streams_limit))
        run = got.pop("run")
        row = {"streams": count, "jobs_per_stream": per, "raw_consume": point(raw),
               "dedup_on": {**point(run, raw), **got}}
        say(f"{count} streams: {run.rate:,.0f} jobs/s ({run.rate / raw.rate:.2f}x raw "
            f"{raw.rate:,.0f}), joined in {got['join_seconds']} s, idle "
            f"{got['idle_commands_per_s']:,.0f} Redis commands/s, "
            f"{got['idle_client_cpu_pct']}% CPU")
        rows.append(row)
    return rows


# ---- 3. payload size ----

def _payload_jobs(size: int) -> Callable[[int], tuple[list[str], list[Any]]]:
    def jobs(n: int) -> tuple[list[str], list[Any]]:
        keys, _ = make_jobs(n)
        pad = "x" * max(0, size - 24)
        return keys, [{"order": i, "blob": pad} for i in range(n)]
    return jobs


def payloads(h: Harness, sizes: ScalingSizes, say: Callable[[str], None]
             ) -> list[dict[str, Any]]:
    """Produce and consume at each payload size: jobs/s and MB/s of payload."""
    rows = []
    keep = (h.make_jobs, h.batch, h.worker_options, h.producer_options)
    try:
        for size, jobs in sizes.payloads:
            _sized(h, jobs)
            h.make_jobs = _payload_jobs(size)
            body = len(msgpack.packb(h.make_jobs(1)[1][0]))
            h.batch = max(1, min(BATCH, PIPELINE_BYTES // body))
            h.worker_options = {"max_payload_bytes": MAX_PAYLOAD_BYTES}
            h.producer_options = {"max_payload_bytes": MAX_PAYLOAD_BYTES}
            batch_size = min(BATCH_SIZE, h.batch)
            raw_x, prod = h.raw_xadd_once(), h.produce_once()
            raw_c = h.raw_consume_once()
            off = h.consume_run(False, CONCURRENCY, batch_size)
            on = h.consume_run(True, CONCURRENCY, batch_size)
            row: dict[str, Any] = {"payload_bytes": body, "jobs": jobs, "batch": h.batch,
                                   "worker_batch_size": batch_size}
            for key, run, base in (("raw_xadd", raw_x, None), ("produce", prod, raw_x),
                                   ("raw_consume", raw_c, None), ("dedup_off", off, raw_c),
                                   ("dedup_on", on, raw_c)):
                row[key] = {**point(run, base), "mb_per_s": round(run.rate * body / 1e6, 1)}
            say(f"payload {body:,} B: produce {prod.rate:,.0f} jobs/s "
                f"({row['produce'].get('ratio')}x), consume off {off.rate:,.0f} "
                f"({row['dedup_off'].get('ratio')}x), on {on.rate:,.0f} jobs/s")
            rows.append(row)
    finally:
        h.make_jobs, h.batch, h.worker_options, h.producer_options = keep
    return rows
