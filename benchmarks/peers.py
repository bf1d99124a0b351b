"""The ``peers`` scenario: one protocol through streamwork, other Python job queues on
Redis, and the bare-handler ceiling, in one run on the harness's private redis-server.

The protocol: ONE worker process; the handler does one Redis ``INCR`` (``async`` where the
framework has an async worker) on its own client; N jobs are enqueued before the worker
starts (untimed); timed from the worker's start until N jobs were handled. The ceiling is
16 bare asyncio tasks doing just the INCR, N in all, on ``redis.asyncio``: what the
handler's own work allows one process. The stream floor adds only what reading a stream
takes (XREADGROUP, decoding, XACK): what any stream consumer can reach at best.

streamwork runs at its DEFAULT options (``WorkerOptions``, read at run time: what users
run; the peer goals are judged on these rows) and, with a sweep, also at the best
(concurrency, batch_size) of it; each of its runs is paired with a ceiling run right before
it, its ratio the median of the pairs'. streamwork, the ceiling and the floor run in this
process. Each peer runs as a
child process (``benchmarks/peer_workers/<module>.py``) in a throwaway virtualenv of its
own (cached under ``~/.cache/streamwork-bench-peers/``; never a project dependency),
because their pins conflict (arq wants redis-py < 6, rq and taskiq-redis >= 6). The child
enqueues, prints a start line with ``time.monotonic()`` and serves; this process polls the
counter and ends the child (by its pid) once it reaches N. Contenders take turns in every
repeat (round-robin), so a drift of the machine's speed hits them all alike. A peer that
cannot be installed or fails is reported as ``"n/a: <reason>"``; the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import platform
import selectors
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgpack
import redis
import redis.asyncio as aredis

from benchmarks.accounting import commands_per_job
from benchmarks.harness import Harness, _entries, serve_until
from benchmarks.measure import (
    GROUP,
    Run,
    Span,
    default_setting,
    end_process,
    frozen_gc,
    machine_cpu,
    make_jobs,
    redis_cpu,
    summary,
)
from streamwork import Message, StreamWorker
from streamwork.errors import BenchError

__all__ = ["CONCURRENCY", "PEERS", "IncrWorker", "Peer", "peers_plot_path", "run_peers"]

ROOT: Final = Path(__file__).resolve().parent.parent
COUNTER: Final = "peers:handled"
CONCURRENCY: Final = 16  #: handler concurrency of every contender (rq: 1, see its config)
RUN_TIMEOUT: Final = 120.0  #: seconds one peer run may take (enqueue, then serve)
INSTALL_TIMEOUT: Final = 600.0
POLL: Final = 0.002  #: seconds between polls of the counter
BATCH_READ: Final = 100  #: entries per XREADGROUP of the stream floor


@dataclass(frozen=True, slots=True)
class Peer:
    """A framework under the protocol: its worker module and its pinned requirements."""

    name: str
    module: str
    requirements: tuple[str, ...]


#: Every peer and its pins, in one place. One virtualenv per peer: their pins conflict.
PEERS: Final = (
    Peer("taskiq-redis", "taskiq_peer",
         ("taskiq==0.13.0", "taskiq-redis==1.2.4", "redis==8.1.0", "hiredis==3.5.0")),
    Peer("dramatiq", "dramatiq_peer", ("dramatiq[redis]==2.2.1", "redis==8.1.0",
                                       "hiredis==3.5.0")),
    Peer("arq", "arq_peer", ("arq==0.28.0", "redis==5.3.1", "hiredis==3.5.0")),
    Peer("rq", "rq_peer", ("rq==2.12.0", "redis==8.1.0", "hiredis==3.5.0")),
)


class PeerError(Exception):
    """A peer could not be installed or run: reported as n/a, the run goes on."""


class IncrWorker(StreamWorker):
    """streamwork under the protocol: ``handle`` INCRs on its own ``redis.asyncio`` client."""

    stream = "bench"
    group = GROUP

    async def on_start(self) -> None:
        self.bench_redis = aredis.Redis.from_url(self.url)

    async def on_stop(self) -> None:
        await self.bench_redis.aclose()

    async def handle(self, msg: Message) -> None:
        await self.bench_redis.incr(COUNTER)


# ---- the in-process contenders ----

def ceiling_once(h: Harness, jobs: int, tasks: int = CONCURRENCY) -> Run:
    """``tasks`` bare asyncio tasks INCR ``jobs`` times in all (timed from the client's
    creation, as a worker's time includes connecting)."""
    h.fresh_stream("ceiling")

    async def go() -> Run:
        span = Span(h.r)
        span.start()
        client = aredis.Redis.from_url(h.url)
        left = jobs

        async def one() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await client.incr(COUNTER)

        try:
            await asyncio.gather(*(one() for _ in range(tasks)))
            return span.stop(jobs)
        finally:
            await client.aclose()

    with frozen_gc():  # as streamwork's run (and the peers' own processes start afresh)
        run = asyncio.run(go())
    _check_counter(h.r, jobs, "ceiling")
    return run


def stream_floor_once(h: Harness, jobs: int, tasks: int = CONCURRENCY) -> Run:
    """The least any stream consumer does around the same handler: a prefilled stream read
    with XREADGROUP (COUNT 100), each body MessagePack-decoded, the INCR run by ``tasks``
    asyncio tasks, and XACK once per batch read; no leases, no retries, no telemetry,
    nothing kept across a crash. Its ratio to the ceiling is about the most any consumer of
    a stream reaches here: what reading and acknowledging costs beside the handler, on the
    same event loop."""
    stream = h.fresh_stream("floor")
    keys, payloads = make_jobs(jobs)
    h.prefill(stream, keys, payloads, group=True)

    async def go() -> Run:
        span = Span(h.r)
        span.start()
        client = aredis.Redis.from_url(h.url)
        # bounded: the reader reads the next batch once the tasks have room for it
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=BATCH_READ)

        async def one() -> None:
            while (body := await queue.get()) is not None:
                msgpack.unpackb(body)
                await client.incr(COUNTER)

        async def read() -> None:
            left = jobs
            while left > 0:
                entries = _entries(await client.xreadgroup(GROUP, "floor", {stream: ">"},
                                                           count=min(BATCH_READ, left)))
                for _, fields in entries:
                    await queue.put(fields[b"d"])
                if entries:
                    await client.xack(stream, GROUP, *(entry_id for entry_id, _ in entries))
                left -= len(entries)
            for _ in range(tasks):
                await queue.put(None)  # every task ends once the queue is drained

        try:
            await asyncio.gather(read(), *(one() for _ in range(tasks)))
            return span.stop(jobs)
        finally:
            await client.aclose()

    with frozen_gc():
        run = asyncio.run(go())
    _check_counter(h.r, jobs, "stream floor")
    return run


