"""The scenarios: raw redis-py baselines and streamwork, each run timed against one Redis.

:class:`Harness` holds one connection to the Redis under test (private: it FLUSHALLs it
before every run) and runs each scenario once; :mod:`benchmarks.run` repeats them and
builds the result.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import redis

from benchmarks.accounting import Monitor
from benchmarks.measure import (
    BATCH,
    DONE_MS,
    GROUP,
    LEASE_MS,
    RUN_TIMEOUT,
    Params,
    Run,
    Span,
    frozen_gc,
    make_jobs,
    percentile,
    summary,
)
from benchmarks.pacing import paced
from benchmarks.workers import LatencyWorker, NoopWorker
from streamwork import Producer, StreamWorker
from streamwork._wire.codec import BODY_FIELD, encode_body
from streamwork._wire.keys import StreamKeys
from streamwork.errors import BenchError


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of a one-stream XREADGROUP reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(next(iter(reply.values()))[0])
    return list(reply[0][1])


class Harness:
    """One bench run against one Redis at ``url`` (private: the harness FLUSHALLs it)."""

    def __init__(self, url: str, port: int, params: Params, say: Callable[[str], None]) -> None:
        self.url = url
        self.port = port
        self.params = params
        self.say = say
        self.r = redis.Redis.from_url(url)  # bytes replies, hiredis parser when installed
        self._serial = 0
        self.last_stats: dict[str, int] = {}
        #: what a run sends (the scaling study changes these: payload sizes, big batches)
        self.make_jobs: Callable[[int], tuple[list[str], list[Any]]] = make_jobs
        self.batch = BATCH  #: jobs per pipeline / XREADGROUP COUNT / send_many call
        #: options of the no-op worker beyond concurrency, batch size and dedup
        self.worker_options: dict[str, Any] = {}
        self.producer_options: dict[str, Any] = {}  #: options of ``Producer.from_url``

    def close(self) -> None:
        self.r.close()

    def fresh_stream(self, what: str) -> str:
        """Empty the server and name a new stream (every run starts from the same state)."""
        self.r.flushall()
        self._serial += 1
        return f"bench-{what}-{self._serial}"

    def prefill(self, stream: str, keys: Sequence[str], payloads: Sequence[Any],
                group: bool) -> None:
        """Enqueue encoded jobs (untimed), and create the raw baselines' group."""
        step = self.batch
        for i in range(0, len(keys), step):
            pipe = self.r.pipeline(transaction=False)
            for key, payload in zip(keys[i : i + step], payloads[i : i + step], strict=True):
                pipe.xadd(stream, {BODY_FIELD: encode_body(key, payload)})
            pipe.execute()
        if group:
            self.r.xgroup_create(stream, GROUP, id="0")

    def repeat(self, what: str, once: Callable[[], Run]) -> dict[str, Any]:
        runs = []
        for i in range(self.params.repeats):
            run = once()
            self.say(f"{what} [{i + 1}/{self.params.repeats}]: {run.rate:,.0f} jobs/s")
            runs.append(run)
        return summary(runs)

    # ---- raw baselines ----

    def raw_xadd_once(self) -> Run:
        stream = self.fresh_stream("raw-xadd")
        keys, payloads = self.make_jobs(self.params.jobs)
        step = self.batch
        span = Span(self.r)
        span.start()
        for i in range(0, len(keys), step):
            pipe = self.r.pipeline(transaction=False)
            now = int(time.time() * 1000)
            for key, payload in zip(keys[i : i + step], payloads[i : i + step], strict=True):
                body = msgpack.packb({"v": 1, "k": key, "t": now, "h": {}, "p": payload})
                pipe.xadd(stream, {b"d": body})
            pipe.execute()
        return span.stop(len(keys))

    def raw_consume_once(self, account: bool = False) -> Run:
        """``account``: counts the run's commands into :attr:`last_stats` (every one of
        them sent by this client: one XREADGROUP and one XACK per batch)."""
        stream = self.fresh_stream("raw-consume")
        keys, payloads = self.make_jobs(self.params.jobs)
        self.prefill(stream, keys, payloads, group=True)
        if account:
            self.r.config_resetstat()
        r, left = self.r, len(keys)
        span = Span(r)
        span.start()
        while left > 0:
            entries = _entries(r.xreadgroup(GROUP, "c1", {stream: ">"}, count=self.batch))
            r.xack(stream, GROUP, *(entry_id for entry_id, _ in entries))
            left -= len(entries)
        run = span.stop(len(keys))
        if account:
            self.last_stats = self.commandstats()
        return run

    def raw_safety_once(self, account: bool = False) -> Run:
        stream = self.fresh_stream("raw-safety")
        keys, payloads = make_jobs(self.params.jobs)
        self.prefill(stream, keys, payloads, group=True)
        if account:
            self.r.config_resetstat()
        names = StreamKeys.for_stream(stream)
        r, left = self.r, len(keys)
        span = Span(r)
        span.start()
        while left > 0:
            entries = _entries(r.xreadgroup(GROUP, "c1", {stream: ">"}, count=BATCH))
            pipe = r.pipeline(transaction=False)
            token = uuid.uuid4().hex
            for entry_id, fields in entries:
                key = msgpack.unpackb(fields[b"d"])["k"]
                lock = f"{names.tag}:lock:{key}"  # the naive layout: a lock and a done key
                pipe.set(lock, token, nx=True, px=LEASE_MS)
                pipe.set(f"{names.tag}:done:{key}", token, px=DONE_MS)
                pipe.xack(stream, GROUP, entry_id)
                pipe.delete(lock)
            pipe.execute()
            left -= len(entries)
        run = span.stop(len(keys))
        if account:
            self.last_stats = self.commandstats()
        return run

    def commandstats(self) -> dict[str, int]:
        """Calls per command since the last CONFIG RESETSTAT."""
        return {name.removeprefix("cmdstat_"): int(stats["calls"])
                for name, stats in self.r.info("commandstats").items()}

    def wait_clients_gone(self, keep: int) -> None:
        """Wait (up to 2 s) until at most ``keep`` clients are connected."""
        deadline = time.monotonic() + 2
        while (int(self.r.info("clients")["connected_clients"]) > keep
               and time.monotonic() < deadline):
            time.sleep(0.01)

    # ---- streamwork ----

    def produce_once(self) -> Run:
        stream = self.fresh_stream("produce")
        keys, payloads = self.make_jobs(self.params.jobs)
        producer = Producer.from_url(self.url, **self.producer_options)
        try:
            producer.send_many(stream, payloads[:1], keys[:1])  # connect outside the timing
            self.r.delete(stream)
            span = Span(self.r)
            span.start()
            for i in range(0, len(keys), self.batch):
                producer.send_many(stream, payloads[i : i + self.batch],
                                   keys[i : i + self.batch])
            return span.stop(len(keys))
        finally:
            producer.close()

    def consume_once(self, dedup: bool, concurrency: int, batch_size: int,
                     monitor: bool = False, accounting: bool = False,
                     worker_cls: type[StreamWorker] = NoopWorker
                     ) -> tuple[Run, dict[str, Any]]:
        """Serve a prefilled stream with a no-op worker (or ``worker_cls``) until every job
        is acknowledged."""
        n = self.params.accounting_jobs if monitor or accounting else self.params.jobs
        stream = self.fresh_stream("consume-on" if dedup else "consume-off")
        keys, payloads = self.make_jobs(n)
        self.prefill(stream, keys, payloads, group=False)
        worker = worker_cls.from_url(self.url, stream=stream, group=GROUP, dedup=dedup,
                                     concurrency=concurrency, batch_size=batch_size,
                                     **self.worker_options)
        extra: dict[str, Any] = {}
        tally: Monitor | None = None
        marker = f"bench-end-{uuid.uuid4().hex}"
        self.wait_clients_gone(keep=1)
        used_before = int(self.r.info("memory")["used_memory"])
        self.r.config_resetstat()
        if monitor:
            tally = Monitor(self.port, marker, str(self.r.client_info()["addr"]))
            tally.start()
        # timed runs start at the join; counting runs (commands, memory) take every job
        with frozen_gc():
            run = asyncio.run(serve_until(worker, n, Span(self.r),
                                          from_join=not (monitor or accounting)))
        if tally is not None:
            self.r.echo(marker)
            tally.join(30)
            extra["client"] = dict(tally.client)
            extra["lua"] = dict(tally.lua)
        extra["commandstats"] = self.commandstats()
        self.wait_clients_gone(keep=1)
        extra["used_memory_delta"] = int(self.r.info("memory")["used_memory"]) - used_before
        extra["stream"] = stream
        extra["group"] = GROUP
        extra["counts"] = dict(worker.counts)
        return run, extra

    def consume_run(self, dedup: bool, concurrency: int, batch_size: int) -> Run:
        return self.consume_once(dedup, concurrency, batch_size)[0]

    def latency_once(self, dedup: bool, rate: float, concurrency: int,
                     batch_size: int, stream: str | None = None) -> dict[str, float]:
        """Enqueue -> handler start at a steady offered ``rate``; on a fresh server, or on
        ``stream`` as it is (the scaling study: behind a consumed backlog)."""
        n = max(50, round(rate * self.params.latency_seconds))
        if stream is None:
            stream = self.fresh_stream("latency-on" if dedup else "latency-off")
        worker = LatencyWorker.from_url(self.url, stream=stream, group=GROUP, dedup=dedup,
                                        concurrency=concurrency, batch_size=batch_size)
        with frozen_gc():
            achieved = asyncio.run(paced(worker, self.url, stream, n, rate))
        skip = len(worker.latencies) // 50  # the first 2 %: connections still warming up
        lat = sorted(worker.latencies[skip:])
        return {
            "p50_ms": round(percentile(lat, 0.50) * 1000, 3),
            "p99_ms": round(percentile(lat, 0.99) * 1000, 3),
            "max_ms": round(lat[-1] * 1000, 3) if lat else 0.0,
            "samples": len(lat),
            "achieved_per_s": round(achieved, 1),
        }


