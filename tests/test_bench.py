"""The benchmark harness (`python -m benchmarks`, `streamwork bench`): runs end to end in
--quick mode and reports every scenario. Figures are checked for shape, never for speed."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import pytest
import redis
from click.testing import CliRunner
from rich.console import Console

from benchmarks import cli as bench_cli
from benchmarks.harness import Harness
from benchmarks.measure import (
    QUICK_SWEEP,
    Params,
    Span,
    default_options,
    default_setting,
    summary,
)
from benchmarks.peers import PEERS, peers_plot_path, run_peers
from benchmarks.report import plot_peers, render, render_peers
from benchmarks.run import BUSY, GOALS, PEER_GOALS, _goals, cost
from streamwork._cli import bench as _bench_cli
from streamwork._redis.server import find_server_binary
from streamwork._worker.config import WorkerOptions
from streamwork.errors import StreamworkError
from tests.conftest import no_server
from tests.helpers.optional import have_matplotlib

ROOT = Path(__file__).resolve().parent.parent

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
    """Every throughput scenario has a positive median; streamwork's have a positive ratio
    to their matching raw baseline, from paired runs, and the consume sweeps list every
    setting tried; each consume scenario is paired at the DEFAULT options (read from
    WorkerOptions) and at the sweep's best setting."""
    result, _ = quick_run
    sc = result["scenarios"]
    defaults = WorkerOptions.concurrency, WorkerOptions.batch_size
    assert result["params"]["defaults"] == {"concurrency": defaults[0],
                                            "batch_size": defaults[1],
                                            "dedup": WorkerOptions.dedup}
    assert list(defaults) in result["params"]["sweep"]
    for name in ("raw_xadd", "raw_consume", "raw_safety", "produce"):
        assert sc[name]["jobs_per_s"] > 0, name
        assert len(sc[name]["runs_jobs_per_s"]) == result["params"]["repeats"] == 1
    paired = {"produce": sc["produce"]}
    for name in ("consume_dedup_off", "consume_dedup_on"):
        sweep = sc[name]["sweep"]
        assert [[s["concurrency"], s["batch_size"]] for s in sweep] == result["params"]["sweep"]
        assert all(s["jobs_per_s"] > 0 for s in sweep)
        best = max(sweep, key=lambda s: s["jobs_per_s"])
        assert (sc[name]["best"]["concurrency"], sc[name]["best"]["batch_size"]) == (
            best["concurrency"], best["batch_size"]), "the best pairs run the sweep's best"
        assert (sc[name]["defaults"]["concurrency"],
                sc[name]["defaults"]["batch_size"]) == defaults
        paired[f"{name}.defaults"] = sc[name]["defaults"]
        paired[f"{name}.best"] = sc[name]["best"]
    for label, row in paired.items():
        base = RATIOS[label.split(".")[0]]
        assert sc[label.split(".")[0]]["baseline"] == base
        assert row["jobs_per_s"] > 0 and row["ratio"] > 0, label
        assert len(row["pair_ratios"]) == result["params"]["repeats"]
        assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"], label
        # ratios come from paired runs (baseline and streamwork in turn); with one repeat
        # the ratio is that one pair's
        base_row = row.get("paired_baseline", sc[base])
        expected = row["jobs_per_s"] / base_row["jobs_per_s"]
        assert row["ratio"] == pytest.approx(expected, rel=0.01), label


