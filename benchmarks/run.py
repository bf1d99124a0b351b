"""The harness's one entry point: :func:`run_bench` measures raw redis-py and streamwork in
the same run, on one private redis-server, and returns the result with the ratios.

Measured, each as the median of ``repeats`` runs (see ``benchmarks/README.md``):

* raw redis-py baselines (sync ``redis.Redis``, hiredis parser, bytes replies):
  ``raw_xadd`` pipelined XADD of MessagePack bodies, 500 per pipeline; ``raw_consume``
  XREADGROUP COUNT 500 plus one XACK per batch; ``raw_safety`` the naive safety loop: per
  message SET NX PX lock, SET PX done, XACK, DEL lock, pipelined per batch of 500;
* streamwork: ``produce`` (``Producer.send_many``, 500 per call), ``consume_dedup_off`` and
  ``consume_dedup_on`` (a no-op async ``StreamWorker`` served in-process, over a sweep of
  concurrency x batch_size), each paired with its baseline at the DEFAULT options (read
  from ``WorkerOptions`` when the bench runs: what users run; the goals are judged on
  these) and at the sweep's best setting (``defaults`` and ``best``: each ratio the median
  of the pairs, with their lowest, highest and each pair's), and ``latency`` (enqueue ->
  handler start at a steady offered load of 20 % of the mode's best rate, at both);
* where the time of a job goes (``cost`` of each of them and of the raw loops): the
  client's CPU per job (``time.process_time`` around the timed window), redis-server's
  (INFO cpu deltas), the round trips (client-sent commands, MONITOR) and commands per job,
  and which side bounds the run;
* Redis commands per job at the defaults and at the best (INFO commandstats, and MONITOR
  to tell the commands a client sent from those run inside scripts) and Redis memory per
  done-marker;
* ``batch_handlers`` (:mod:`benchmarks.scenarios.batch_handlers`, skipped with
  ``--no-batch-handlers``): ``handle_batch`` against ``handle``, dedup on and off, in
  ``streamwork run`` processes, paired with a raw redis-py loop doing the same one-HSET-per-
  batch work; ``recovery`` (:mod:`benchmarks.scenarios.recovery`, ``--no-recovery``): jobs/s
  in 1-s buckets around the SIGKILL of one of two workers, batch reclaim against one at a
  time, the dip as a ratio to the pre-kill level; both bounded (about 45 s together, 15 s
  with ``--quick``);
* with ``peers_jobs`` (``--peers``): the ``peers`` scenario (:mod:`benchmarks.peers`), the
  same protocol through streamwork (at its defaults, and at the best of the same sweep),
  taskiq-redis, dramatiq, arq and rq beside the bare-handler ceiling; its goals
  (:data:`PEER_GOALS`, judged at the defaults) are added only then.

Figures are benchmark figures, not guarantees: they depend on the machine and its load.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import redis

from benchmarks.accounting import commands_per_job, done_marker_memory
from benchmarks.harness import Harness
from benchmarks.measure import (
    BATCH,
    LOAD_FRACTION,
    Params,
    Run,
    default_options,
    default_setting,
    summary,
)
from benchmarks.peers import run_peers
from benchmarks.scenarios import batch_handlers as handlers
from benchmarks.scenarios import recovery as kill
from streamwork.testing import RedisServer

__all__ = ["GOALS", "PEER_GOALS", "private_server", "run_bench"]

GOALS: Final = (
    # name, path of the figure judged (at the DEFAULT options), comparison, target, path of
    # the same figure at the sweep's best setting (shown beside it; None: nothing swept)
    ("send_many >= 2x raw pipelined XADD", "produce.ratio", ">=", 2.0, None),
    ("consume dedup off >= 0.5x raw XREADGROUP+XACK", "consume_dedup_off.defaults.ratio",
     ">=", 0.5, "consume_dedup_off.best.ratio"),
    ("consume dedup on >= 2x naive safety loop", "consume_dedup_on.defaults.ratio",
     ">=", 2.0, "consume_dedup_on.best.ratio"),
    ("dedup on <= 3.2 Redis commands/job (all, incl. inside scripts)",
     "commands.dedup_on.defaults.total_per_job", "<=", 3.2,
     "commands.dedup_on.best.total_per_job"),
    ("dedup off <= 0.1 Redis commands/job (all)",
     "commands.dedup_off.defaults.total_per_job", "<=", 0.1,
     "commands.dedup_off.best.total_per_job"),
    ("p99 enqueue->start <= 2 ms at 20% of max (dedup off)",
     "latency.dedup_off.defaults.p99_ms", "<=", 2.0, "latency.dedup_off.best.p99_ms"),
    ("p99 enqueue->start <= 5 ms at 20% of max (dedup on)",
     "latency.dedup_on.defaults.p99_ms", "<=", 5.0, "latency.dedup_on.best.p99_ms"),
)
#: jobs per run of the batch-handler section (at most; fewer with a smaller --jobs)
BATCH_HANDLER_JOBS: Final = 5_000
#: s one batch-handler run is timed at most (full run, --quick): bounds a slow run's cost
BATCH_HANDLER_WINDOW: Final = {False: 2.0, True: 1.0}
#: the goals of the peers protocol: in the result only when ``--peers`` ran
PEER_GOALS: Final = (
    ("peers protocol: streamwork dedup off >= 0.9x ceiling",
     "peers.results.streamwork_dedup_off.ratio", ">=", 0.9,
     "peers.results.streamwork_dedup_off_best.ratio"),
    ("peers protocol: streamwork dedup on >= 0.8x ceiling",
     "peers.results.streamwork_dedup_on.ratio", ">=", 0.8,
     "peers.results.streamwork_dedup_on_best.ratio"),
)
#: a side at least this busy (CPU seconds per wall second) is what bounds a run
BUSY: Final = 0.85


def run_bench(params: Params, say: Callable[[str], None] = lambda _: None,
              url: str | None = None, peers_jobs: int | None = None,
              batch_handlers: bool = True, recovery: bool = True) -> dict[str, Any]:
    """Run every scenario and return the machine-readable result.

    Starts (and at the end stops) a private redis-server, unless ``url`` names a loopback
    server (``redis://127.0.0.1:PORT/0``) that the harness may FLUSHALL and MONITOR.
    ``peers_jobs`` adds the peers scenario with that many jobs per run; ``batch_handlers``
    and ``recovery`` (on unless turned off) the sections of those names."""
    with private_server(url) as (server_url, port):
        h = Harness(server_url, port, params, say)
        try:
            return _run(h, params, say, peers_jobs, (batch_handlers, recovery))
        finally:
            h.close()


def _sections(h: Harness, result: dict[str, Any], batch_handlers: bool,
              recovery: bool) -> None:
    """The batch-handler and recovery sections (each in worker processes of its own, on
    the same server), bounded; a section turned off is left out of the result."""
    params = h.params
    result["params"].update(batch_handlers=batch_handlers, recovery=recovery)
    if batch_handlers:
        result["batch_handlers"] = handlers.section(
            h.url, min(params.jobs, BATCH_HANDLER_JOBS), params.repeats,
            BATCH_HANDLER_WINDOW[params.quick], say=h.say)
    if recovery:
        result["recovery"] = kill.section(h.url, params.quick, say=h.say)


@contextlib.contextmanager
def private_server(url: str | None) -> Iterator[tuple[str, int]]:
    """``(url, port)`` of the Redis to measure: ``url`` as given (a loopback server the
    caller may FLUSHALL), else a private redis-server started here and stopped after."""
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


def _run(h: Harness, params: Params, say: Callable[[str], None],
         peers_jobs: int | None = None, sections: tuple[bool, bool] = (True, True)
         ) -> dict[str, Any]:
    started = time.time()
    defaults = default_options()
    result: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "machine": _machine(h.r),
        "params": {"jobs": params.jobs, "repeats": params.repeats, "quick": params.quick,
                   "batch": BATCH, "sweep": [list(s) for s in params.sweep],
                   "defaults": defaults, "latency_seconds": params.latency_seconds,
                   "load_fraction": LOAD_FRACTION},
    }
    sc: dict[str, Any] = {}
    result["scenarios"] = sc
    # each ratio comes from PAIRED runs: the baseline and streamwork alternate, one pair per
    # repeat, and the ratio is the median of the pairs' ratios, so a burst of background
    # load hits both sides of a ratio instead of one
    sc["raw_xadd"], produce, ratios = _paired(h, "raw XADD", h.raw_xadd_once, "produce",
                                              h.produce_once)
    sc["produce"] = {**produce, "baseline": "raw_xadd", **ratios}
    sc["raw_consume"] = h.repeat("raw XREADGROUP+XACK", h.raw_consume_once)
    sc["raw_safety"] = h.repeat("raw naive safety loop", h.raw_safety_once)
    base_once = {"raw_consume": h.raw_consume_once, "raw_safety": h.raw_safety_once}

    for dedup, key, base in ((False, "consume_dedup_off", "raw_consume"),
                             (True, "consume_dedup_on", "raw_safety")):
        mode = f"consume dedup {'on' if dedup else 'off'}"
        sweep = []
        for conc, batch in params.sweep:
            summary = h.repeat(f"{mode} c={conc} b={batch}",
                               functools.partial(h.consume_run, dedup, conc, batch))
            sweep.append({"concurrency": conc, "batch_size": batch, **summary})
        best = max(sweep, key=lambda s: s["jobs_per_s"])
        sc[key] = {"baseline": base, "sweep": sweep}
        # the defaults (what users run) and the sweep's best, each paired with the baseline
        for which, (conc, batch) in (("defaults", default_setting()),
                                     ("best", (best["concurrency"], best["batch_size"]))):
            paired_base, paired, ratios = _paired(
                h, base, base_once[base], f"{mode} {which} c={conc} b={batch} (paired)",
                functools.partial(h.consume_run, dedup, conc, batch))
            sc[key][which] = {"concurrency": conc, "batch_size": batch, **paired, **ratios,
                              "paired_baseline": paired_base}

    sc["latency"] = _latency(h, sc, say)
    result["commands"], result["memory"] = _accounting(h, sc, say)
    _costs(result, int(result["machine"]["cpus"] or 1))
    _sections(h, result, *sections)
    if peers_jobs:
        result["params"]["peers_jobs"] = peers_jobs
        result["peers"] = run_peers(h, peers_jobs, params.repeats, say, sweep=params.sweep)
    result["goals"] = _goals(result)
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.time() - started, 1)
    return result


def _latency(h: Harness, sc: dict[str, Any], say: Callable[[str], None]) -> dict[str, Any]:
    """Enqueue -> handler start of each mode at the default options and at the sweep's
    best setting, both offered LOAD_FRACTION of the mode's OWN max rate (its best setting's
    paired median: dedup on takes less), the offered rate the same for both."""
    latency: dict[str, Any] = {}
    for dedup in (False, True):
        mode = "dedup_on" if dedup else "dedup_off"
        scenario = sc["consume_" + mode]
        rate = max(10.0, LOAD_FRACTION * scenario["best"]["jobs_per_s"])
        latency[mode] = {"offered_per_s": round(rate, 1)}
        for which in ("defaults", "best"):
            setting = scenario[which]
            runs = []
            for i in range(h.params.repeats):
                one = h.latency_once(dedup, rate, setting["concurrency"], setting["batch_size"])
                say(f"latency {mode} {which} c={setting['concurrency']} "
                    f"b={setting['batch_size']} at {rate:,.0f} jobs/s [{i + 1}/"
                    f"{h.params.repeats}]: p50 {one['p50_ms']} ms, p99 {one['p99_ms']} ms")
                runs.append(one)
            latency[mode][which] = {
                "concurrency": setting["concurrency"], "batch_size": setting["batch_size"],
                "p50_ms": statistics.median(x["p50_ms"] for x in runs),
                "p99_ms": statistics.median(x["p99_ms"] for x in runs),
                "max_ms": max(x["max_ms"] for x in runs),
                "samples": sum(int(x["samples"]) for x in runs),
                "runs_p99_ms": [x["p99_ms"] for x in runs],
                "achieved_per_s": statistics.median(x["achieved_per_s"] for x in runs),
                "offered_per_s": round(rate, 1),
                # the offered load as a share of what this setting does at full speed
                "load_of_own_max": round(rate / setting["jobs_per_s"], 3)
                if setting["jobs_per_s"] > 0 else None,
            }
    return latency


def _accounting(h: Harness, sc: dict[str, Any], say: Callable[[str], None]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Commands per job (all, inside scripts, client-sent: MONITOR) at the defaults and at
    the best setting, the raw loops' (every command client-sent), and the done-marker's
    memory (at the defaults)."""
    commands: dict[str, Any] = {}
    for dedup in (False, True):
        mode = "dedup_on" if dedup else "dedup_off"
        commands[mode] = {}
        for which in ("defaults", "best"):
            setting = sc["consume_" + mode][which]
            run, extra = h.consume_once(dedup, setting["concurrency"], setting["batch_size"],
                                        monitor=True)
            one = commands_per_job(extra, run.jobs)
            commands[mode][which] = {"concurrency": setting["concurrency"],
                                     "batch_size": setting["batch_size"], **one}
            say(f"commands/job {mode} {which}: {one['total_per_job']} in all, "
                f"{one['client_commands_per_job']} client-sent, "
                f"{one['round_trips_per_job']} hot-path round trips")
    jobs = h.params.jobs
    h.raw_consume_once(account=True)  # every command of the raw loops is sent by the client
    commands["raw_consume"] = commands_per_job(
        {"commandstats": h.last_stats, "client": h.last_stats}, jobs)
    h.raw_safety_once(account=True)
    commands["raw_safety"] = commands_per_job(
        {"commandstats": h.last_stats, "client": h.last_stats}, jobs)
    # pipelined: one XREADGROUP and one pipeline (4 commands per job) per batch
    commands["raw_safety"]["round_trips_per_job"] = round(
        2 * h.last_stats.get("xreadgroup", 0) / jobs, 4)
    setting = sc["consume_dedup_on"]["defaults"]
    run, extra = h.consume_once(True, setting["concurrency"], setting["batch_size"],
                                accounting=True)
    memory = done_marker_memory(h.r, extra, run.jobs)
    say(f"done-marker: {memory['memory_usage_bytes']} bytes (MEMORY USAGE), "
        f"{memory['used_memory_bytes_per_marker']} bytes of used_memory")
    return commands, memory


