"""The benchmark harness (`python -m benchmarks`, `streamwork bench`): runs end to end in
--quick mode and reports every scenario. Figures are checked for shape, never for speed."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from benchmarks import cli as bench_cli
from benchmarks.harness import Harness
from benchmarks.measure import Params
from benchmarks.peers import PEERS, peers_plot_path, run_peers
from benchmarks.report import plot_peers, render, render_peers
from benchmarks.run import GOALS, PEER_GOALS, _goals
from streamwork._cli import bench as _bench_cli
from streamwork._redis.server import find_server_binary
from streamwork.errors import StreamworkError
from tests.conftest import no_server
from tests.helpers.optional import have_matplotlib

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = ("raw_xadd", "raw_consume", "raw_safety", "produce", "consume_dedup_off",
             "consume_dedup_on")
RATIOS = {"produce": "raw_xadd", "consume_dedup_off": "raw_consume",
          "consume_dedup_on": "raw_safety"}



@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path | None]:
    """One `python -m benchmarks --quick --repeats 1 --json [--plot]` run for the module."""
    try:
        find_server_binary()
    except StreamworkError as exc:
        no_server(f"the bench starts its own redis-server: {exc}")
    plot = tmp_path_factory.mktemp("bench") / "bench.png" if have_matplotlib() else None
    args = [sys.executable, "-m", "benchmarks", "--quick", "--repeats", "1", "--json"]
    if plot is not None:
        args += ["--plot", str(plot)]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, timeout=170, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return json.loads(proc.stdout), plot


def test_quick_run_reports_every_scenario_with_positive_figures(
        quick_run: tuple[dict[str, Any], Path | None]) -> None:
    """Every throughput scenario has a positive median; streamwork's three have a positive
    ratio to their matching raw baseline, from paired runs, and the consume sweeps list
    every setting tried; the paired run uses the sweep's best setting."""
    result, _ = quick_run
    sc = result["scenarios"]
    for name in SCENARIOS:
        assert sc[name]["jobs_per_s"] > 0, name
        assert len(sc[name]["runs_jobs_per_s"]) == result["params"]["repeats"] == 1
    for name, baseline in RATIOS.items():
        assert sc[name]["baseline"] == baseline
        assert sc[name]["ratio"] > 0, name
        # ratios come from paired runs (baseline and streamwork in turn); with one repeat
        # the ratio is that one pair's
        paired = sc[name].get("paired_baseline", sc[baseline])
        expected = sc[name]["jobs_per_s"] / paired["jobs_per_s"]
        assert sc[name]["ratio"] == pytest.approx(expected, rel=0.01)
    for name in ("consume_dedup_off", "consume_dedup_on"):
        sweep = sc[name]["sweep"]
        assert [[s["concurrency"], s["batch_size"]] for s in sweep] == result["params"]["sweep"]
        assert all(s["jobs_per_s"] > 0 for s in sweep)
        best = max(sweep, key=lambda s: s["jobs_per_s"])
        assert (sc[name]["concurrency"], sc[name]["batch_size"]) == (
            best["concurrency"], best["batch_size"]), "the pair runs the sweep's best setting"


def test_quick_run_reports_latency_commands_memory_and_goals(
        quick_run: tuple[dict[str, Any], Path | None]) -> None:
    """Latency percentiles, commands per job, done-marker memory and every goal of the
    issue are in the JSON; goals carry a measured value and a PASS/MISS verdict."""
    result, _ = quick_run
    lat = result["scenarios"]["latency"]
    assert lat["offered_per_s"] > 0
    for mode in ("dedup_off", "dedup_on"):
        assert 0 < lat[mode]["p50_ms"] <= lat[mode]["p99_ms"] <= lat[mode]["max_ms"]
        assert lat[mode]["samples"] > 0
        cmd = result["commands"][mode]
        assert cmd["total_per_job"] > 0
        assert cmd["round_trips_per_job"] > 0
        assert cmd["client_by_command"].get("xreadgroup", 0) > 0
    # with dedup the scripts take leases and write done-markers: more work inside Redis
    assert (result["commands"]["dedup_on"]["inside_scripts_per_job"]
            > result["commands"]["dedup_off"]["inside_scripts_per_job"])
    assert result["commands"]["raw_safety"]["total_per_job"] >= 4
    mem = result["memory"]
    assert mem["markers"] > 0 and mem["memory_usage_bytes"] > 0
    assert mem["used_memory_per_10k"] > 0
    assert "peers" not in result  # without --peers: no peers section and no peer goals
    assert len(result["goals"]) == len(GOALS)
    for goal in result["goals"]:
        assert goal["measured"] is not None and goal["measured"] > 0, goal
        assert isinstance(goal["pass"], bool)
    # each ratio goal shows its pairs: the spread one run's verdict comes with
    repeats = result["params"]["repeats"]
    ratios = {name for name, path, _, _ in GOALS if path.endswith(".ratio")}
    ratio_goals = [g for g in result["goals"] if g["goal"] in ratios]
    assert len(ratio_goals) == 3, [g["goal"] for g in result["goals"]]
    for goal in ratio_goals:
        assert len(goal["runs"]) == repeats, goal
        assert min(goal["runs"]) <= goal["measured"] <= max(goal["runs"]), goal
        assert goal["runs_passing"] == sum(x >= goal["target"] for x in goal["runs"])