def streamwork_once(h: Harness, jobs: int, dedup: bool, concurrency: int | None = None,
                    batch_size: int | None = None) -> Run:
    """A prefilled stream served in-process by :class:`IncrWorker` until every job is acked
    (the harness's ``serve_until``: from ``serve()`` until acked == N); ``concurrency`` and
    ``batch_size`` default to the worker's own defaults (``WorkerOptions``)."""
    default_conc, default_batch = default_setting()
    stream = h.fresh_stream("peers-on" if dedup else "peers-off")
    keys, payloads = make_jobs(jobs)
    h.prefill(stream, keys, payloads, group=False)
    worker = IncrWorker.from_url(
        h.url, stream=stream, group=GROUP, dedup=dedup,
        concurrency=default_conc if concurrency is None else concurrency,
        batch_size=default_batch if batch_size is None else batch_size)
    h.wait_clients_gone(keep=1)
    with frozen_gc():  # as `streamwork run` does
        run = asyncio.run(serve_until(worker, jobs, Span(h.r)))
    _check_counter(h.r, jobs, "streamwork")
    return run


def _check_counter(r: redis.Redis, jobs: int, who: str) -> None:
    done = int(r.get(COUNTER) or 0)
    if done < jobs:
        raise BenchError(f"{who}: {done}/{jobs} INCRs after the run")


# ---- the peers: a virtualenv each, a child process per run ----

