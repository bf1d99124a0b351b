"""The benchmark harness: streamwork against the raw redis-py limit, in one run (issue 5).

``streamwork bench`` and ``python -m benchmarks`` both run :func:`run_bench`. One run starts
one private redis-server on a free loopback port and measures, each as the median of
``repeats`` runs:

* raw redis-py baselines (sync ``redis.Redis``, hiredis parser, bytes replies):
  ``raw_xadd`` pipelined XADD of MessagePack bodies, 500 per pipeline; ``raw_consume``
  XREADGROUP COUNT 500 plus one XACK per batch; ``raw_safety`` the naive safety loop: per
  message SET NX PX lock, SET PX done, XACK, DEL lock, pipelined per batch of 500;
* streamwork: ``produce`` (``Producer.send_many``, 500 per call), ``consume_dedup_off`` and
  ``consume_dedup_on`` (a no-op async ``StreamWorker`` served in-process, over a sweep of
  concurrency x batch_size; the best setting is reported), and ``latency``
  (enqueue -> handler start at a steady offered load of 20 % of the dedup-off maximum);
* Redis commands per job (INFO commandstats, and MONITOR to tell the commands a client sent
  from those run inside scripts) and Redis memory per done-marker.

Figures are benchmark figures, not guarantees: they depend on the machine and its load.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import importlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import click
import msgpack
import redis
from rich.console import Console
from rich.table import Table

from .codec import BODY_FIELD, encode_body
from .errors import StreamworkError
from .keys import StreamKeys
from .message import Message
from .producer import Producer
from .server import RedisServer
from .worker import StreamWorker

__all__ = ["BenchError", "Params", "bench_command", "register", "render", "run_bench"]

BATCH: Final = 500  #: jobs per pipeline / XREADGROUP COUNT / send_many call of the baselines
GROUP: Final = "bench"
LEASE_MS: Final = 30_000  #: lease TTL of the naive safety loop (streamwork's default)
DONE_MS: Final = 3_600_000  #: done-marker TTL of the naive safety loop (streamwork's default)
LOAD_FRACTION: Final = 0.2  #: offered load of the latency run, as a fraction of the max
RUN_TIMEOUT: Final = 300.0  #: seconds one consume run may take before the bench gives up
#: (concurrency, batch_size) pairs the consume scenarios try; a worker holds at most
#: 2 x concurrency deliveries, so a read returns at most min(batch_size, 2 x concurrency)
FULL_SWEEP: Final = ((16, 100), (64, 100), (64, 500), (256, 100), (256, 500), (1024, 100),
                     (1024, 500))
QUICK_SWEEP: Final = ((16, 100), (64, 500))
#: commands the harness itself sends while it watches a worker (not counted)
_OWN_COMMANDS: Final = frozenset({"info", "echo", "config|resetstat", "monitor", "client|info"})
#: client commands that are a round trip of the consume hot path
_ROUND_TRIPS: Final = ("evalsha", "eval", "xreadgroup", "xautoclaim", "xack")

GOALS: Final = (
    # name, scenario key, comparison, target
    ("produce >= 0.8x raw pipelined XADD", "produce.ratio", ">=", 0.8),
    ("consume dedup off >= 0.4x raw XREADGROUP+XACK", "consume_dedup_off.ratio", ">=", 0.4),
    ("consume dedup on >= 1.5x naive safety loop", "consume_dedup_on.ratio", ">=", 1.5),
    ("dedup on <= 3 Redis commands/job (all, incl. inside scripts)",
     "commands.dedup_on.total_per_job", "<=", 3.0),
    ("dedup on <= 3 Redis commands/job (client round trips)",
     "commands.dedup_on.round_trips_per_job", "<=", 3.0),
    ("p99 enqueue->start <= 5 ms at steady load (dedup on)",
     "latency.dedup_on.p99_ms", "<=", 5.0),
)


class BenchError(StreamworkError):
    """The benchmark could not complete (a run stalled, a dependency is missing)."""


@dataclass(frozen=True, slots=True)
class Params:
    """What one bench run measures; :meth:`make` fills in the defaults."""

    jobs: int
    repeats: int
    quick: bool
    sweep: tuple[tuple[int, int], ...]
    latency_seconds: float
    accounting_jobs: int

    @classmethod
    def make(cls, *, jobs: int | None = None, repeats: int = 3, quick: bool = False) -> Params:
        if repeats < 1:
            raise BenchError("--repeats must be >= 1")
        n = jobs if jobs is not None else (600 if quick else 20_000)
        if n < 1:
            raise BenchError("--jobs must be >= 1")
        return cls(
            jobs=n,
            repeats=repeats,
            quick=quick,
            sweep=QUICK_SWEEP if quick else FULL_SWEEP,
            latency_seconds=0.5 if quick else 4.0,
            accounting_jobs=min(n, 10_000),
        )


@dataclass(frozen=True, slots=True)
class Run:
    """One timed run: wall time and the CPU both sides spent in it."""

    jobs: int
    seconds: float
    client_cpu: float  # CPU seconds of this process (all threads)
    redis_cpu: float  # CPU seconds of redis-server

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


class _Span:
    """Measures wall time, this process's CPU and redis-server's CPU of a timed section."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._t = self._cpu = self._rcpu = 0.0

    def start(self) -> None:
        self._rcpu = _redis_cpu(self.r)
        self._cpu = time.process_time()
        self._t = time.perf_counter()

    def stop(self, jobs: int) -> Run:
        seconds = time.perf_counter() - self._t
        cpu = time.process_time() - self._cpu
        return Run(jobs, seconds, cpu, _redis_cpu(self.r) - self._rcpu)


