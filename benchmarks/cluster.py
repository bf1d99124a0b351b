"""Scaling out on Redis Cluster: throughput with 1, 2 and 3 masters, in one run.

``python -m benchmarks.cluster [--jobs N] [--repeats R] [--json] [--masters 1,2,3]``

For each master count the harness starts a fresh local cluster of cluster-enabled
``redis-server`` processes on free loopback ports (:mod:`benchmarks.cluster_nodes`); all of
them stay up for the whole run and the master counts take turns in every repeat (round
robin), so a drift of this shared machine's speed hits them alike. The stream is split into
``--partitions`` (6) partitions, which spread evenly over the masters (the run checks and
records where each one lives). Per master count and repeat, from empty servers (FLUSHALL on
every master) and new uuid4 job keys:

* ``produce``: ``--producers`` (2) producer processes (:mod:`benchmarks.cluster_worker`)
  ``Producer.send_many`` N jobs in all, ``--produce-batch`` (3,000: ~500 per partition)
  per call; timed from the first one's first send to the last one's return;
* ``consume_dedup_off`` / ``consume_dedup_on``: the N jobs just produced, served by
  ``--workers`` (2) worker processes (a no-op ``StreamWorker`` each), worker ``w`` taking
  the partitions ``i`` with ``i % workers == w`` (``only_partitions``); timed from the
  first ack any of them sees to the last ack of the last one (each polls its own
  ``counts["acked"]`` every ms on the machine-wide monotonic clock), counting the jobs
  acked after that first poll.

A round (produce, then consume in one mode) in which the machine's other processes (other
people's work on a shared machine, measured from ``/proc/stat``) took more than
``--max-others`` (50 %) of a core in the produce or the consume run is run again, at most
``--retries`` (2) times and no more often in all than once per round on average, then
the last attempt counts (``runs_done_again`` counts them, ``counted[...]["retried"]`` says
which).

The child processes start, get ready (connect, build the worker or the jobs) and wait;
all of one phase get the go at once, so their start-up is not timed. Every cluster first
runs one small untimed round of each mode (scripts loaded, connections made).

Each figure is the median of the repeats; the ratio to one master is the median of the
repeats' ratios (each repeat's figures come from the same round). CPU shares are those of
the median run, 100 % = one core: ``client`` the producers or the workers together,
``redis`` all masters together (INFO cpu; ``redis_cpu_pct_per_master`` each, over the
window from the go to the last report), ``others`` every other process of the machine
(``/proc/stat``'s busy time less those two: other people's work on a shared machine). On
a 2-core machine the three add up to at most 200 %.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Final

import click
import redis
from rich.console import Console
from rich.table import Table

from benchmarks.cluster_nodes import BenchCluster, local_cluster
from benchmarks.measure import GROUP, Run, end_process, summary
from streamwork import StreamworkError
from streamwork._wire.partitions import partition_names
from streamwork.errors import BenchError

__all__ = ["SCENARIOS", "ClusterParams", "main", "markdown", "run_cluster"]

ROOT: Final = Path(__file__).resolve().parent.parent
STREAM: Final = "bench"  #: its 6 partitions spread 2/2/2 over 3 masters, 3/3 over 2
SCENARIOS: Final = ("produce", "consume_dedup_off", "consume_dedup_on")
START_TIMEOUT: Final = 60.0  #: seconds the worker processes may take to get ready
RUN_TIMEOUT: Final = 150.0  #: seconds from the go until every worker must have reported


@dataclass(frozen=True, slots=True)
class ClusterParams:
    """What one run measures."""

    jobs: int = 50_000
    repeats: int = 5
    masters: tuple[int, ...] = (1, 2, 3)
    partitions: int = 6
    workers: int = 2
    producers: int = 2
    concurrency: int = 256
    batch_size: int = 100
    produce_batch: int = 3_000
    warm_up: bool = True
    max_others: float = 50.0
    retries: int = 2

    def check(self) -> ClusterParams:
        if min(self.jobs, self.repeats, self.workers, self.producers, self.produce_batch,
               self.concurrency, self.batch_size) < 1:
            raise BenchError("--jobs, --repeats, --workers, --producers, --produce-batch, "
                             "--concurrency and --batch-size must be >= 1")
        if not self.masters or len(set(self.masters)) != len(self.masters) or min(
                self.masters) < 1:
            raise BenchError(f"--masters must be distinct counts >= 1, got {self.masters}")
        if self.retries < 0 or self.max_others < 0:
            raise BenchError("--retries and --max-others must be >= 0")
        if self.partitions < 2 or self.workers > self.partitions:
            raise BenchError("--partitions must be >= 2 and >= --workers")
        partition_names(STREAM, self.partitions)  # a usable count (ConfigError otherwise)
        return self


# ---- one run of each scenario ----

def _split(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` nearly equal counts."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _shares(p: ClusterParams) -> list[list[int]]:
    """The partitions each worker process serves."""
    return [[i for i in range(p.partitions) if i % p.workers == w] for w in range(p.workers)]


@dataclass(frozen=True, slots=True)
class Phase:
    """The children's reports, and what this process saw from the go to the last report:
    its wall seconds and each master's CPU seconds."""

    done: list[dict[str, Any]]
    window: float
    redis_cpu_each: list[float]

    @property
    def redis_cpu(self) -> float:
        return sum(self.redis_cpu_each)

    def scaled_redis_cpu(self, seconds: float) -> float:
        """The masters' CPU over ``seconds`` of the window (at the window's rate)."""
        return self.redis_cpu * seconds / self.window if self.window > 0 else 0.0

    @property
    def redis_cpu_pct_each(self) -> list[float]:
        """Each master's CPU share over the window, 100 % = one core."""
        return [round(100 * x / self.window, 1) if self.window > 0 else 0.0
                for x in self.redis_cpu_each]