def test_quick_run_reports_latency_commands_memory_and_goals(
        quick_run: tuple[dict[str, Any], Path | None]) -> None:
    """Latency percentiles and commands per job at the defaults and at the best setting,
    done-marker memory and every goal are in the JSON; goals are judged on the figures at
    the defaults and carry the best's beside them."""
    result, _ = quick_run
    sc = result["scenarios"]
    lat = sc["latency"]
    for mode in ("dedup_off", "dedup_on"):
        # both settings are offered the same load: a share of the mode's max (its best)
        rate = lat[mode]["offered_per_s"]
        assert rate == pytest.approx(max(10.0, result["params"]["load_fraction"]
                                         * sc["consume_" + mode]["best"]["jobs_per_s"]),
                                     abs=0.1)
        for which in ("defaults", "best"):
            one = lat[mode][which]
            setting = sc["consume_" + mode][which]
            assert (one["concurrency"], one["batch_size"]) == (setting["concurrency"],
                                                               setting["batch_size"])
            assert one["offered_per_s"] == rate
            assert 0 < one["p50_ms"] <= one["p99_ms"] <= one["max_ms"], (mode, which)
            assert one["samples"] > 0
            assert one["runs_p99_ms"] == [one["p99_ms"]]  # one repeat: its own p99
            cmd = result["commands"][mode][which]
            assert (cmd["concurrency"], cmd["batch_size"]) == (one["concurrency"],
                                                               one["batch_size"])
            assert cmd["total_per_job"] > 0
            assert cmd["round_trips_per_job"] > 0
            assert cmd["client_by_command"].get("xreadgroup", 0) > 0
    # with dedup the scripts take leases and write done-markers: more work inside Redis
    for which in ("defaults", "best"):
        assert (result["commands"]["dedup_on"][which]["inside_scripts_per_job"]
                > result["commands"]["dedup_off"][which]["inside_scripts_per_job"])
    assert result["commands"]["raw_safety"]["total_per_job"] >= 4
    mem = result["memory"]
    assert mem["markers"] > 0 and mem["memory_usage_bytes"] > 0
    assert mem["used_memory_per_10k"] > 0
    assert "peers" not in result  # without --peers: no peers section and no peer goals
    assert len(result["goals"]) == len(GOALS)
    for goal, (name, path, _, target, best_path) in zip(result["goals"], GOALS, strict=True):
        assert goal["goal"] == name and goal["target"] == target
        assert goal["measured"] is not None and goal["measured"] > 0, goal
        assert isinstance(goal["pass"], bool)
        if best_path is None:
            assert "best" not in goal and goal["judged_on"] == "run"
            continue
        # judged on the defaults: the figure at the default setting, the best's beside it
        assert goal["judged_on"] == "defaults", goal
        node: Any = result if path.startswith("commands") else sc
        for part in path.split(".")[:-1]:
            node = node[part]
        assert (node["concurrency"], node["batch_size"]) == (
            WorkerOptions.concurrency, WorkerOptions.batch_size), path
        assert goal["measured"] == node[path.rsplit(".", 1)[1]]
        best = sc["consume_dedup_on" if "dedup_on" in path else "consume_dedup_off"]["best"]
        assert goal["best"]["measured"] is not None and goal["best"]["measured"] > 0
        assert (goal["best"]["concurrency"], goal["best"]["batch_size"]) == (
            best["concurrency"], best["batch_size"]), path
    # each ratio goal (and p99 goal) shows its pairs (runs): the spread a verdict comes with
    repeats = result["params"]["repeats"]
    spread = {g[0] for g in GOALS if g[1].endswith((".ratio", ".p99_ms"))}
    spread_goals = [g for g in result["goals"] if g["goal"] in spread]
    assert len(spread_goals) == 5, [g["goal"] for g in result["goals"]]
    for goal in spread_goals:
        assert len(goal["runs"]) == repeats, goal
        assert min(goal["runs"]) <= goal["measured"] <= max(goal["runs"]), goal
        op = (lambda x, t: x >= t) if goal["op"] == ">=" else (lambda x, t: x <= t)
        assert goal["runs_passing"] == sum(op(x, goal["target"]) for x in goal["runs"])
        if "best" in goal:
            assert len(goal["best"]["runs"]) == repeats, goal