def test_quick_run_reports_batch_handlers_against_handle_and_a_raw_loop(
        quick_run: tuple[dict[str, Any], Path | None]) -> None:
    """The batch-handler section is in the default run: handle and handle_batch, dedup on
    and off, each with its jobs/s, messages per call and ratio to the raw redis-py loop of
    the same repeat; handle_batch also as a ratio to handle with the same dedup."""
    result, _ = quick_run
    assert result["params"]["batch_handlers"] is True
    section = result["batch_handlers"]
    rows = section["results"]
    assert section["baseline"] == "raw_batch" and rows["raw_batch"]["jobs_per_s"] > 0
    assert section["repeats"] == len(rows["raw_batch"]["runs_jobs_per_s"]) == 1
    for dedup in ("on", "off"):
        handle, batch = rows[f"handle_dedup_{dedup}"], rows[f"handle_batch_dedup_{dedup}"]
        for row in (handle, batch):
            assert row["jobs_per_s"] > 0 and row["ratio_to_raw"] > 0, row
            assert row["ratio_to_raw"] == pytest.approx(
                row["jobs_per_s"] / rows["raw_batch"]["jobs_per_s"], rel=0.01, abs=0.001)
        assert handle["messages_per_call"] == 1
        assert 1 <= batch["messages_per_call"] <= section["batch_max"]
        assert batch["ratio_to_handle"] == pytest.approx(
            batch["jobs_per_s"] / handle["jobs_per_s"], rel=0.01)


def test_quick_run_reports_recovery_around_the_kill(
        quick_run: tuple[dict[str, Any], Path | None]) -> None:
    """The recovery section is in the default run: both reclaim modes, jobs/s per second
    from 2 s before the kill, a pre-kill level from whole seconds before it, the dip as a
    ratio to that level, and the deliveries the killed worker held."""
    result, _ = quick_run
    assert result["params"]["recovery"] is True
    section = result["recovery"]
    assert section["plan"]["after"] > 0 and section["plan"]["kill_at"] > 0
    assert set(section["modes"]) == {"batches", "one_at_a_time"}
    for name, m in section["modes"].items():
        assert m["first_second"] == -2 and len(m["series"]) >= 3, (name, m)
        assert m["pre_kill_buckets"] >= 1 and m["pre_kill_per_s"] > 0, (name, m)
        assert m["min_after_kill_per_s"] == min(m["series"][2:])
        assert m["dip_ratio"] == pytest.approx(
            m["min_after_kill_per_s"] / m["pre_kill_per_s"], rel=0.01, abs=0.001)
        assert m["held"] > 0 and m["lost_s"] >= 0, (name, m)
    assert section["modes"]["batches"]["max_deliveries"] > 2
    assert section["modes"]["one_at_a_time"]["max_deliveries"] == 2