def _others_pct(run: Run, busy_from: Any, busy_to: Any) -> float | None:
    """CPU share of the machine's other processes (not this run's clients or masters) over
    the run, 100 % = one core; None where /proc/stat is not there."""
    if busy_from is None or busy_to is None or run.seconds <= 0:
        return None
    other = float(busy_to) - float(busy_from) - run.client_cpu - run.redis_cpu
    return round(max(0.0, 100 * other / run.seconds), 1)


def _phase(c: BenchCluster, p: ClusterParams, role: str, args: Sequence[Sequence[str]]
           ) -> Phase:
    """Start one child per argument list, wait until all are ready, give them the go at
    once and collect their reports."""
    with contextlib.ExitStack() as stack:
        procs = [_spawn(c, p, role, a, stack) for a in args]
        for proc, err in procs:
            _read_event(proc, err, "ready", time.monotonic() + START_TIMEOUT)
        rcpu0, t0 = c.redis_cpu(), time.monotonic()
        for proc, _ in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        done = [_read_event(proc, err, "done", t0 + RUN_TIMEOUT) for proc, err in procs]
        window = time.monotonic() - t0
        redis_cpu = [b - a for a, b in zip(rcpu0, c.redis_cpu(), strict=True)]
        for proc, _ in procs:
            proc.wait(30)  # each drains and exits after its report
    return Phase(done, window, redis_cpu)


def _lengths(c: BenchCluster, p: ClusterParams) -> list[int]:
    """XLEN of each partition."""
    return [int(c.nodes[c.master_of(name)].xlen(name))
            for name in partition_names(STREAM, p.partitions)]


def produce_once(c: BenchCluster, p: ClusterParams) -> tuple[Run, dict[str, Any]]:
    """``--producers`` processes send_many ``--jobs`` jobs in all into the (empty)
    partitions, timed from the first one's start to the last one's end; (the run, the
    jobs then found in each partition and the machine's CPU use)."""
    args = [["--jobs", str(n), "--batch", str(p.produce_batch)]
            for n in _split(p.jobs, p.producers) if n > 0]
    ph = _phase(c, p, "produce", args)
    first = min(ph.done, key=lambda d: float(d["start"]))
    last = max(ph.done, key=lambda d: float(d["end"]))
    seconds = float(last["end"]) - float(first["start"])
    cpu = sum(float(d["cpu"]) for d in ph.done)
    # redis's CPU is read by this process around the whole go -> last report window
    run = Run(p.jobs, seconds, cpu, ph.scaled_redis_cpu(seconds))
    lengths = _lengths(c, p)
    return run, {"in_streams": sum(lengths), "per_partition": lengths,
                 "others_cpu_pct": _others_pct(run, first["busy_start"], last["busy_end"]),
                 "redis_cpu_pct_per_master": ph.redis_cpu_pct_each}


