"""The scaling study (`python -m benchmarks --scaling`): runs end to end with --quick's tiny
sizes and reports every section. Figures are checked for shape, never for speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from benchmarks import cli as bench_cli
from benchmarks.scaling.report import render
from benchmarks.scaling.run import SECTIONS
from benchmarks.scaling.sizes import ScalingSizes
from streamwork._redis.server import find_server_binary
from streamwork.errors import StreamworkError
from tests.conftest import no_server
from tests.helpers.optional import have_matplotlib

ROOT = Path(__file__).resolve().parent.parent
TITLES = ("1. backlog", "2. streams served by one process", "3. payload size",
          "4. worker processes", "5. Redis memory per item", "5. one worker process's RSS",
          "6. retention trimmer", "7. dashboard and")



@pytest.fixture(scope="module")
def scaling_run(tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[dict[str, Any], str, Path | None]:
    """One `python -m benchmarks --scaling --quick --json [--plot]` run, and the same
    run's tables (rendered from its JSON, as the command does without --json)."""
    try:
        find_server_binary()
    except StreamworkError as exc:
        no_server(f"the study starts its own redis-server: {exc}")
    plot = tmp_path_factory.mktemp("scaling") / "scaling.png" if have_matplotlib() else None
    args = [sys.executable, "-m", "benchmarks", "--scaling", "--quick", "--json"]
    if plot is not None:
        args += ["--plot", str(plot)]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    result = json.loads(proc.stdout)
    console = Console(record=True, width=200)
    render(result, console)
    return result, console.export_text(), plot


def test_quick_scaling_run_measures_every_section_at_every_size(
        scaling_run: tuple[dict[str, Any], str, Path | None]) -> None:
    """Every point of every section is there with a positive figure, and each streamwork
    throughput carries its ratio to the raw loop measured at the same point."""
    result, _, _ = scaling_run
    sizes = ScalingSizes.make(quick=True)
    assert all(name in result for name in SECTIONS)
    assert [r["backlog"] for r in result["backlog"]] == list(sizes.backlogs)
    for row in result["backlog"]:
        for mode in ("dedup_off", "dedup_on"):
            assert row[mode]["jobs_per_s"] > 0 and row[mode]["ratio"] > 0
            assert row[mode]["latency"]["p99_ms"] > 0
            assert row[mode]["stream_length"] >= row["backlog"]  # the backlog is still there
    assert [r["streams"] for r in result["streams"]] == list(sizes.stream_counts)
    for row in result["streams"]:
        on = row["dedup_on"]
        assert on["ratio"] > 0 and on["idle_commands_per_s"] > 0
        assert on["jobs"] == (row["jobs_per_stream"] + 1) * row["streams"]
    assert [r["jobs"] for r in result["payloads"]] == [j for _, j in sizes.payloads]
    for row in result["payloads"]:
        for key in ("produce", "dedup_off", "dedup_on"):
            assert row[key]["ratio"] > 0 and row[key]["mb_per_s"] > 0
    assert [r["processes"] for r in result["processes"]] == list(sizes.processes)
    for row in result["processes"]:
        assert row["dedup_off"]["jobs"] == sizes.processes_jobs + 1
        # the quick run's 3,000 jobs last long enough for the workers' CPU to show in whole
        # clock ticks (300 could finish within one: 0 %)
        assert row["dedup_on"]["client_cpu_pct"] > 0
    for item in ("done_record", "pending_entry", "dead_letter"):
        assert result["memory"][item]["count"] > 0
        assert result["memory"][item]["memory_usage_bytes_each"] > 0
    for mode in ("dedup_off", "dedup_on"):
        soak = result["soak"][mode]
        assert soak["samples"][-1][0] >= sizes.soak_jobs
        assert len(soak["samples"]) == sizes.soak_samples + 1
        assert all(rss > 0 for _, rss in soak["samples"])
    for row in result["trimmer"]:
        assert row["trimmed"] == row["entries"] - 1  # MINID keeps the last entry read
        assert row["step_ms"] > 0
        # one step is bounded calls: none removes more than the chunk
        assert row["calls"] >= 1 and row["trimmed"] <= row["calls"] * row["chunk"]
        assert 0 < row["longest_call_ms"] <= row["step_ms"]
    assert result["ops"]["status"] in ("ran", "absent")


def test_quick_scaling_run_prints_every_section_and_writes_the_plot(
        scaling_run: tuple[dict[str, Any], str, Path | None]) -> None:
    """The tables name every section; --plot writes one PNG."""
    result, text, plot = scaling_run
    for title in TITLES:
        assert title in text, title
    if plot is not None:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert result["plot"] == str(plot)


def test_scaling_and_peers_are_separate_runs() -> None:
    """--scaling with --peers is a usage error, before anything runs."""
    result = CliRunner().invoke(bench_cli.bench_command, ["--scaling", "--peers"])
    assert result.exit_code == 2, result.output
    assert "--scaling" in result.output