def test_batch_handlers_and_recovery_can_be_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-batch-handlers / --no-recovery reach the run; both are on by default."""
    seen: list[dict[str, Any]] = []

    def record(*args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.append(kwargs)
        raise StreamworkError("stop here")

    monkeypatch.setattr(bench_cli, "run_bench", record)
    for args, expected in (([], (True, True)), (["--no-recovery"], (True, False)),
                           (["--no-batch-handlers", "--no-recovery"], (False, False))):
        result = CliRunner().invoke(bench_cli.bench_command, ["--quick", *args])
        assert result.exit_code == 1 and "stop here" in result.output, result.output
        assert (seen[-1]["batch_handlers"], seen[-1]["recovery"]) == expected


def test_quick_run_writes_the_plot_and_renders_tables(
        quick_run: tuple[dict[str, Any], Path | None]) -> None:
    """--plot writes a PNG; the rich tables render from the JSON result."""
    result, plot = quick_run
    if plot is not None:
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert result["plot"] == str(plot)
    console = Console(record=True, width=120)
    render(result, console)
    text = console.export_text()
    for needle in ("raw naive safety loop", "consume dedup on", "p99", "batch handlers",
                   "raw redis-py loop", "handle_batch", "recovery", "one at a time",
                   "PASS" if any(
            g["pass"] for g in result["goals"]) else "MISS"):
        assert needle in text


def test_register_adds_bench_to_a_cli_group() -> None:
    """register() adds a `bench` command with the documented options."""

    @click.group()
    def group() -> None:
        pass

    _bench_cli.register(group)
    result = CliRunner().invoke(group, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--json", "--plot", "--repeats", "--jobs", "--quick", "--peers",
                   "--peers-jobs", "--no-batch-handlers", "--no-recovery"):
        assert option in result.output


def test_plot_without_matplotlib_names_the_install(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """--plot without matplotlib fails at once, before any server starts, saying how to
    install it."""
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(bench_cli.importlib, "import_module", fake)
    monkeypatch.setattr(bench_cli, "run_bench", lambda *a, **k: pytest.fail("ran the bench"))
    result = CliRunner().invoke(bench_cli.bench_command, ["--quick", "--plot",
                                                          str(tmp_path / "x.png")])
    assert result.exit_code != 0
    assert "pip install matplotlib" in result.output


def test_bad_parameters_are_refused() -> None:
    """--repeats 0 / --jobs 0 are usage errors, not a crash."""
    for args in (["--repeats", "0"], ["--jobs", "0"]):
        result = CliRunner().invoke(bench_cli.bench_command, args)
        assert result.exit_code == 2, result.output


def test_streamwork_bench_parses_with_the_harness_options() -> None:
    """`streamwork bench` hands its arguments to the harness's command: a bad value is a
    usage error naming the option, with the usage line of `bench`."""

    @click.group()
    def group() -> None:
        pass

    _bench_cli.register(group)
    result = CliRunner().invoke(group, ["bench", "--repeats", "0"])
    assert result.exit_code == 2, result.output
    assert "Usage: group bench [OPTIONS]" in result.output
    assert "'--repeats'" in result.output


def test_streamwork_bench_without_a_source_checkout_says_how_to_run_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the top-level `benchmarks` package (an installed wheel), `streamwork bench`
    fails with a click error that says to run `python -m benchmarks` from a checkout."""
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> Any:
        if name.split(".")[0] == "benchmarks":
            raise ModuleNotFoundError(f"No module named {name!r}", name="benchmarks")
        return real(name, package)

    @click.group()
    def group() -> None:
        pass

    _bench_cli.register(group)
    monkeypatch.setattr(_bench_cli.importlib, "import_module", fake)
    result = CliRunner().invoke(group, ["bench", "--quick"])
    assert result.exit_code == 1, result.output
    assert "source checkout" in result.output
    assert "python -m benchmarks" in result.output


def test_importing_streamwork_and_its_cli_help_leave_the_harness_unloaded() -> None:
    """`import streamwork` and `streamwork --help` never import the `benchmarks` harness."""
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "import streamwork, streamwork._cli.main\n"
        "result = CliRunner().invoke(streamwork._cli.main.main, ['--help'])\n"
        "assert result.exit_code == 0 and 'bench' in result.output, result.output\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'benchmarks')\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]


# ---- the peers scenario ----

LOCAL = ("ceiling", "stream_floor", "streamwork_dedup_off", "streamwork_dedup_on")


def _harness(redis_url: str) -> Harness:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    return Harness(redis_url, port, Params.make(quick=True), lambda _: None)


def test_peers_scenario_measures_streamwork_and_the_ceiling_in_process(redis_url: str) -> None:
    """The in-process part of the peers scenario (no install, no network): the bare-handler
    ceiling, the bare stream loop and streamwork with dedup off and on each handle every job
    (one INCR each) and report a positive rate and their ratio to the ceiling."""
    h = _harness(redis_url)
    try:
        peers = run_peers(h, 200, 1, lambda _: None, peers=())
        assert int(h.r.get("peers:handled") or 0) == 200  # the last run's INCRs
    finally:
        h.close()
    assert (peers["jobs"], peers["repeats"], peers["concurrency"]) == (200, 1, 16)
    assert tuple(peers["results"]) == LOCAL
    for name in LOCAL:
        row = peers["results"][name]
        assert row["jobs_per_s"] > 0, name
        assert row["ratio"] == pytest.approx(
            row["jobs_per_s"] / peers["results"]["ceiling"]["jobs_per_s"], rel=0.01)
        assert row["versions"]["redis"]
    assert peers["results"]["ceiling"]["ratio"] == 1.0