def test_quick_run_says_where_the_time_goes(
        quick_run: tuple[dict[str, Any], Path | None]) -> None:
    """At the defaults (and at the best, and for the raw loops) each consume scenario says
    the client's and redis-server's CPU per job, how busy each side (and the rest of the
    machine) was, its round trips (client-sent commands) and commands per job, and which
    side bounds it; the figures agree with the run's CPU shares and the MONITOR split."""
    result, _ = quick_run
    sc, commands = result["scenarios"], result["commands"]
    rows = {"raw_consume": (sc["raw_consume"], commands["raw_consume"]),
            "raw_safety": (sc["raw_safety"], commands["raw_safety"])}
    for mode in ("dedup_off", "dedup_on"):
        for which in ("defaults", "best"):
            rows[f"{mode}.{which}"] = (sc["consume_" + mode][which], commands[mode][which])
    for label, (row, cmd) in rows.items():
        cost = row["cost"]
        assert cost["wall_us_per_job"] > 0 and cost["client_cpu_us_per_job"] > 0, label
        assert cost["redis_cpu_us_per_job"] > 0, label
        # one run: its wall time per job is the inverse of its rate
        assert cost["wall_us_per_job"] == pytest.approx(1e6 / row["jobs_per_s"], rel=0.01)
        assert 100 * cost["client_busy"] == pytest.approx(row["client_cpu_pct"], abs=1), label
        assert 100 * cost["redis_busy"] == pytest.approx(row["redis_cpu_pct"], abs=1), label
        assert cost["round_trips_per_job"] == cmd["client_commands_per_job"] > 0, label
        assert cost["commands_per_job"] == cmd["total_per_job"], label
        assert cost["bound"] in ("client CPU", "Redis CPU", "the machine's cores",
                                 "waits (round trips, idle)"), label
        if Path("/proc/stat").exists():  # the rest of the machine's CPU is known there
            assert cost["others_busy"] >= 0 and cost["others_cpu_us_per_job"] >= 0, label
    # the raw consume loop sends one XREADGROUP and one XACK per batch of 500
    jobs, batch = result["params"]["jobs"], result["params"]["batch"]
    assert commands["raw_consume"]["client_commands_per_job"] == pytest.approx(
        2 * -(-jobs // batch) / jobs, abs=0.0001)
    assert commands["raw_safety"]["client_commands_per_job"] >= 4


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
    console = Console(record=True, width=220)
    render(result, console)
    text = console.export_text()
    for needle in ("raw naive safety loop", "consume dedup on", "p99", "batch handlers",
                   "raw redis-py loop", "handle_batch", "recovery", "one at a time",
                   "where the time goes", "judged at the DEFAULT options",
                   "PASS" if any(
            g["pass"] for g in result["goals"]) else "MISS"):
        assert needle in text
    # each consume ratio: the defaults' median [lowest-highest] at their setting, and the
    # best's with its setting; the time per job at the defaults
    sc = result["scenarios"]
    for key in ("consume_dedup_off", "consume_dedup_on"):
        for which in ("defaults", "best"):
            row = sc[key][which]
            assert (f"{row['ratio']:.2f}x [{row['ratio_min']:.2f}-{row['ratio_max']:.2f}]"
                    in text), (key, which)
            label = "consume dedup " + key.rsplit("_", 1)[1]
            setting = f"c={row['concurrency']} b={row['batch_size']}"
            assert f"{label}, {which} {setting}" in text, (key, which)
            assert f"{row['cost']['client_cpu_us_per_job']:.2f}" in text, (key, which)


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
BEST = ("streamwork_dedup_off_best", "streamwork_dedup_on_best")


def _harness(redis_url: str) -> Harness:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    return Harness(redis_url, port, Params.make(quick=True), lambda _: None)


def test_peers_scenario_measures_streamwork_and_the_ceiling_in_process(redis_url: str) -> None:
    """The in-process part of the peers scenario (no install, no network): the bare-handler
    ceiling, the bare stream loop and streamwork with dedup off and on, at the DEFAULT
    options and at the best of a sweep, each handle every job (one INCR each) and report a
    positive rate and their ratio to the ceiling; streamwork's ratios come from pairs with
    a ceiling run of their own, and its commands per job at the defaults from MONITOR."""
    h = _harness(redis_url)
    defaults = (WorkerOptions.concurrency, WorkerOptions.batch_size)
    sweep = (defaults, (4, 10))
    try:
        peers = run_peers(h, 200, 1, lambda _: None, peers=(), sweep=sweep)
    finally:
        h.close()
    assert (peers["jobs"], peers["repeats"], peers["concurrency"]) == (200, 1, 16)
    assert peers["defaults"] == {"concurrency": defaults[0], "batch_size": defaults[1]}
    assert tuple(peers["results"]) == LOCAL + BEST
    results = peers["results"]
    for name in LOCAL + BEST:
        row = results[name]
        assert row["jobs_per_s"] > 0 and row["worker_cpu_us_per_job"] > 0, name
        assert row["versions"]["redis"]
    for name in ("ceiling", "stream_floor"):
        assert results[name]["ratio"] == pytest.approx(
            results[name]["jobs_per_s"] / results["ceiling"]["jobs_per_s"], rel=0.01)
    assert results["ceiling"]["ratio"] == 1.0
    for name in LOCAL[2:] + BEST:
        row = results[name]
        # paired: one repeat, so the ratio is that pair's, against its own ceiling run
        assert row["ratio"] == pytest.approx(
            row["jobs_per_s"] / row["paired_ceiling"]["jobs_per_s"], rel=0.01), name
        assert row["pair_ratios"] == [row["ratio"]] and row["ratio_min"] == row["ratio_max"]
        assert row["dedup"] is name.startswith("streamwork_dedup_on")
    for name in LOCAL[2:]:  # the defaults' rows run WorkerOptions' defaults
        assert (results[name]["concurrency"], results[name]["batch_size"]) == defaults
        cmd = peers["commands"][name]
        assert cmd["handler_commands_per_job"] == 1.0  # one INCR per job, nothing lost
        assert cmd["client_commands_per_job"] > 1.0  # the INCR, and reading the stream
        assert results[name]["round_trips_per_job"] == cmd["client_commands_per_job"]
    for mode, name in (("dedup_off", BEST[0]), ("dedup_on", BEST[1])):
        rows = peers["sweep"][mode]
        assert [(r["concurrency"], r["batch_size"]) for r in rows] == list(sweep)
        top = max(rows, key=lambda r: r["jobs_per_s"])
        assert (results[name]["concurrency"], results[name]["batch_size"]) == (
            top["concurrency"], top["batch_size"])
    assert set(peers["commands"]) == set(LOCAL[2:])


def test_the_defaults_are_read_from_worker_options_at_run_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting measured as 'the defaults' is WorkerOptions' when the bench runs: a
    changed default is what the bench measures, and it joins the sweep."""
    monkeypatch.setattr(WorkerOptions, "concurrency", 7)
    monkeypatch.setattr(WorkerOptions, "batch_size", 33)
    assert default_setting() == (7, 33)
    assert default_options() == {"concurrency": 7, "batch_size": 33,
                                 "dedup": WorkerOptions.dedup}
    for quick in (False, True):
        assert Params.make(quick=quick).sweep[0] == (7, 33)
    monkeypatch.undo()
    assert default_setting() in Params.make(quick=True).sweep
    assert set(QUICK_SWEEP) <= set(Params.make(quick=True).sweep)


def test_cost_names_the_side_that_bounds_a_run() -> None:
    """cost(): per-job CPU over per-job wall time is each side's busy share; the side at
    least BUSY busy is the bound, both together over the machine's cores, else waits."""
    def row(wall: float, client: float, server: float) -> dict[str, Any]:
        return {"wall_us_per_job": wall, "client_cpu_us_per_job": client,
                "redis_cpu_us_per_job": server}

    cmd = {"client_commands_per_job": 0.04, "total_per_job": 3.0}
    out = cost(row(10.0, 9.5, 2.0), cmd, 2)
    assert (out["client_busy"], out["redis_busy"], out["bound"]) == (0.95, 0.2, "client CPU")
    assert (out["round_trips_per_job"], out["commands_per_job"]) == (0.04, 3.0)
    assert cost(row(10.0, 5.0, 9.0), cmd, 2)["bound"] == "Redis CPU"
    # neither side alone, but together they fill the cores there are (one here)
    assert cost(row(10.0, 5.0, 4.0), cmd, 1)["bound"] == "the machine's cores"
    assert cost(row(10.0, 5.0, 4.0), cmd, 2)["bound"] == "waits (round trips, idle)"
    # or other processes took the rest of the machine's cores
    busy = cost({**row(10.0, 5.0, 4.0), "others_cpu_us_per_job": 9.0}, cmd, 2)
    assert (busy["others_busy"], busy["bound"]) == (0.9, "the machine's cores")
    idle = cost({**row(10.0, 5.0, 4.0), "others_cpu_us_per_job": 1.0}, cmd, 2)
    assert (idle["others_busy"], idle["bound"]) == (0.1, "waits (round trips, idle)")
    assert cost(row(10.0, 10 * BUSY - 0.1, 1.0), None, 2)["bound"].startswith("waits")
    assert "round_trips_per_job" not in cost(row(10.0, 1.0, 1.0), None, 2)


def test_goals_are_judged_at_the_defaults_with_the_best_beside_them() -> None:
    """A goal's verdict is its figure at the default options: a best setting that meets
    the target does not make a missing default pass, and the other way round."""
    def scenario(defaults: float, best: float) -> dict[str, Any]:
        return {"defaults": {"ratio": defaults, "concurrency": 16, "batch_size": 100,
                             "pair_ratios": [defaults / 2, defaults, defaults * 2]},
                "best": {"ratio": best, "concurrency": 256, "batch_size": 500,
                         "pair_ratios": [best]}}

    result = {"scenarios": {"consume_dedup_off": scenario(0.3, 0.6),
                            "consume_dedup_on": scenario(2.5, 1.5)}}
    goals = {g["goal"]: g for g in _goals(result)}
    off = goals["consume dedup off >= 0.5x raw XREADGROUP+XACK"]
    assert (off["measured"], off["pass"], off["judged_on"]) == (0.3, False, "defaults")
    assert off["best"] == {"measured": 0.6, "pass": True, "concurrency": 256,
                           "batch_size": 500, "runs": [0.6]}
    assert (off["runs"], off["runs_passing"]) == ([0.15, 0.3, 0.6], 1)
    on = goals["consume dedup on >= 2x naive safety loop"]
    assert (on["measured"], on["pass"], on["best"]["pass"]) == (2.5, True, False)
    assert goals["send_many >= 2x raw pipelined XADD"]["measured"] is None


def _fake_peers() -> dict[str, Any]:
    rows: dict[str, Any] = {
        name: {"jobs_per_s": rate, "ratio": rate / 1000, "worker_cpu_pct": 90.0,
               "redis_cpu_pct": 10.0, "versions": {"redis": "8.1.0"}, "config": "c"}
        for name, rate in (("ceiling", 1000.0), ("streamwork_dedup_off", 950.0),
                           ("streamwork_dedup_on", 650.0), ("streamwork_dedup_off_best", 990.0),
                           ("streamwork_dedup_on_best", 850.0), ("arq", 100.0))}
    for name, pairs in (("streamwork_dedup_off", [0.95, 0.88, 1.01]),
                        ("streamwork_dedup_on", [0.65, 0.81, 0.6]),
                        ("streamwork_dedup_off_best", [0.99]),
                        ("streamwork_dedup_on_best", [0.85])):
        best = name.endswith("_best")
        rows[name].update(pair_ratios=pairs, ratio_min=min(pairs), ratio_max=max(pairs),
                          concurrency=64 if best else 16, batch_size=500 if best else 100,
                          worker_cpu_us_per_job=50.0, redis_cpu_us_per_job=12.5,
                          round_trips_per_job=1.04)
    rows["arq"]["round_ratios"] = [0.1, 0.11, 0.09]
    rows["rq"] = {"requirements": ["rq==2.12.0"], "error": "n/a: pip install failed: boom"}
    return {"jobs": 100, "repeats": 1, "concurrency": 16, "results": rows, "seconds": 1.0}


def test_peer_goals_count_only_when_the_peers_scenario_ran() -> None:
    """Without a peers section the goals are GOALS (none missing for lack of data); with it,
    the two peer goals follow, judged on streamwork's ratios to the ceiling at the
    defaults, the best setting's beside them."""
    assert [g["goal"] for g in _goals({"scenarios": {}})] == [g[0] for g in GOALS]
    goals = _goals({"scenarios": {}, "peers": _fake_peers()})
    assert len(goals) == len(GOALS) + len(PEER_GOALS)
    off, on = goals[-2:]
    assert (off["measured"], off["pass"]) == (0.95, True)
    assert (on["measured"], on["pass"]) == (0.65, False)
    # each pair's ratio comes along: how many pairs alone would have passed
    assert (off["runs"], off["runs_passing"]) == ([0.95, 0.88, 1.01], 2)
    assert (on["runs"], on["runs_passing"]) == ([0.65, 0.81, 0.6], 1)
    assert (on["best"]["measured"], on["best"]["pass"], on["best"]["concurrency"]) == (
        0.85, True, 64)


def test_peers_table_and_bar_chart_show_every_contender_and_failures(tmp_path: Path) -> None:
    """The peers table lists each contender with its ratio to the ceiling (streamwork's
    with its pairs' spread and its setting) and a failed peer with its reason; --plot's
    bar chart lands next to the main PNG."""
    result = {"date": "2026-12-01", "machine": {"cpus": 2}, "peers": _fake_peers()}
    console = Console(record=True, width=200)
    render_peers(result["peers"], console)
    text = console.export_text()
    for needle in ("bare-handler ceiling", "streamwork dedup off, defaults c=16 b=100",
                   "0.95x [0.88-1.01]", "streamwork dedup on, best c=64 b=500",
                   "0.85x [0.85-0.85]", "50.0 / 12.5", "arq", "0.10x",
                   "n/a: pip install failed: boom"):
        assert needle in text, needle
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


def test_a_span_takes_the_whole_machines_cpu(redis_url: str) -> None:
    """Span measures the whole machine's CPU (/proc/stat) beside its own and Redis's: a
    busy loop in this process is in both, and summary() names what the rest took."""
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat here")
    r = redis.Redis.from_url(redis_url)
    try:
        span = Span(r)
        span.start()
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        run = span.stop(100)
    finally:
        r.close()
    assert run.client_cpu >= 0.3
    assert run.machine_cpu is not None
    assert run.machine_cpu >= 0.9 * run.client_cpu  # the clock ticks are coarser
    figures = summary([run])
    assert figures["others_cpu_us_per_job"] == pytest.approx(
        1e6 * max(0.0, run.machine_cpu - run.client_cpu - run.redis_cpu) / 100, abs=0.01)