def cache_dir() -> Path:
    base = os.environ.get("STREAMWORK_BENCH_PEERS_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "streamwork-bench-peers"


def venv_for(peer: Peer, say: Callable[[str], None]) -> Path:
    """The python of ``peer``'s virtualenv, created and pip-installed on first use."""
    tag = "\n".join((platform.python_version(), sys.base_prefix, *peer.requirements))
    digest = hashlib.sha256(tag.encode()).hexdigest()[:12]
    path = cache_dir() / f"venv-{peer.module.removesuffix('_peer')}-{digest}"
    python = path / "bin" / "python"
    if (path / ".complete").exists() and python.exists():
        return python
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    say(f"peers: installing {' '.join(peer.requirements)} into {path}")
    _check_call([sys.executable, "-m", "venv", str(path)], "python -m venv")
    _check_call([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                 *peer.requirements], "pip install")
    (path / ".complete").write_text(tag + "\n")
    return python


def _check_call(args: Sequence[str], what: str) -> None:
    try:
        proc = subprocess.run(args, capture_output=True, timeout=INSTALL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise PeerError(f"{what} took over {INSTALL_TIMEOUT:.0f} s") from None
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.decode(errors="replace").splitlines()
                 if x.strip() and not x.startswith("WARNING")]
        raise PeerError(f"{what} failed: {lines[-1] if lines else proc.returncode}")


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far; 0.0 if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def peer_once(h: Harness, peer: Peer, python: Path, jobs: int
              ) -> tuple[Run, dict[str, Any]]:
    """One run of ``peer``'s worker program; returns the run and its start line."""
    h.fresh_stream(peer.module)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("VIRTUAL_ENV", None)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [str(python), "-m", f"benchmarks.peer_workers.{peer.module}", "--url", h.url,
             "--jobs", str(jobs), "--concurrency", str(CONCURRENCY), "--counter", COUNTER],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        try:
            return _time_child(h, proc, jobs, err)
        finally:
            end_process(proc)


def _time_child(h: Harness, proc: subprocess.Popen[bytes], jobs: int,
                err: Any) -> tuple[Run, dict[str, Any]]:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + RUN_TIMEOUT
    start: dict[str, Any] | None = None
    while start is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise PeerError(_why(proc, err, "exited before starting its worker"))
        if sel.select(timeout=0.1):
            line = proc.stdout.readline()
            if line.startswith(b"{"):
                start = json.loads(line)
    sel.close()
    cpu0, rcpu0, mcpu0 = _proc_cpu(proc.pid), redis_cpu(h.r), machine_cpu()
    r = h.r
    while int(r.get(COUNTER) or 0) < jobs:
        if proc.poll() is not None or time.monotonic() > deadline:
            done = int(r.get(COUNTER) or 0)
            raise PeerError(_why(proc, err, f"stalled at {done}/{jobs} jobs"))
        time.sleep(POLL)
    now = time.monotonic()
    run = Run(jobs, now - float(start["t"]), _proc_cpu(proc.pid) - cpu0,
              redis_cpu(h.r) - rcpu0, max(0.0, machine_cpu() - mcpu0) if mcpu0 else None)
    return run, start


def _why(proc: subprocess.Popen[bytes], err: Any, what: str) -> str:
    err.seek(0)
    lines = [x for x in err.read().decode(errors="replace").splitlines() if x.strip()]
    code = proc.poll()
    tail = f" ({lines[-1][:200]})" if lines else ""
    return f"{what}{'' if code is None else f', exit code {code}'}{tail}"


# ---- the scenario ----

def _streamwork_rows(sweep_best: dict[bool, tuple[int, int]]
                     ) -> dict[str, tuple[bool, int, int]]:
    """streamwork's rows: name -> (dedup, concurrency, batch_size); the defaults' rows
    (the goals' figures) first, then the sweep's best of each mode when a sweep ran."""
    conc, batch = default_setting()
    rows = {"streamwork_dedup_off": (False, conc, batch),
            "streamwork_dedup_on": (True, conc, batch)}
    for dedup, (c, b) in sweep_best.items():
        rows[f"streamwork_dedup_{'on' if dedup else 'off'}_best"] = (dedup, c, b)
    return rows


def _sweep(h: Harness, jobs: int, repeats: int, say: Callable[[str], None],
           sweep: Sequence[tuple[int, int]]
           ) -> tuple[dict[str, list[dict[str, Any]]], dict[bool, tuple[int, int]]]:
    """streamwork under the protocol at each (concurrency, batch_size) of ``sweep``,
    ``repeats`` runs each (unpaired: the best is then run paired with the ceiling)."""
    out: dict[str, list[dict[str, Any]]] = {}
    best: dict[bool, tuple[int, int]] = {}
    for dedup in (False, True):
        mode = f"dedup_{'on' if dedup else 'off'}"
        rows = []
        for conc, batch in sweep:
            done = []
            for _ in range(repeats):
                done.append(streamwork_once(h, jobs, dedup, conc, batch))
            row = {"concurrency": conc, "batch_size": batch, **summary(done)}
            say(f"peers sweep streamwork {mode} c={conc} b={batch}: "
                f"{row['jobs_per_s']:,.0f} jobs/s")
            rows.append(row)
        out[mode] = rows
        if rows:
            top = max(rows, key=lambda r: r["jobs_per_s"])
            best[dedup] = (top["concurrency"], top["batch_size"])
    return out, best


def run_peers(h: Harness, jobs: int, repeats: int, say: Callable[[str], None],
              peers: Sequence[Peer] = PEERS,
              sweep: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    """Measure the ceiling, the bare stream loop, streamwork (dedup off, on) and ``peers``
    under the protocol.

    streamwork runs at its DEFAULT options (``WorkerOptions``: what users run), and, when
    ``sweep`` lists (concurrency, batch_size) settings, also at the best of them
    (``streamwork_dedup_off_best``, ``..._on_best``). Each streamwork row is PAIRED with
    the ceiling: a ceiling run right before each of its runs, its ``ratio`` the median of
    the pairs' ratios (``pair_ratios``, ``ratio_min``, ``ratio_max``). The other rows' ratio
    is their median over the ceiling's (``round_ratios``: each round's run against the
    ceiling's run of the same round).

    ``result["results"]`` maps each contender to its median jobs/s (``runs_jobs_per_s``,
    CPU shares and CPU µs per job of the worker process and of redis-server), ``ratio`` to
    the ceiling, ``versions`` and ``config``; a peer that failed has ``error``
    ("n/a: ...") instead. ``result["sweep"]`` holds the sweep, ``result["commands"]``
    streamwork's commands per job at the defaults (MONITOR)."""
    started = time.time()
    local_versions = {"streamwork": _version("streamwork"), "redis": redis.__version__}
    sweep_rows, sweep_best = _sweep(h, jobs, repeats, say, sweep)
    sw_rows = _streamwork_rows(sweep_best)
    results: dict[str, dict[str, Any]] = {
        "ceiling": {"config": f"{CONCURRENCY} asyncio tasks, one INCR each per job, "
                              "redis.asyncio", "versions": {"redis": redis.__version__}},
        "stream_floor": {"config": f"XREADGROUP COUNT {BATCH_READ}, msgpack decode, "
                                   f"{CONCURRENCY} asyncio tasks, XACK per batch; "
                                   "redis.asyncio", "versions": {"redis": redis.__version__}},
    }
    for name, (dedup, conc, batch) in sw_rows.items():
        which = "the sweep's best" if name.endswith("_best") else "the defaults"
        results[name] = {"config": f"StreamWorker(concurrency={conc}, batch_size={batch}, "
                                   f"dedup={dedup}): {which}, async handle",
                         "concurrency": conc, "batch_size": batch, "dedup": dedup,
                         "versions": local_versions}
    pythons: dict[str, Path] = {}
    for peer in peers:
        results[peer.name] = {"requirements": list(peer.requirements)}
        try:
            pythons[peer.name] = venv_for(peer, say)
        except (PeerError, OSError) as exc:
            results[peer.name]["error"] = f"n/a: {exc}"
            say(f"peers: {peer.name} n/a: {exc}")

    once: dict[str, Callable[[], Run]] = {
        "ceiling": lambda: ceiling_once(h, jobs),
        "stream_floor": lambda: stream_floor_once(h, jobs),
    }
    for name, (dedup, conc, batch) in sw_rows.items():
        once[name] = functools.partial(streamwork_once, h, jobs, dedup, conc, batch)
    for peer in peers:
        if peer.name in pythons:
            once[peer.name] = _peer_runner(h, peer, pythons[peer.name], jobs, results)

    runs: dict[str, list[Run]] = {name: [] for name in once}
    paired_ceiling: dict[str, list[Run]] = {name: [] for name in sw_rows}
    for i in range(repeats):  # round-robin: every contender once per repeat
        for name, fn in once.items():
            if "error" in results[name]:
                continue
            try:
                base = ceiling_once(h, jobs) if name in sw_rows else None
                run = fn()
            except PeerError as exc:
                results[name]["error"] = f"n/a: {exc}"
                say(f"peers: {name} n/a: {exc}")
                continue
            runs[name].append(run)
            if base is not None:
                paired_ceiling[name].append(base)
                say(f"peers {name} [{i + 1}/{repeats}]: {run.rate:,.0f} jobs/s, "
                    f"{run.rate / base.rate if base.rate else 0:.2f}x the ceiling "
                    f"({base.rate:,.0f} jobs/s, run just before)")
            else:
                say(f"peers {name} [{i + 1}/{repeats}]: {run.rate:,.0f} jobs/s")

    for name, done in runs.items():
        if done and "error" not in results[name]:
            results[name].update(_worker_summary(done))
    ceiling = results["ceiling"].get("jobs_per_s", 0.0)
    for name, row in results.items():
        if name in sw_rows and paired_ceiling[name]:
            ratios = [r.rate / c.rate if c.rate > 0 else 0.0
                      for r, c in zip(runs[name], paired_ceiling[name], strict=True)]
            row.update(ratio=round(statistics.median(ratios), 3),
                       ratio_min=round(min(ratios), 3), ratio_max=round(max(ratios), 3),
                       pair_ratios=[round(x, 3) for x in ratios],
                       paired_ceiling=_worker_summary(paired_ceiling[name]))
        elif "jobs_per_s" in row and ceiling > 0:
            row["ratio"] = round(row["jobs_per_s"] / ceiling, 3)
            # each round's run against the ceiling's run of the same round (the spread)
            row["round_ratios"] = [round(r.rate / c.rate, 3) for r, c in
                                   zip(runs[name], runs["ceiling"], strict=False) if c.rate > 0]
    commands = _commands(h, sw_rows, say)
    for name, one in commands.items():
        results[name]["round_trips_per_job"] = one["client_commands_per_job"]
        results[name]["commands_per_job"] = one["total_per_job"]
    return {"jobs": jobs, "repeats": repeats, "concurrency": CONCURRENCY,
            "defaults": {"concurrency": default_setting()[0],
                         "batch_size": default_setting()[1]},
            "results": results, "sweep": sweep_rows, "commands": commands,
            "seconds": round(time.time() - started, 1)}


def _worker_summary(runs: Sequence[Run]) -> dict[str, Any]:
    """:func:`summary`, its client figures named for the worker process."""
    out = summary(runs)
    out["worker_cpu_pct"] = out.pop("client_cpu_pct")
    out["worker_cpu_us_per_job"] = out.pop("client_cpu_us_per_job")
    return out


def _commands(h: Harness, sw_rows: dict[str, tuple[bool, int, int]],
              say: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """streamwork's commands per job under the protocol (its rows at the defaults), from
    one counted run each (MONITOR): all of them, those sent by the worker's connections
    (the handler's INCR among them, ``handler_commands_per_job``) and those in scripts."""
    out: dict[str, dict[str, Any]] = {}
    for name, (dedup, conc, batch) in sw_rows.items():
        if name.endswith("_best"):
            continue
        run, extra = h.consume_once(dedup, conc, batch, monitor=True, worker_cls=IncrWorker)
        one = commands_per_job(extra, run.jobs)
        client = extra.get("client", {})  # redis-py sends incr() as INCRBY
        one["handler_commands_per_job"] = round(
            (int(client.get("incr", 0)) + int(client.get("incrby", 0))) / max(run.jobs, 1), 4)
        out[name] = one
        say(f"peers commands/job {name}: {one['total_per_job']} in all, "
            f"{one['client_commands_per_job']} client-sent (the handler's INCR included)")
    return out


def _peer_runner(h: Harness, peer: Peer, python: Path, jobs: int,
                 results: dict[str, dict[str, Any]]) -> Callable[[], Run]:
    def once() -> Run:
        run, start = peer_once(h, peer, python, jobs)
        results[peer.name]["versions"] = start.get("versions", {})
        results[peer.name]["config"] = start.get("config", "")
        return run
    return once


def _version(dist: str) -> str:
    import importlib.metadata

    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return importlib.metadata.version(dist)
    return "?"


def peers_plot_path(path: str) -> str:
    """``bench.png`` -> ``bench-peers.png``: the peers plot sits next to the main one."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}-peers{p.suffix or '.png'}"))
