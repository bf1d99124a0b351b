"""The ``bench`` click command: ``python -m benchmarks`` runs it, and so does
``streamwork bench`` from a source checkout (``streamwork/_cli/bench.py`` loads it)."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Sequence

import click
from rich.console import Console

from benchmarks.measure import Params
from benchmarks.peers import peers_plot_path
from benchmarks.report import plot, plot_peers, render
from benchmarks.run import run_bench
from streamwork import StreamworkError

__all__ = ["bench_command", "main"]


@click.command("bench")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Write throughput by concurrency/batch size to FILE.png (needs matplotlib).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per scenario; figures are medians.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Jobs per run (default 20000, 600 with --quick).")
@click.option("--quick", is_flag=True, help="Small runs and a short sweep (for tests).")
@click.option("--peers", "peers", is_flag=True,
              help="Also run the peers scenario: the same protocol through taskiq-redis, "
                   "dramatiq, arq and rq (each pip-installed on first use into a cached "
                   "throwaway virtualenv), streamwork and the bare-handler ceiling.")
@click.option("--peers-jobs", type=click.IntRange(min=1), default=5000, show_default=True,
              help="Jobs per run of the peers scenario.")
@click.option("--batch-handlers/--no-batch-handlers", "batch_handlers", default=True,
              show_default=True,
              help="The batch-handler section: handle_batch vs handle, dedup on and off, "
                   "and a raw redis-py loop doing the same work (about 20 s).")
@click.option("--recovery/--no-recovery", "recovery", default=True, show_default=True,
              help="The recovery section: jobs/s in 1-s buckets around the SIGKILL of one "
                   "of two workers, batch reclaim vs one at a time (about 25 s).")
@click.option("--scaling", is_flag=True,
              help="Run the scaling study instead: cost against backlog, streams per "
                   "process, payload size, processes, memory, the trimmer (--quick: tiny "
                   "sizes; --plot: one PNG of every curve).")
@click.option("--url", default=None, hidden=True,
              help="A Redis the bench may FLUSHALL, instead of its own redis-server.")
def bench_command(as_json: bool, plot_path: str | None, repeats: int, jobs: int | None,
                  quick: bool, peers: bool, peers_jobs: int, batch_handlers: bool,
                  recovery: bool, scaling: bool, url: str | None) -> None:
    """Benchmark streamwork against raw redis-py on a private redis-server."""
    if scaling and peers:
        raise click.UsageError("--scaling and --peers are separate runs: give one")
    if plot_path:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            raise click.ClickException("--plot needs matplotlib: pip install matplotlib") from None
    err = Console(stderr=True)
    if scaling:
        _scaling(as_json, plot_path, quick, url, err)
        return
    try:
        params = Params.make(jobs=jobs, repeats=repeats, quick=quick)
        result = run_bench(params, say=lambda m: err.print(f"[dim]{m}[/dim]"), url=url,
                           peers_jobs=peers_jobs if peers else None,
                           batch_handlers=batch_handlers, recovery=recovery)
        if plot_path:
            plot(result, plot_path)
            result["plot"] = plot_path
            if "peers" in result:
                result["plot_peers"] = plot_peers(result, peers_plot_path(plot_path))
    except StreamworkError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        render(result, Console(width=None if sys.stdout.isatty() else 110))
        for key in ("plot", "plot_peers"):
            if key in result:
                click.echo(f"plot written to {result[key]}")


def _scaling(as_json: bool, plot_path: str | None, quick: bool, url: str | None,
             err: Console) -> None:
    """``--scaling``: the scaling study (``benchmarks/scaling/``), its tables or JSON."""
    from benchmarks.scaling import report as scaling_report
    from benchmarks.scaling.run import run_scaling
    from benchmarks.scaling.sizes import ScalingSizes

    try:
        result = run_scaling(ScalingSizes.make(quick=quick),
                             say=lambda m: err.print(f"[dim]{m}[/dim]"), url=url)
        if plot_path:
            scaling_report.plot(result, plot_path)
            result["plot"] = plot_path
    except StreamworkError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        scaling_report.render(result, Console(width=None if sys.stdout.isatty() else 160))
        if plot_path:
            click.echo(f"plot written to {plot_path}")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m benchmarks``."""
    bench_command.main(args=list(argv) if argv is not None else sys.argv[1:],
                       prog_name="python -m benchmarks")