def cost(row: dict[str, Any], commands: dict[str, Any] | None, cpus: int) -> dict[str, Any]:
    """Where the time of a job goes: wall time, the client's and redis-server's CPU per job
    (µs, median over the timed runs), how busy each side was and how busy every other
    process of the machine kept it, the round trips per job (client-sent commands,
    MONITOR) and every command per job; ``bound`` names the side that was at least
    :data:`BUSY` busy, or the machine's cores when all its processes together filled them
    (other people's work on a shared machine among them), else ``waits``."""
    wall = row.get("wall_us_per_job", 0.0)
    client = row.get("client_cpu_us_per_job", 0.0)
    server = row.get("redis_cpu_us_per_job", 0.0)
    others = row.get("others_cpu_us_per_job")
    client_busy = client / wall if wall > 0 else 0.0
    redis_busy = server / wall if wall > 0 else 0.0
    others_busy = others / wall if others is not None and wall > 0 else 0.0
    if client_busy >= BUSY:
        bound = "client CPU"
    elif redis_busy >= BUSY:
        bound = "Redis CPU"
    elif client_busy + redis_busy + others_busy >= BUSY * cpus:
        bound = "the machine's cores"
    else:
        bound = "waits (round trips, idle)"
    out: dict[str, Any] = {
        "wall_us_per_job": wall, "client_cpu_us_per_job": client,
        "redis_cpu_us_per_job": server, "client_busy": round(client_busy, 3),
        "redis_busy": round(redis_busy, 3), "bound": bound}
    if others is not None:
        out["others_cpu_us_per_job"] = others
        out["others_busy"] = round(others_busy, 3)
    if commands is not None:
        out["round_trips_per_job"] = commands["client_commands_per_job"]
        out["commands_per_job"] = commands["total_per_job"]
    return out