def _fake_peers() -> dict[str, Any]:
    rows: dict[str, Any] = {
        name: {"jobs_per_s": rate, "ratio": rate / 1000, "worker_cpu_pct": 90.0,
               "redis_cpu_pct": 10.0, "versions": {"redis": "8.1.0"}, "config": "c"}
        for name, rate in (("ceiling", 1000.0), ("streamwork_dedup_off", 950.0),
                           ("streamwork_dedup_on", 650.0), ("arq", 100.0))}
    rows["streamwork_dedup_off"]["round_ratios"] = [0.95, 0.88, 1.01]
    rows["streamwork_dedup_on"]["round_ratios"] = [0.65, 0.81, 0.6]
    rows["rq"] = {"requirements": ["rq==2.12.0"], "error": "n/a: pip install failed: boom"}
    return {"jobs": 100, "repeats": 1, "concurrency": 16, "results": rows, "seconds": 1.0}


def test_peer_goals_count_only_when_the_peers_scenario_ran() -> None:
    """Without a peers section the goals are GOALS (none missing for lack of data); with it,
    the two peer goals follow, judged on streamwork's ratios to the ceiling."""
    assert [g["goal"] for g in _goals({"scenarios": {}})] == [g[0] for g in GOALS]
    goals = _goals({"scenarios": {}, "peers": _fake_peers()})
    assert len(goals) == len(GOALS) + len(PEER_GOALS)
    off, on = goals[-2:]
    assert (off["measured"], off["pass"]) == (0.95, True)
    assert (on["measured"], on["pass"]) == (0.65, False)
    # each round's ratio comes along: how many rounds alone would have passed
    assert (off["runs"], off["runs_passing"]) == ([0.95, 0.88, 1.01], 2)
    assert (on["runs"], on["runs_passing"]) == ([0.65, 0.81, 0.6], 1)


def test_peers_table_and_bar_chart_show_every_contender_and_failures(tmp_path: Path) -> None:
    """The peers table lists each contender with its ratio to the ceiling and a failed peer
    with its reason; --plot's bar chart lands next to the main PNG."""
    result = {"date": "2026-12-01", "machine": {"cpus": 2}, "peers": _fake_peers()}
    console = Console(record=True, width=160)
    render_peers(result["peers"], console)
    text = console.export_text()
    for needle in ("bare-handler ceiling", "streamwork dedup off", "0.95x", "arq",
                   "n/a: pip install failed: boom"):
        assert needle in text
    assert peers_plot_path(str(tmp_path / "bench.png")) == str(tmp_path / "bench-peers.png")
    if have_matplotlib():
        out = plot_peers(result, peers_plot_path(str(tmp_path / "bench.png")))
        assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(not os.environ.get("STREAMWORK_BENCH_PEERS"),
                    reason="installs taskiq-redis, dramatiq, arq and rq from the package "
                           "registry: set STREAMWORK_BENCH_PEERS=1 to run it")
def test_peers_scenario_installs_and_runs_every_peer(redis_url: str) -> None:
    """Every peer installs into its throwaway virtualenv and handles every job (network)."""
    h = _harness(redis_url)
    try:
        peers = run_peers(h, 300, 1, lambda _: None)
    finally:
        h.close()
    for peer in PEERS:
        row = peers["results"][peer.name]
        assert "error" not in row, row
        assert row["jobs_per_s"] > 0 and row["ratio"] > 0, peer.name
        assert row["versions"], peer.name


def test_ops_scale_measures_the_page_and_inspect() -> None:
    """`python -m benchmarks.scenarios.ops_scale --streams 30 --json` runs end to end: every
    row has its figures, and the page, a sample and inspect each cost the same commands
    (one read of every stream)."""
    try:
        find_server_binary()
    except StreamworkError as exc:
        no_server(f"the scenario starts its own redis-server: {exc}")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.scenarios.ops_scale", "--streams",
                           "30", "--json"], cwd=ROOT, capture_output=True, timeout=170,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    out = proc.stdout.decode()
    assert "| 30 | dashboard GET / (warm) |" in out
    figures = json.loads(out[out.index("\n{") + 1:])["results"]["30"]
    for what in ("page_cold", "page_warm", "sample", "inspect_fn", "inspect_cli",
                 "inspect_json"):
        f = figures[what]
        assert f["s"] > 0 and f["commands"] > 0 and f["slowlog_max_ms"] >= 0, what
    reads = {figures[w]["commands"] - figures["inspect_fn"]["commands"]
             for w in ("page_warm", "sample", "inspect_cli", "inspect_json")}
    assert max(reads) <= 6, figures  # the page: + its dead letters; the CLI: + connecting
    assert figures["page_warm"]["bytes"] > 10_000
