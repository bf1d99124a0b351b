"""Section 5 (Redis memory per done record, pending entry and dead letter) and section 6
(the retention trimmer's step on a long stream: its time, its bounded calls, and the longest
Redis block)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from benchmarks.accounting import done_marker_memory
from benchmarks.harness import Harness, _entries
from benchmarks.measure import GROUP, Span, make_jobs
from benchmarks.scaling.load import _sized
from benchmarks.scaling.procs import prefill
from benchmarks.scaling.sizes import BATCH_SIZE, CONCURRENCY, ScalingSizes
from benchmarks.workers import DeadLetterWorker
from streamwork._redis import scripts
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.loops.trimming import MAX_TRIM_CALLS, TRIM_CHUNK

#: SLOWLOG threshold of the trimmer run (microseconds): every command longer is logged
SLOWLOG_US = 100


def _used(h: Harness) -> int:
    h.wait_clients_gone(keep=1)
    return int(h.r.info("memory")["used_memory"])


def done_records(h: Harness, sizes: ScalingSizes) -> dict[str, Any]:
    """Done records of a dedup-on run: MEMORY USAGE samples and used_memory growth (the
    bench's own accounting run)."""
    _sized(h, sizes.memory_jobs)
    run, extra = h.consume_once(True, CONCURRENCY, BATCH_SIZE, accounting=True)
    mem = done_marker_memory(h.r, extra, run.jobs)
    return {"count": mem["markers"], "memory_usage_bytes_each": mem["memory_usage_bytes"],
            "used_memory_bytes_each": mem["used_memory_bytes_per_marker"]}


def pending_entries(h: Harness, sizes: ScalingSizes) -> dict[str, Any]:
    """Entries delivered and not acknowledged: the group's and the consumer's pending
    lists grow by one entry each (read with raw XREADGROUP, no XACK)."""
    n = sizes.memory_jobs
    stream = h.fresh_stream("pending")
    keys, payloads = make_jobs(n)
    h.prefill(stream, keys, payloads, group=True)
    before, usage0 = _used(h), int(h.r.memory_usage(stream, samples=0) or 0)
    left = n
    while left > 0:
        left -= len(_entries(h.r.xreadgroup(GROUP, "c1", {stream: ">"}, count=1000)))
    after, usage1 = _used(h), int(h.r.memory_usage(stream, samples=0) or 0)
    assert int(h.r.xpending(stream, GROUP)["pending"]) == n
    return {"count": n, "used_memory_bytes_each": round((after - before) / n, 1),
            "memory_usage_bytes_each": round((usage1 - usage0) / n, 1)}


def dead_letters(h: Harness, sizes: ScalingSizes) -> dict[str, Any]:
    """Jobs whose handler raised DeadLetter (dedup on): the dead-letter stream's entry, and
    the growth of used_memory (also the job records the dead letters leave)."""
    n = sizes.memory_jobs
    stream = h.fresh_stream("dead")
    keys, payloads = make_jobs(n)
    h.prefill(stream, keys, payloads, group=False)
    worker = DeadLetterWorker.from_url(h.url, stream=stream, group=GROUP,
                                       concurrency=CONCURRENCY, batch_size=BATCH_SIZE)
    before = _used(h)
    asyncio.run(_serve_dead(worker, n, h))
    after = _used(h)
    dead = StreamKeys.for_stream(stream).dead
    count = int(h.r.xlen(dead))
    usage = int(h.r.memory_usage(dead, samples=0) or 0)
    prefix = StreamKeys.for_stream(stream).group(GROUP).job_prefix
    records = int(h.r.eval("return #redis.call('KEYS', ARGV[1])", 0, prefix + "*"))
    return {"count": count, "memory_usage_bytes_each": round(usage / max(count, 1), 1),
            "used_memory_bytes_each": round((after - before) / max(count, 1), 1),
            "job_records_left": records}


async def _serve_dead(worker: DeadLetterWorker, n: int, h: Harness) -> None:
    task = asyncio.create_task(worker.serve())
    try:
        while worker.counts["dead_lettered"] < n:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
    finally:
        worker.stop()
        await task


def memory(h: Harness, sizes: ScalingSizes, say: Callable[[str], None]) -> dict[str, Any]:
    got = {"done_record": done_records(h, sizes), "pending_entry": pending_entries(h, sizes),
           "dead_letter": dead_letters(h, sizes)}
    for what, row in got.items():
        say(f"memory per {what.replace('_', ' ')}: {row['used_memory_bytes_each']} B of "
            f"used_memory ({row['count']:,} sampled)")
    return got


# ---- 6. the retention trimmer ----

def trim_once(h: Harness, entries: int) -> dict[str, Any]:
    """A stream of ``entries`` jobs, all read and acknowledged, then one step of the
    trimmer as the upkeep loop runs it (trim.lua in calls of at most ``TRIM_CHUNK``
    entries, until it says nothing is left) with a cutoff after the last one: the step's
    wall time, its calls, the longest call, and the longest command in SLOWLOG."""
    stream = h.fresh_stream("trim")
    prefill(h, stream, entries)  # the group starts at the end: every entry is done with
    used0 = int(h.r.info("memory")["used_memory"])
    old: dict[Any, Any] = dict(h.r.config_get("slowlog-*"))
    h.r.config_set("slowlog-log-slower-than", SLOWLOG_US)
    h.r.config_set("slowlog-max-len", 1024)
    registry = scripts.SyncScripts(h.r)
    registry.run(scripts.trim("absent-stream", 0, TRIM_CHUNK))  # load it outside the timing
    h.r.slowlog_reset()
    cutoff = int(time.time() * 1000) + 1000
    calls: list[float] = []
    trimmed = 0
    span = Span(h.r)
    span.start()
    for _ in range(MAX_TRIM_CALLS):  # the loop of trimming.trim_stream, each call timed
        t = time.perf_counter()
        removed, more = registry.run(scripts.trim(stream, cutoff, TRIM_CHUNK))
        calls.append(time.perf_counter() - t)
        trimmed += int(removed)
        if not int(more):
            break
    run = span.stop(trimmed)
    log = h.r.slowlog_get(1024)
    for key, value in old.items():
        h.r.config_set(key, value)
    longest = max(log, key=lambda e: int(e["duration"])) if log else None
    return {
        "entries": entries, "trimmed": trimmed, "step_ms": round(run.seconds * 1000, 2),
        "calls": len(calls), "chunk": TRIM_CHUNK,
        "longest_call_ms": round(max(calls) * 1000, 2),
        "longest_block_ms": round(int(longest["duration"]) / 1000, 2) if longest else 0.0,
        "longest_command": (longest["command"][:60].decode(errors="replace")
                            if longest else ""),
        "slowlog_entries": len(log), "freed_bytes": used0 - int(h.r.info("memory")["used_memory"]),
        "ns_per_entry": round(1e9 * run.seconds / max(trimmed, 1), 1),
    }


def trimmer(h: Harness, sizes: ScalingSizes, say: Callable[[str], None]
            ) -> list[dict[str, Any]]:
    rows = []
    for entries in sizes.trim_sizes:
        row = trim_once(h, entries)
        say(f"trim {entries:,} entries: step {row['step_ms']} ms in {row['calls']} calls, "
            f"longest call {row['longest_call_ms']} ms, longest Redis block "
            f"{row['longest_block_ms']} ms ({row['longest_command'][:30]})")
        rows.append(row)
    return rows