def _costs(result: dict[str, Any], cpus: int) -> None:
    """Adds ``cost`` to each consume scenario's defaults and best and to their baselines."""
    sc, commands = result["scenarios"], result["commands"]
    for key in ("raw_consume", "raw_safety"):
        sc[key]["cost"] = cost(sc[key], commands[key], cpus)
    for mode in ("dedup_off", "dedup_on"):
        for which in ("defaults", "best"):
            row = sc["consume_" + mode][which]
            row["cost"] = cost(row, commands[mode][which], cpus)


def _ratio(value: float, baseline: float) -> float:
    return round(value / baseline, 3) if baseline > 0 else 0.0


def _paired(h: Harness, base_what: str, base_once: Callable[[], Run], what: str,
            once: Callable[[], Run]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Baseline and subject run in turn, ``repeats`` pairs: (baseline summary, subject
    summary, {"ratio": median of the pairs' ratios, "ratio_min", "ratio_max",
    "pair_ratios": each pair's})."""
    base_runs: list[Run] = []
    runs: list[Run] = []
    ratios: list[float] = []
    for i in range(h.params.repeats):
        b, r = base_once(), once()
        base_runs.append(b)
        runs.append(r)
        ratios.append(_ratio(r.rate, b.rate))
        h.say(f"{what} [{i + 1}/{h.params.repeats}]: {r.rate:,.0f} jobs/s, "
              f"{ratios[-1]:.2f}x {base_what} ({b.rate:,.0f} jobs/s)")
    return summary(base_runs), summary(runs), ratio_spread(ratios)


def ratio_spread(ratios: list[float]) -> dict[str, Any]:
    """The median of the pairs' ratios, the lowest and highest, and each pair's."""
    return {"ratio": round(statistics.median(ratios), 3) if ratios else 0.0,
            "ratio_min": round(min(ratios), 3) if ratios else 0.0,
            "ratio_max": round(max(ratios), 3) if ratios else 0.0,
            "pair_ratios": [round(x, 3) for x in ratios]}


def _node(result: dict[str, Any], path: str) -> Any:
    """What ``path`` names: under ``result`` for commands/memory/peers, else under its
    scenarios; None where any part of it is missing."""
    node: Any = (result if path.startswith(("commands", "memory", "peers"))
                 else result.get("scenarios", {}))
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _lookup(result: dict[str, Any], path: str) -> float | None:
    node = _node(result, path)
    return float(node) if isinstance(node, (int, float)) else None


def _goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal judged on its figure at the DEFAULT options; the same figure at the
    sweep's best setting comes along under ``best`` (never judged on)."""
    goals = []
    for name, path, op, target, best_path in GOALS + (PEER_GOALS if "peers" in result
                                                     else ()):
        value = _lookup(result, path)
        ok = value is not None and _meets(value, op, target)
        goal: dict[str, Any] = {"goal": name, "measured": value, "op": op, "target": target,
                                "pass": ok, "judged_on": "defaults" if best_path else "run"}
        runs = _runs_of(result, path)
        if runs:  # a ratio's pairs (or a p99's runs): how far one verdict can be trusted
            goal["runs"] = runs
            goal["runs_passing"] = sum(_meets(x, op, target) for x in runs)
        if best_path:
            best = _lookup(result, best_path)
            parent = _node(result, best_path.rsplit(".", 1)[0])
            goal["best"] = {
                "measured": best,
                "pass": best is not None and _meets(best, op, target),
                "concurrency": parent.get("concurrency") if isinstance(parent, dict) else None,
                "batch_size": parent.get("batch_size") if isinstance(parent, dict) else None,
                "runs": _runs_of(result, best_path),
            }
        goals.append(goal)
    return goals


def _meets(value: float, op: str, target: float) -> bool:
    return value >= target if op == ">=" else value <= target


#: where the per-pair (per-run) values behind a figure are kept, beside it
_RUNS_KEYS: Final = {"ratio": ("pair_ratios", "round_ratios"), "p99_ms": ("runs_p99_ms",)}


def _runs_of(result: dict[str, Any], path: str) -> list[float]:
    """The per-pair values behind a goal's ratio (``pair_ratios`` of a paired scenario,
    ``round_ratios`` of a peers row) or the runs behind a p99 (``runs_p99_ms``), or []
    where the figure has none."""
    parent, _, leaf = path.rpartition(".")
    node = _node(result, parent)
    if not isinstance(node, dict):
        return []
    for key in _RUNS_KEYS.get(leaf, ()):
        runs = node.get(key)
        if isinstance(runs, list) and runs:
            return [float(x) for x in runs]
    return []


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