async def serve_until(worker: StreamWorker, n: int, span: Span,
                      from_join: bool = False) -> Run:
    """Time ``worker.serve()`` from its start until ``n`` jobs are acked; then stop it.
    ``from_join``: start the clock once the worker has joined its group (its start-up -
    connecting, creating the group, loading scripts - left out, as the raw loops' set-up
    is) and count only the jobs acked after that."""
    if not from_join:
        span.start()
    task = asyncio.create_task(worker.serve())
    base = 0
    try:
        if from_join:
            deadline = time.monotonic() + RUN_TIMEOUT
            while not worker.health().ready:
                if task.done():
                    task.result()
                    raise BenchError("the worker stopped before it joined its group")
                if time.monotonic() > deadline:
                    raise BenchError("the worker did not join its group")
                await asyncio.sleep(0.0005)
            base = worker.counts["acked"]
            span.start()
        while worker.counts["acked"] < n:
            if task.done():
                task.result()
                raise BenchError("the worker stopped before every job was acknowledged")
            if span.elapsed() > RUN_TIMEOUT:
                raise BenchError(f"stalled: {worker.counts['acked']}/{n} jobs acked "
                                 f"after {RUN_TIMEOUT:.0f} s ({dict(worker.counts)})")
            await asyncio.sleep(0.002)
        return span.stop(n - base)
    finally:
        worker.stop()
        await task