def consume_once(c: BenchCluster, p: ClusterParams, lengths: Sequence[int],
                 dedup: bool) -> tuple[Run, dict[str, Any]]:
    """Serve the produced jobs (``lengths``: per partition) with the worker processes,
    timed from the first ack any of them saw to the last one's last ack, counting the jobs
    acked after that first poll; (the run, what was counted and the machine's CPU use)."""
    shares = [(share, sum(lengths[i] for i in share)) for share in _shares(p)]
    args = [["--only", ",".join(map(str, share)), "--expect", str(n),
             "--concurrency", str(p.concurrency), "--batch-size", str(p.batch_size),
             *(["--dedup"] if dedup else [])]
            for share, n in shares if n > 0]
    ph = _phase(c, p, "consume", args)
    start = min(ph.done, key=lambda d: float(d["first_ack"]))
    last = max(ph.done, key=lambda d: float(d["last_ack"]))
    seconds = float(last["last_ack"]) - float(start["first_ack"])
    jobs = sum(lengths) - int(start["first_count"])
    workers_cpu = sum(float(d["cpu_last"]) - float(d["cpu_first"]) for d in ph.done)
    run = Run(jobs, seconds, workers_cpu, ph.scaled_redis_cpu(seconds))
    pending = 0
    for name in partition_names(STREAM, p.partitions):
        info: Any = c.nodes[c.master_of(name)].xpending(name, GROUP)
        pending += int(info["pending"])
    return run, {"acked": sum(int(d["acked"]) for d in ph.done), "pending_after": pending,
                 "per_worker": [int(d["acked"]) for d in ph.done],
                 "others_cpu_pct": _others_pct(run, start["busy_first"], last["busy_last"]),
                 "redis_cpu_pct_per_master": ph.redis_cpu_pct_each}


def _spawn(c: BenchCluster, p: ClusterParams, role: str, extra: Sequence[str],
           stack: contextlib.ExitStack) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    err = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - closed by the stack
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.cluster_worker", role, "--url", c.url,
         "--stream", STREAM, "--partitions", str(p.partitions), *extra],
        cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    stack.callback(end_process, proc)
    return proc, err