def _redis_cpu(r: redis.Redis) -> float:
    info: dict[str, Any] = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _summary(runs: Sequence[Run]) -> dict[str, Any]:
    """The median rate, every run's rate, and the CPU shares of the median run."""
    ordered = sorted(runs, key=lambda r: r.rate)
    mid = ordered[(len(ordered) - 1) // 2]
    return {
        "jobs_per_s": round(statistics.median(r.rate for r in runs), 1),
        "runs_jobs_per_s": [round(r.rate, 1) for r in runs],
        "jobs": mid.jobs,
        "client_cpu_pct": round(100 * mid.client_cpu / mid.seconds, 1),
        "redis_cpu_pct": round(100 * mid.redis_cpu / mid.seconds, 1),
    }


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---- workers ---------------------------------------------------------------------------


class NoopWorker(StreamWorker):
    """A worker whose handler does nothing: the cost measured is streamwork's own."""

    stream = "bench"
    group = GROUP

    async def handle(self, msg: Message) -> None:
        return None


class LatencyWorker(StreamWorker):
    """Records enqueue -> handler start (seconds) of every job it runs."""

    stream = "bench"
    group = GROUP

    def __init__(self, url: str | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self.latencies: list[float] = []

    async def handle(self, msg: Message) -> None:
        self.latencies.append(time.time() - msg.enqueued_at)


# ---- MONITOR tally -----------------------------------------------------------------------


class _Monitor(threading.Thread):
    """Counts commands by name through MONITOR, split into client-sent and run by Lua.

    Runs until it sees ``ECHO <marker>``; lines from ``skip_addr`` (the harness's own
    connection) are ignored."""

    def __init__(self, port: int, marker: str, skip_addr: str) -> None:
        super().__init__(name="bench-monitor", daemon=True)
        self.client: Counter[str] = Counter()
        self.lua: Counter[str] = Counter()
        self._marker = marker.encode()
        self._skip = skip_addr.encode()
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self._sock.sendall(b"MONITOR\r\n")
        reply = self._sock.recv(5)
        if not reply.startswith(b"+OK"):
            raise BenchError(f"MONITOR refused: {reply!r}")

    def run(self) -> None:
        buf = b""
        try:
            while True:
                chunk = self._sock.recv(1 << 20)
                if not chunk:
                    return
                *lines, buf = (buf + chunk).split(b"\r\n")
                for line in lines:
                    if self._count(line):
                        return
        finally:
            self._sock.close()

    def _count(self, line: bytes) -> bool:
        opened, closed = line.find(b"["), line.find(b'] "')
        if opened < 0 or closed < 0:
            return False
        source = line[opened + 1 : closed].split(b" ")[-1]
        end = line.find(b'"', closed + 3)
        name = line[closed + 3 : end].decode(errors="replace").lower()
        if source == b"lua":
            self.lua[name] += 1
        elif source == self._skip:
            return name == "echo" and self._marker in line
        else:
            self.client[name] += 1
        return False


# ---- the harness ---------------------------------------------------------------------------


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The entries of a one-stream XREADGROUP reply (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(next(iter(reply.values()))[0])
    return list(reply[0][1])


def _jobs(n: int) -> tuple[list[str], list[dict[str, Any]]]:
    """n job keys (uuid4 hex, as the producer's default) and small payloads."""
    keys = [uuid.uuid4().hex for _ in range(n)]
    payloads: list[dict[str, Any]] = [
        {"order": i, "amount_cents": 1999, "currency": "EUR"} for i in range(n)
    ]
    return keys, payloads


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
        for i in range(0, len(keys), BATCH):
            pipe = self.r.pipeline(transaction=False)
            for key, payload in zip(keys[i : i + BATCH], payloads[i : i + BATCH], strict=True):
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
        return _summary(runs)

    # ---- raw baselines ----

    def raw_xadd_once(self) -> Run:
        stream = self.fresh_stream("raw-xadd")
        keys, payloads = _jobs(self.params.jobs)
        span = _Span(self.r)
        span.start()
        for i in range(0, len(keys), BATCH):
            pipe = self.r.pipeline(transaction=False)
            now = int(time.time() * 1000)
            for key, payload in zip(keys[i : i + BATCH], payloads[i : i + BATCH], strict=True):
                body = msgpack.packb({"v": 1, "k": key, "t": now, "h": {}, "p": payload})
                pipe.xadd(stream, {b"d": body})
            pipe.execute()
        return span.stop(len(keys))

    def raw_consume_once(self) -> Run:
        stream = self.fresh_stream("raw-consume")
        keys, payloads = _jobs(self.params.jobs)
        self.prefill(stream, keys, payloads, group=True)
        r, left = self.r, len(keys)
        span = _Span(r)
        span.start()
        while left > 0:
            entries = _entries(r.xreadgroup(GROUP, "c1", {stream: ">"}, count=BATCH))
            r.xack(stream, GROUP, *(entry_id for entry_id, _ in entries))
            left -= len(entries)
        return span.stop(len(keys))

    def raw_safety_once(self, account: bool = False) -> Run:
        stream = self.fresh_stream("raw-safety")
        keys, payloads = _jobs(self.params.jobs)
        self.prefill(stream, keys, payloads, group=True)
        if account:
            self.r.config_resetstat()
        names = StreamKeys.for_stream(stream)
        r, left = self.r, len(keys)
        span = _Span(r)
        span.start()
        while left > 0:
            entries = _entries(r.xreadgroup(GROUP, "c1", {stream: ">"}, count=BATCH))
            pipe = r.pipeline(transaction=False)
            token = uuid.uuid4().hex
            for entry_id, fields in entries:
                key = msgpack.unpackb(fields[b"d"])["k"]
                lock = names.lock(key)
                pipe.set(lock, token, nx=True, px=LEASE_MS)
                pipe.set(names.done(key), token, px=DONE_MS)
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
        keys, payloads = _jobs(self.params.jobs)
        producer = Producer.from_url(self.url)
        try:
            producer.send_many(stream, payloads[:1], keys[:1])  # connect outside the timing
            self.r.delete(stream)
            span = _Span(self.r)
            span.start()
            for i in range(0, len(keys), BATCH):
                producer.send_many(stream, payloads[i : i + BATCH], keys[i : i + BATCH])
            return span.stop(len(keys))
        finally:
            producer.close()

    def consume_once(self, dedup: bool, concurrency: int, batch_size: int,
                     monitor: bool = False, accounting: bool = False
                     ) -> tuple[Run, dict[str, Any]]:
        """Serve a prefilled stream with a no-op worker until every job is acknowledged."""
        n = self.params.accounting_jobs if monitor or accounting else self.params.jobs
        stream = self.fresh_stream("consume-on" if dedup else "consume-off")
        keys, payloads = _jobs(n)
        self.prefill(stream, keys, payloads, group=False)
        worker = NoopWorker.from_url(self.url, stream=stream, group=GROUP, dedup=dedup,
                                     concurrency=concurrency, batch_size=batch_size)
        extra: dict[str, Any] = {}
        tally: _Monitor | None = None
        marker = f"bench-end-{uuid.uuid4().hex}"
        self.wait_clients_gone(keep=1)
        used_before = int(self.r.info("memory")["used_memory"])
        self.r.config_resetstat()
        if monitor:
            tally = _Monitor(self.port, marker, str(self.r.client_info()["addr"]))
            tally.start()
        run = asyncio.run(_serve_until(worker, n, _Span(self.r)))
        if tally is not None:
            self.r.echo(marker)
            tally.join(30)
            extra["client"] = dict(tally.client)
            extra["lua"] = dict(tally.lua)
        extra["commandstats"] = self.commandstats()
        self.wait_clients_gone(keep=1)
        extra["used_memory_delta"] = int(self.r.info("memory")["used_memory"]) - used_before
        extra["stream"] = stream
        extra["counts"] = dict(worker.counts)
        return run, extra

    def consume_run(self, dedup: bool, concurrency: int, batch_size: int) -> Run:
        return self.consume_once(dedup, concurrency, batch_size)[0]

    def latency_once(self, dedup: bool, rate: float, concurrency: int,
                     batch_size: int) -> dict[str, float]:
        n = max(50, round(rate * self.params.latency_seconds))
        stream = self.fresh_stream("latency-on" if dedup else "latency-off")
        worker = LatencyWorker.from_url(self.url, stream=stream, group=GROUP, dedup=dedup,
                                        concurrency=concurrency, batch_size=batch_size)
        achieved = asyncio.run(_paced(worker, self.url, stream, n, rate))
        skip = len(worker.latencies) // 50  # the first 2 %: connections still warming up
        lat = sorted(worker.latencies[skip:])
        return {
            "p50_ms": round(_percentile(lat, 0.50) * 1000, 3),
            "p99_ms": round(_percentile(lat, 0.99) * 1000, 3),
            "max_ms": round(lat[-1] * 1000, 3) if lat else 0.0,
            "samples": len(lat),
            "achieved_per_s": round(achieved, 1),
        }


async def _serve_until(worker: StreamWorker, n: int, span: _Span) -> Run:
    """Time ``worker.serve()`` from its start until ``n`` jobs are acked; then stop it."""
    span.start()
    task = asyncio.create_task(worker.serve())
    try:
        while worker.counts["acked"] < n:
            if task.done():
                task.result()
                raise BenchError("the worker stopped before every job was acknowledged")
            if time.perf_counter() - span._t > RUN_TIMEOUT:
                raise BenchError(f"stalled: {worker.counts['acked']}/{n} jobs acked "
                                 f"after {RUN_TIMEOUT:.0f} s ({dict(worker.counts)})")
            await asyncio.sleep(0.002)
        return span.stop(n)
    finally:
        worker.stop()
        await task


def _pace_sends(url: str, stream: str, n: int, rate: float) -> None:
    """Offer n jobs at a steady ``rate``: each job is sent when it falls due, alone with
    ``send`` or, when the loop woke late and several are due, together with ``send_many``
    (one Python process cannot do ~10k single round trips/s on a small machine). Prints
    the achieved rate as JSON."""
    keys, payloads = _jobs(n)
    producer = Producer.from_url(url)
    try:
        start = time.perf_counter()
        sent = 0
        while sent < n:
            now = time.perf_counter()
            due = min(n, int((now - start) * rate) + 1)
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
    """Run :func:`_pace_sends` in a child Python process, so the producer's CPU, GIL and
    objects do not disturb the worker being measured (producers are other processes in
    production too); return the rate it achieved."""
    code = (f"from streamwork.bench import _pace_sends; "
            f"_pace_sends({url!r}, {stream!r}, {n!r}, {rate!r})")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          timeout=RUN_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise BenchError("the latency run's producer process failed: "
                         + proc.stderr.decode(errors="replace")[-800:])
    return float(json.loads(proc.stdout.decode().strip().splitlines()[-1])["achieved_per_s"])


async def _paced(worker: LatencyWorker, url: str, stream: str, n: int, rate: float) -> float:
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


def _commands(extra: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Commands per job of one accounting run, from commandstats and MONITOR."""
    stats = {k: v for k, v in extra["commandstats"].items() if k not in _OWN_COMMANDS}
    client = {k: v for k, v in extra.get("client", {}).items() if k not in _OWN_COMMANDS}
    total = sum(stats.values())
    trips = sum(client.get(name, 0) for name in _ROUND_TRIPS)
    return {
        "jobs": jobs,
        "total_per_job": round(total / jobs, 3),
        "round_trips_per_job": round(trips / jobs, 4),
        "client_commands_per_job": round(sum(client.values()) / jobs, 4),
        "inside_scripts_per_job": round(sum(extra.get("lua", {}).values()) / jobs, 3),
        "by_command": dict(sorted(stats.items(), key=lambda kv: -kv[1])),
        "client_by_command": dict(sorted(client.items(), key=lambda kv: -kv[1])),
    }


def _ratio(value: float, baseline: float) -> float:
    return round(value / baseline, 3) if baseline > 0 else 0.0


def _lookup(result: dict[str, Any], path: str) -> float | None:
    node: Any = result["scenarios"] if not path.startswith(("commands", "memory")) else result
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, (int, float)) else None


def _goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    goals = []
    for name, path, op, target in GOALS:
        value = _lookup(result, path)
        ok = value is not None and (value >= target if op == ">=" else value <= target)
        goals.append({"goal": name, "measured": value, "op": op, "target": target,
                      "pass": ok})
    return goals


def _machine(r: redis.Redis) -> dict[str, Any]:
    server: dict[str, Any] = r.info("server")
    try:
        import hiredis  # noqa: F401

        parser = "hiredis"
    except ImportError:  # pragma: no cover - hiredis is a dependency
        parser = "python"
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": str(server.get("redis_version", "?")),
        "redis_py": redis.__version__,
        "parser": parser,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def run_bench(params: Params, say: Callable[[str], None] = lambda _: None,
              url: str | None = None) -> dict[str, Any]:
    """Run every scenario and return the machine-readable result.

    Starts (and at the end stops) a private redis-server, unless ``url`` names a loopback
    server (``redis://127.0.0.1:PORT/0``) that the harness may FLUSHALL and MONITOR."""
    with _server(url) as (server_url, port):
        h = Harness(server_url, port, params, say)
        try:
            return _run(h, params, say)
        finally:
            h.close()


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[tuple[str, int]]:
    if url is not None:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        yield url, port
        return
    server = RedisServer()
    try:
        server.start()
        yield server.url, server.port
    finally:
        server.close()


def _run(h: Harness, params: Params, say: Callable[[str], None]) -> dict[str, Any]:
    started = time.time()
    result: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "machine": _machine(h.r),
        "params": {"jobs": params.jobs, "repeats": params.repeats, "quick": params.quick,
                   "batch": BATCH, "sweep": [list(s) for s in params.sweep],
                   "latency_seconds": params.latency_seconds,
                   "load_fraction": LOAD_FRACTION},
    }
    sc: dict[str, Any] = {}
    result["scenarios"] = sc
    sc["raw_xadd"] = h.repeat("raw XADD", h.raw_xadd_once)
    sc["raw_consume"] = h.repeat("raw XREADGROUP+XACK", h.raw_consume_once)
    sc["raw_safety"] = h.repeat("raw naive safety loop", h.raw_safety_once)
    produce = h.repeat("produce", h.produce_once)
    sc["produce"] = {**produce, "baseline": "raw_xadd",
                     "ratio": _ratio(produce["jobs_per_s"], sc["raw_xadd"]["jobs_per_s"])}

    for dedup, key, base in ((False, "consume_dedup_off", "raw_consume"),
                             (True, "consume_dedup_on", "raw_safety")):
        sweep = []
        for conc, batch in params.sweep:
            label = f"consume dedup {'on' if dedup else 'off'} c={conc} b={batch}"
            summary = h.repeat(label, functools.partial(h.consume_run, dedup, conc, batch))
            sweep.append({"concurrency": conc, "batch_size": batch, **summary})
        best = max(sweep, key=lambda s: s["jobs_per_s"])
        sc[key] = {**best, "baseline": base,
                   "ratio": _ratio(best["jobs_per_s"], sc[base]["jobs_per_s"]),
                   "sweep": sweep}

    best_off = sc["consume_dedup_off"]
    rate = max(10.0, LOAD_FRACTION * best_off["jobs_per_s"])
    latency: dict[str, Any] = {"offered_per_s": round(rate, 1)}
    for dedup in (False, True):
        best = sc["consume_dedup_on" if dedup else "consume_dedup_off"]
        runs = []
        for i in range(params.repeats):
            one = h.latency_once(dedup, rate, best["concurrency"], best["batch_size"])
            say(f"latency dedup {'on' if dedup else 'off'} at {rate:,.0f} jobs/s "
                f"[{i + 1}/{params.repeats}]: p50 {one['p50_ms']} ms, p99 {one['p99_ms']} ms")
            runs.append(one)
        latency["dedup_on" if dedup else "dedup_off"] = {
            "p50_ms": statistics.median(x["p50_ms"] for x in runs),
            "p99_ms": statistics.median(x["p99_ms"] for x in runs),
            "max_ms": max(x["max_ms"] for x in runs),
            "samples": sum(int(x["samples"]) for x in runs),
            "runs_p99_ms": [x["p99_ms"] for x in runs],
            "achieved_per_s": statistics.median(x["achieved_per_s"] for x in runs),
        }
    sc["latency"] = latency

    commands: dict[str, Any] = {}
    for dedup in (False, True):
        mode = "dedup_on" if dedup else "dedup_off"
        best = sc["consume_" + mode]
        run, extra = h.consume_once(dedup, best["concurrency"], best["batch_size"], monitor=True)
        commands[mode] = _commands(extra, run.jobs)
        say(f"commands/job {mode}: {commands[mode]['total_per_job']} in all, "
            f"{commands[mode]['round_trips_per_job']} client round trips")
    h.raw_safety_once(account=True)  # every command of the naive loop is sent by the client
    commands["raw_safety"] = _commands(
        {"commandstats": h.last_stats, "client": h.last_stats}, params.jobs)
    # pipelined: one XREADGROUP and one pipeline (4 commands per job) per batch
    commands["raw_safety"]["round_trips_per_job"] = round(
        2 * h.last_stats.get("xreadgroup", 0) / params.jobs, 4)
    best = sc["consume_dedup_on"]
    run, extra = h.consume_once(True, best["concurrency"], best["batch_size"], accounting=True)
    memory = _done_marker_memory(h, extra, run.jobs)
    say(f"done-marker: {memory['memory_usage_bytes']} bytes (MEMORY USAGE), "
        f"{memory['used_memory_bytes_per_marker']} bytes of used_memory")
    result["commands"] = commands
    result["memory"] = memory
    result["goals"] = _goals(result)
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.time() - started, 1)
    return result


def _done_marker_memory(h: Harness, extra: dict[str, Any], jobs: int) -> dict[str, Any]:
    """MEMORY USAGE of sampled done-markers, and the used_memory growth per 10k markers."""
    prefix = StreamKeys.for_stream(extra["stream"]).done_prefix
    sample: list[bytes] = []
    for key in h.r.scan_iter(match=prefix + "*", count=1000):
        sample.append(key)
        if len(sample) >= 200:
            break
    sizes = [int(h.r.memory_usage(k, samples=0) or 0) for k in sample]
    markers = int(h.r.eval("return #redis.call('KEYS', ARGV[1])", 0, prefix + "*"))
    value = h.r.get(sample[0]) if sample else b""
    return {
        "markers": markers,
        "memory_usage_bytes": round(statistics.mean(sizes), 1) if sizes else 0.0,
        "sampled": len(sizes),
        "key_bytes": len(sample[0]) if sample else 0,
        "value_bytes": len(value or b""),
        "used_memory_per_10k": round(extra["used_memory_delta"] / max(markers, 1) * 10_000),
        "used_memory_bytes_per_marker": round(extra["used_memory_delta"] / max(markers, 1), 1),
        "note": f"{jobs} jobs; the used_memory delta also holds the group's consumer entry "
                "and the fencing counter",
    }


# ---- output ------------------------------------------------------------------------------


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def render(result: dict[str, Any], console: Console) -> None:
    """Print the result as rich tables."""
    sc = result["scenarios"]
    table = Table(title=f"streamwork bench ({result['date']}, {result['machine']['cpus']} "
                        f"cpus, Redis {result['machine']['redis_server']}, "
                        f"{result['params']['jobs']:,} jobs/run, median of "
                        f"{result['params']['repeats']})")
    table.add_column("scenario")
    table.add_column("jobs/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("baseline")
    table.add_column("cpu client/redis", justify="right")
    rows = (
        ("raw XADD, pipelined 500", "raw_xadd", ""),
        ("raw XREADGROUP 500 + XACK", "raw_consume", ""),
        ("raw naive safety loop", "raw_safety", ""),
        ("produce (send_many 500)", "produce", "raw XADD"),
        ("consume dedup off", "consume_dedup_off", "raw XREADGROUP+XACK"),
        ("consume dedup on", "consume_dedup_on", "naive safety loop"),
    )
    for label, key, versus in rows:
        s = sc[key]
        if "concurrency" in s:
            label += f" c={s['concurrency']} b={s['batch_size']}"
        ratio = f"{s['ratio']:.2f}x" if "ratio" in s else ""
        table.add_row(label, _fmt_rate(s["jobs_per_s"]), ratio, versus,
                      f"{s['client_cpu_pct']:.0f}% / {s['redis_cpu_pct']:.0f}%")
    console.print(table)

    sweep = Table(title="consume sweep (jobs/s, median)")
    sweep.add_column("concurrency", justify="right")
    sweep.add_column("batch_size", justify="right")
    sweep.add_column("dedup off", justify="right")
    sweep.add_column("dedup on", justify="right")
    on = {(s["concurrency"], s["batch_size"]): s for s in sc["consume_dedup_on"]["sweep"]}
    for s in sc["consume_dedup_off"]["sweep"]:
        other = on.get((s["concurrency"], s["batch_size"]))
        sweep.add_row(str(s["concurrency"]), str(s["batch_size"]), _fmt_rate(s["jobs_per_s"]),
                      _fmt_rate(other["jobs_per_s"]) if other else "")
    console.print(sweep)

    lat = sc["latency"]
    extra = Table(title=f"latency at {_fmt_rate(lat['offered_per_s'])} jobs/s offered, "
                        "commands and memory")
    extra.add_column("what")
    extra.add_column("dedup off", justify="right")
    extra.add_column("dedup on", justify="right")
    extra.add_row("enqueue->start p50 (ms)", f"{lat['dedup_off']['p50_ms']:.2f}",
                  f"{lat['dedup_on']['p50_ms']:.2f}")
    extra.add_row("enqueue->start p99 (ms)", f"{lat['dedup_off']['p99_ms']:.2f}",
                  f"{lat['dedup_on']['p99_ms']:.2f}")
    cmd = result["commands"]
    extra.add_row("Redis commands/job (all, incl. in scripts)",
                  f"{cmd['dedup_off']['total_per_job']:.2f}",
                  f"{cmd['dedup_on']['total_per_job']:.2f}")
    extra.add_row("client round trips/job", f"{cmd['dedup_off']['round_trips_per_job']:.4f}",
                  f"{cmd['dedup_on']['round_trips_per_job']:.4f}")
    extra.add_row("naive safety loop: commands/job", "",
                  f"{cmd['raw_safety']['total_per_job']:.2f}")
    mem = result["memory"]
    extra.add_row("done-marker MEMORY USAGE (bytes)", "", f"{mem['memory_usage_bytes']:.0f}")
    extra.add_row("used_memory per 10k markers", "",
                  f"{mem['used_memory_per_10k'] / 1024:,.0f} KiB")
    console.print(extra)

    goals = Table(title="goals (issue 5)")
    goals.add_column("goal")
    goals.add_column("measured", justify="right")
    goals.add_column("", justify="center")
    for g in result["goals"]:
        measured = "n/a" if g["measured"] is None else f"{g['measured']:.3g}"
        goals.add_row(g["goal"], measured,
                      "[green]PASS[/green]" if g["pass"] else "[red]MISS[/red]")
    console.print(goals)
    load = result["machine"]
    console.print(f"load average {load['loadavg_start']} -> {load.get('loadavg_end')}; "
                  "figures are noisy when other work shares the machine.")


def plot(result: dict[str, Any], path: str) -> None:
    """Write throughput by concurrency and batch size to ``path`` (PNG) with matplotlib."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    sc = result["scenarios"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=False)
    for ax, key, base, base_label in (
        (axes[0], "consume_dedup_off", "raw_consume", "raw XREADGROUP+XACK"),
        (axes[1], "consume_dedup_on", "raw_safety", "naive safety loop"),
    ):
        by_batch: dict[int, list[tuple[int, float]]] = {}
        for s in sc[key]["sweep"]:
            by_batch.setdefault(s["batch_size"], []).append((s["concurrency"], s["jobs_per_s"]))
        for batch, points in sorted(by_batch.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                    label=f"batch_size={batch}")
        ax.axhline(sc[base]["jobs_per_s"], color="grey", linestyle="--", label=base_label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("jobs/s")
        ax.set_title(key.replace("_", " "))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"streamwork consume throughput ({result['date']}, "
                 f"{result['machine']['cpus']} cpus)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- CLI -----------------------------------------------------------------------------------


@click.command("bench")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write throughput by concurrency/batch size to FILE.png (needs matplotlib).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per scenario; figures are medians.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Jobs per run (default 20000, 600 with --quick).")
@click.option("--quick", is_flag=True, help="Small runs and a short sweep (for tests).")
@click.option("--url", default=None, hidden=True,
              help="A Redis the bench may FLUSHALL, instead of its own redis-server.")
def bench_command(as_json: bool, plot_path: str | None, repeats: int, jobs: int | None,
                  quick: bool, url: str | None) -> None:
    """Benchmark streamwork against raw redis-py on a private redis-server."""
    if plot_path:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            raise click.ClickException("--plot needs matplotlib: pip install matplotlib") from None
    err = Console(stderr=True)
    try:
        params = Params.make(jobs=jobs, repeats=repeats, quick=quick)
        result = run_bench(params, say=lambda m: err.print(f"[dim]{m}[/dim]"), url=url)
        if plot_path:
            plot(result, plot_path)
            result["plot"] = plot_path
    except StreamworkError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        render(result, Console(width=None if sys.stdout.isatty() else 110))
        if plot_path:
            click.echo(f"plot written to {plot_path}")


def register(main: click.Group) -> None:
    """Add the ``bench`` command to the ``streamwork`` CLI group."""
    main.add_command(bench_command)


def cli_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m benchmarks``."""
    bench_command.main(args=list(argv) if argv is not None else sys.argv[1:],
                       prog_name="python -m benchmarks")