def _read_event(proc: subprocess.Popen[bytes], err: IO[bytes], event: str,
                deadline: float) -> dict[str, Any]:
    """The child's next JSON line, which must be ``event``; BenchError on anything else."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(_why(proc, err, f"no {event!r} from worker pid {proc.pid}"))
            if sel.select(timeout=min(left, 0.5)):
                line = proc.stdout.readline()
                if not line:
                    raise BenchError(_why(proc, err, f"worker pid {proc.pid} exited "
                                                     f"before {event!r}"))
                if line.startswith(b"{"):
                    got: dict[str, Any] = json.loads(line)
                    if got.get("event") != event:
                        raise BenchError(f"worker pid {proc.pid}: {got}")
                    return got


def _why(proc: subprocess.Popen[bytes], err: IO[bytes], what: str) -> str:
    proc.poll()
    err.seek(0)
    lines = [x for x in err.read().decode(errors="replace").splitlines() if x.strip()]
    tail = "\n".join(lines[-15:])
    code = "" if proc.returncode is None else f" (exit code {proc.returncode})"
    return f"{what}{code}" + (f":\n{tail}" if tail else "")


# ---- the run ----

def run_cluster(p: ClusterParams, say: Callable[[str], None] = lambda _: None
                ) -> dict[str, Any]:
    """Start a cluster per master count, measure every scenario on each, round robin, and
    return the machine-readable result."""
    p.check()
    started = time.time()
    result: dict[str, Any] = {"date": dt.date.today().isoformat(), "machine": _machine(),
                              "params": {**asdict(p), "masters": list(p.masters),
                                         "stream": STREAM, "shares": _shares(p)}}
    with contextlib.ExitStack() as stack:
        clusters: dict[int, BenchCluster] = {}
        for m in p.masters:
            clusters[m] = stack.enter_context(local_cluster(m))
            say(f"cluster of {m} master(s) formed: ports "
                f"{[s.port for s in clusters[m].servers]}")
        result["clusters"] = {str(m): _layout(c, p) for m, c in clusters.items()}
        result["machine"]["redis_server"] = str(
            clusters[p.masters[0]].nodes[0].info("server").get("redis_version", "?"))
        runs: dict[str, dict[int, list[Run]]] = {s: {m: [] for m in p.masters}
                                                 for s in SCENARIOS}
        counted: dict[str, dict[int, list[Any]]] = {s: {m: [] for m in p.masters}
                                                    for s in SCENARIOS}
        for m, c in clusters.items() if p.warm_up else ():
            _warm_up(c, p)
            say(f"{m} master(s): warmed up")
        disturbed = 0  # runs done again: other processes took over max_others of a core
        budget = p.repeats * len(p.masters)  # (one per round on average: bounds the time)
        for rep in range(p.repeats):
            # the master counts take turns, in reverse order every other round
            order = list(clusters.items())
            for m, c in order[::-1] if rep % 2 else order:
                for dedup in (False, True):
                    scenario = "consume_dedup_on" if dedup else "consume_dedup_off"
                    for attempt in range(1 + p.retries):
                        c.flushall()
                        prod, made = produce_once(c, p)
                        run, tally = consume_once(c, p, made["per_partition"], dedup)
                        others = max(made["others_cpu_pct"] or 0.0,
                                     tally["others_cpu_pct"] or 0.0)
                        made["retried"] = tally["retried"] = attempt
                        say(f"[{rep + 1}/{p.repeats}] {m} master(s): produce "
                            f"{prod.rate:,.0f} jobs/s, consume dedup "
                            f"{'on' if dedup else 'off'} {run.rate:,.0f} jobs/s; other "
                            f"processes {others:.0f} %")
                        if (others <= p.max_others or attempt == p.retries
                                or disturbed >= budget):
                            break
                        disturbed += 1
                    runs["produce"][m].append(prod)
                    counted["produce"][m].append(made)
                    runs[scenario][m].append(run)
                    counted[scenario][m].append(tally)
    base = min(p.masters)
    sc: dict[str, Any] = {}
    for s in SCENARIOS:
        sc[s] = {}
        for m in p.masters:
            ratios = [round(r.rate / b.rate, 3) if b.rate > 0 else 0.0
                      for r, b in _rounds(runs[s][m], runs[s][base])]
            # the other processes' CPU share in the median run (the one summary() picks)
            ordered = sorted(range(len(runs[s][m])), key=lambda i: runs[s][m][i].rate)
            mid = counted[s][m][ordered[(len(ordered) - 1) // 2]]
            sc[s][str(m)] = {**summary(runs[s][m]), "jobs_per_run": p.jobs,
                             "others_cpu_pct": mid["others_cpu_pct"],
                             "redis_cpu_pct_per_master": mid["redis_cpu_pct_per_master"],
                             "ratio": round(statistics.median(ratios), 3),
                             "runs_ratio": ratios, "counted": counted[s][m]}
    result["baseline_masters"] = base
    result["runs_done_again"] = disturbed
    result["scenarios"] = sc
    result["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.time() - started, 1)
    return result


def _warm_up(c: BenchCluster, p: ClusterParams) -> None:
    """One small untimed round (both modes) on a new cluster: scripts loaded on every
    master, first connections made, the servers' allocators grown."""
    small = ClusterParams(**{**asdict(p), "jobs": min(p.jobs, 2_000)})
    for dedup in (False, True):
        c.flushall()
        _, made = produce_once(c, small)
        consume_once(c, small, made["per_partition"], dedup)


def _rounds(runs: Sequence[Run], base: Sequence[Run]) -> Iterator[tuple[Run, Run]]:
    """Each run with the baseline's run of the same round (produce: two per round)."""
    return zip(runs, base, strict=True)


def _layout(c: BenchCluster, p: ClusterParams) -> dict[str, Any]:
    """Where each partition lives; an uneven spread is an error (it would skew the run)."""
    where = [c.master_of(name) for name in partition_names(STREAM, p.partitions)]
    per_master = [where.count(i) for i in range(c.masters)]
    if p.partitions % c.masters == 0 and len(set(per_master)) != 1:
        raise BenchError(f"partitions spread {per_master} over {c.masters} masters")
    return {"ports": [s.port for s in c.servers], "slot_ranges": c.ranges,
            "master_of_partition": where, "partitions_per_master": per_master}


def _machine() -> dict[str, Any]:
    return {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "redis_py": redis.__version__,
            "loadavg_start": [round(x, 2) for x in os.getloadavg()]}


# ---- reporting ----

LABELS: Final = {
    "produce": "produce (send_many)",
    "consume_dedup_off": "consume dedup off",
    "consume_dedup_on": "consume dedup on",
}


def _cpu(one: dict[str, Any]) -> str:
    others = one.get("others_cpu_pct")
    busiest = max(one["redis_cpu_pct_per_master"])
    return (f"{one['client_cpu_pct']:.0f} % / {one['redis_cpu_pct']:.0f} % "
            f"({busiest:.0f} %) / " + ("?" if others is None else f"{others:.0f} %"))


def _table(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the result's table (jobs/s with the ratio, and CPU)."""
    p = result["params"]
    masters = [str(m) for m in p["masters"]]
    base = str(result["baseline_masters"])
    head = ["scenario", *(f"{m} master{'' if m == '1' else 's'}" for m in masters)]
    rows = []
    for s in SCENARIOS:
        cells = []
        for m in masters:
            one = result["scenarios"][s][m]
            ratio = "" if m == base else f" ({one['ratio']:.2f}\u00d7)"
            cells.append(f"{one['jobs_per_s']:,.0f}{ratio}")
        rows.append([f"{LABELS[s]}, jobs/s", *cells])
    for s in SCENARIOS:
        rows.append([f"CPU {LABELS[s].split(' (')[0]}: clients / masters (busiest) / others",
                     *(_cpu(result["scenarios"][s][m]) for m in masters)])
    return head, rows


def render(result: dict[str, Any], console: Console) -> None:
    p = result["params"]
    head, rows = _table(result)
    t = Table(title=f"{p['partitions']} partitions, {p['producers']} producer and "
                    f"{p['workers']} worker processes; median of {p['repeats']} x "
                    f"{p['jobs']:,} jobs; ratio to {result['baseline_masters']} master(s)")
    for i, name in enumerate(head):
        t.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        t.add_row(*row)
    console.print(t)
    m = result["machine"]
    console.print(f"{m['cpus']} CPUs; load average {m['loadavg_start']} -> "
                  f"{m['loadavg_end']}; {result['runs_done_again']} round(s) run again "
                  f"(other processes over {result['params']['max_others']:g} % of a core); "
                  f"{result['seconds']} s")


def markdown(result: dict[str, Any]) -> str:
    """The result's table in markdown (for benchmarks/README.md)."""
    head, rows = _table(result)
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _masters_option(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"a comma-separated list of counts, got {value!r}") from None


@click.command("cluster")
@click.option("--jobs", type=click.IntRange(min=1), default=50_000, show_default=True,
              help="Jobs per run.")
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True,
              help="Runs per scenario and master count; figures are medians.")
@click.option("--masters", default="1,2,3", show_default=True, callback=_masters_option,
              help="The master counts to compare (one fresh cluster each).")
@click.option("--partitions", type=click.IntRange(min=2), default=6, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker processes, each serving partitions i with i % workers == w.")
@click.option("--producers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Producer processes, each sending its share of the jobs.")
@click.option("--concurrency", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--produce-batch", type=click.IntRange(min=1), default=3_000, show_default=True,
              help="Jobs per send_many call.")
@click.option("--warm-up/--no-warm-up", default=True, show_default=True,
              help="One small untimed round of each mode on every cluster first.")
@click.option("--max-others", type=click.FloatRange(min=0), default=50.0, show_default=True,
              help="A round in which other processes of the machine took more than this "
                   "CPU share (%, 100 = one core) is run again...")
@click.option("--retries", type=click.IntRange(min=0), default=2, show_default=True,
              help="...at most this many times (then the last attempt counts).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--markdown", "as_markdown", is_flag=True,
              help="Also print the README table (markdown).")
def cluster_command(jobs: int, repeats: int, masters: tuple[int, ...], partitions: int,
                    workers: int, producers: int, concurrency: int, batch_size: int,
                    produce_batch: int, warm_up: bool, max_others: float, retries: int,
                    as_json: bool, as_markdown: bool) -> None:
    """Throughput with 1, 2 and 3 Redis Cluster masters (partitions spread over them)."""
    err = Console(stderr=True)
    params = ClusterParams(jobs=jobs, repeats=repeats, masters=masters,
                           partitions=partitions, workers=workers, producers=producers,
                           concurrency=concurrency,
                           batch_size=batch_size, produce_batch=produce_batch,
                           warm_up=warm_up, max_others=max_others, retries=retries)
    try:
        result = run_cluster(params, say=lambda m: err.print(f"[dim]{m}[/dim]"))
    except StreamworkError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        render(result, Console(width=None if sys.stdout.isatty() else 130))
    if as_markdown:
        click.echo(markdown(result), err=as_json)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m benchmarks.cluster``."""
    cluster_command.main(args=list(argv) if argv is not None else sys.argv[1:],
                         prog_name="python -m benchmarks.cluster")


if __name__ == "__main__":
    main()
