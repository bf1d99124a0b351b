"""The result for people: rich tables (:func:`render`), a throughput plot (:func:`plot`) and,
after ``--peers``, a bar chart of the peers scenario (:func:`plot_peers`)."""

from __future__ import annotations

import importlib
from typing import Any

from rich.console import Console
from rich.table import Table

from streamwork.errors import BenchError

__all__ = ["PEER_LABELS", "peer_rows", "plot", "plot_peers", "render",
           "render_batch_handlers", "render_peers", "render_recovery"]


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


#: display names of the peers scenario's contenders (others keep their key)
PEER_LABELS = {"ceiling": "bare-handler ceiling", "stream_floor": "bare stream loop",
               "streamwork_dedup_off": "streamwork dedup off, defaults",
               "streamwork_dedup_on": "streamwork dedup on, defaults",
               "streamwork_dedup_off_best": "streamwork dedup off, best",
               "streamwork_dedup_on_best": "streamwork dedup on, best"}


def peer_rows(peers: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(display name, result row) of every contender, in the order they ran."""
    return [(PEER_LABELS.get(k, k), v) for k, v in peers["results"].items()]


def _versions(row: dict[str, Any]) -> str:
    return " ".join(f"{k} {v}" for k, v in row.get("versions", {}).items())


def render_peers(peers: dict[str, Any], console: Console) -> None:
    """The peers table: jobs/s, ratio to the ceiling (streamwork's: paired, with the
    pairs' spread), CPU per job, versions; n/a with its reason."""
    table = Table(title=f"peers: one worker process, handler = one INCR, "
                        f"{peers['jobs']:,} jobs/run, median of {peers['repeats']}")
    table.add_column("framework")
    table.add_column("jobs/s", justify="right")
    table.add_column("x ceiling", justify="right")
    table.add_column("cpu worker/redis", justify="right")
    table.add_column("cpu us/job worker/redis/others", justify="right")
    table.add_column("round trips/job", justify="right")
    table.add_column("versions")
    for label, row in peer_rows(peers):
        if "jobs_per_s" not in row:
            table.add_row(label, row.get("error", "n/a"), "", "", "", "", "")
            continue
        if "concurrency" in row:
            label += f" {_setting(row)}"
        per_job = (f"{row['worker_cpu_us_per_job']:.1f} / {row['redis_cpu_us_per_job']:.1f}"
                   if "worker_cpu_us_per_job" in row else "")
        if "others_cpu_us_per_job" in row:
            per_job += f" / {row['others_cpu_us_per_job']:.1f}"
        trips = (f"{row['round_trips_per_job']:.4f}" if "round_trips_per_job" in row else "")
        table.add_row(label, _fmt_rate(row["jobs_per_s"]), _spread(row),
                      f"{row['worker_cpu_pct']:.0f}% / {row['redis_cpu_pct']:.0f}%",
                      per_job, trips, _versions(row))
    console.print(table)


def render_batch_handlers(section: dict[str, Any], console: Console) -> None:
    """handle vs handle_batch, dedup on and off: jobs/s, messages per call, and the ratios
    to handle (same dedup) and to the raw redis-py loop of the same repeat."""
    table = Table(title=f"batch handlers: one HSET per message vs one per call "
                        f"(batch_max {section['batch_max']}), {section['jobs']:,} jobs or "
                        f"{section['window_s']:g} s a run, median of {section['repeats']}, "
                        "a streamwork run process")
    for name, justify in (("handler", "left"), ("dedup", "left"), ("jobs/s", "right"),
                          ("msgs/call", "right"), ("x handle", "right"),
                          ("x raw loop", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    rows = section["results"]
    raw = rows["raw_batch"]
    table.add_row("raw redis-py loop (XREADGROUP, HSET+INCR+XACK per batch)", "",
                  _fmt_rate(raw["jobs_per_s"]), str(section["batch_max"]), "", "1.00x")
    for key, row in rows.items():
        if key == "raw_batch":
            continue
        versus = f"{row['ratio_to_handle']:.2f}x" if "ratio_to_handle" in row else ""
        table.add_row(row["handler"], "on" if row["dedup"] else "off",
                      _fmt_rate(row["jobs_per_s"]), f"{row['messages_per_call']:.1f}",
                      versus, f"{row['ratio_to_raw']:.2f}x")
    console.print(table)


def render_recovery(section: dict[str, Any], console: Console) -> None:
    """Jobs done per second around the SIGKILL, each mode a row, with its dip as a ratio
    to its pre-kill level, the seconds of work it lost, and the deliveries the killed
    worker held (``held``) and still owned when the watch ended (``left``)."""
    modes = section["modes"]
    plan = section["plan"]
    width = max(len(m["series"]) for m in modes.values())
    table = Table(title=f"recovery: jobs/s around the SIGKILL of one of two workers "
                        f"(second 0 holds the kill; visibility timeout "
                        f"{plan['visibility_timeout']:g} s)")
    table.add_column("reclaim")
    for i in range(width):
        table.add_column(str(i - 2), justify="right")
    for name in ("pre-kill", "lowest", "dip", "lost s", "held", "left"):
        table.add_column(name, justify="right")
    for name, m in modes.items():
        cells = [str(x) for x in m["series"]] + [""] * (width - len(m["series"]))
        table.add_row(name.replace("_", " ") + (" (ran dry)" if m["ran_dry"] else ""),
                      *cells, _fmt_rate(m["pre_kill_per_s"]),
                      _fmt_rate(m["min_after_kill_per_s"]), f"{m['dip_ratio']:.2f}x",
                      f"{m['lost_s']:.2f}", str(m["held"]),
                      str(m["left_with_the_killed_worker"]))
    console.print(table)


def _spread(row: dict[str, Any]) -> str:
    """``0.52x [0.48-0.57]``: a ratio's median over its pairs and their lowest and highest."""
    if "ratio" not in row:
        return ""
    if "ratio_min" in row:
        return f"{row['ratio']:.2f}x [{row['ratio_min']:.2f}-{row['ratio_max']:.2f}]"
    return f"{row['ratio']:.2f}x"


def _setting(row: dict[str, Any]) -> str:
    return f"c={row['concurrency']} b={row['batch_size']}" if "concurrency" in row else ""


#: the ratios reported at the defaults and at the sweep's best: label, where, baseline
CONSUME_RATIOS = (("consume dedup off", "consume_dedup_off", "raw XREADGROUP+XACK"),
                  ("consume dedup on", "consume_dedup_on", "naive safety loop"))
PEER_RATIOS = (("peers: streamwork dedup off", "streamwork_dedup_off"),
               ("peers: streamwork dedup on", "streamwork_dedup_on"))


def ratio_rows(result: dict[str, Any]) -> list[tuple[str, str, dict[str, Any],
                                                     dict[str, Any] | None]]:
    """(label, baseline, row at the defaults, row at the sweep's best or None) of every
    ratio measured at both."""
    sc = result["scenarios"]
    rows: list[tuple[str, str, dict[str, Any], dict[str, Any] | None]] = [
        (label, versus, sc[key]["defaults"], sc[key]["best"])
        for label, key, versus in CONSUME_RATIOS]
    if "peers" in result:
        res = result["peers"]["results"]
        for label, key in PEER_RATIOS:
            if key in res:
                rows.append((label, "bare-handler ceiling", res[key], res.get(key + "_best")))
    return rows


def render_ratios(result: dict[str, Any], console: Console) -> None:
    """Each ratio at the default options and at the sweep's best setting: the median of
    the pairs with their lowest and highest, and each pair's."""
    table = Table(title="ratios at the DEFAULT options and at the sweep's best: median of "
                        "the pairs, lowest-highest in brackets")
    for name in ("ratio", "baseline", "defaults", "setting", "pairs", "best", "best setting"):
        table.add_column(name, justify="left" if name in ("ratio", "baseline") else "right")
    for label, versus, defaults, best in ratio_rows(result):
        pairs = " ".join(f"{x:.2f}" for x in defaults.get("pair_ratios", []))
        table.add_row(label, versus, _spread(defaults) or defaults.get("error", "n/a"),
                      _setting(defaults), pairs,
                      _spread(best) if best else "", _setting(best) if best else "")
    console.print(table)


def _us(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else ""


def render_costs(result: dict[str, Any], console: Console) -> None:
    """Where the time of a job goes, at the defaults (and at the best, and in the raw
    loops): wall time, client and Redis CPU per job, how busy each side was, round trips
    and commands per job, and which side bounds the run."""
    sc = result["scenarios"]
    table = Table(title="where the time goes (per job; CPU from process_time, INFO cpu and "
                        "/proc/stat: others = every other process of the machine, 100% = one "
                        "core; round trips = client-sent commands, MONITOR)")
    for name in ("run", "wall us", "client cpu us", "redis cpu us", "busy client/redis",
                 "others", "round trips", "commands", "bound"):
        table.add_column(name, justify="left" if name in ("run", "bound") else "right")
    rows: list[tuple[str, dict[str, Any]]] = [("raw XREADGROUP+XACK", sc["raw_consume"])]
    rows += [(f"consume dedup off, {which} {_setting(sc['consume_dedup_off'][which])}",
              sc["consume_dedup_off"][which]) for which in ("defaults", "best")]
    rows.append(("raw naive safety loop", sc["raw_safety"]))
    rows += [(f"consume dedup on, {which} {_setting(sc['consume_dedup_on'][which])}",
              sc["consume_dedup_on"][which]) for which in ("defaults", "best")]
    for label, row in rows:
        c = row.get("cost", {})
        table.add_row(label, _us(c.get("wall_us_per_job")), _us(c.get("client_cpu_us_per_job")),
                      _us(c.get("redis_cpu_us_per_job")),
                      f"{100 * c.get('client_busy', 0):.0f}% / "
                      f"{100 * c.get('redis_busy', 0):.0f}%",
                      f"{100 * c['others_busy']:.0f}%" if "others_busy" in c else "",
                      f"{c['round_trips_per_job']:.4f}" if "round_trips_per_job" in c else "",
                      f"{c['commands_per_job']:.3f}" if "commands_per_job" in c else "",
                      c.get("bound", ""))
    console.print(table)


def render(result: dict[str, Any], console: Console) -> None:
    """Print the result as rich tables."""
    sc = result["scenarios"]
    table = Table(title=f"streamwork bench ({result['date']}, {result['machine']['cpus']} "
                        f"cpus, Redis {result['machine']['redis_server']}, "
                        f"{result['params']['jobs']:,} jobs/run, median of "
                        f"{result['params']['repeats']})")
    table.add_column("scenario")
    table.add_column("jobs/s", justify="right")
    table.add_column("ratio (lowest-highest)", justify="right")
    table.add_column("baseline")
    table.add_column("cpu client/redis", justify="right")
    rows: list[tuple[str, dict[str, Any], str]] = [
        ("raw XADD, pipelined 500", sc["raw_xadd"], ""),
        ("raw XREADGROUP 500 + XACK", sc["raw_consume"], ""),
        ("raw naive safety loop", sc["raw_safety"], ""),
        ("produce (send_many 500)", sc["produce"], "raw XADD"),
    ]
    for label, key, versus in CONSUME_RATIOS:
        for which in ("defaults", "best"):
            row = sc[key][which]
            rows.append((f"{label}, {which} {_setting(row)}", row, versus))
    for label, s, versus in rows:
        table.add_row(label, _fmt_rate(s["jobs_per_s"]), _spread(s), versus,
                      f"{s['client_cpu_pct']:.0f}% / {s['redis_cpu_pct']:.0f}%")
    console.print(table)
    render_ratios(result, console)
    render_costs(result, console)

    sweep = Table(title="consume sweep (jobs/s, median)")
    sweep.add_column("concurrency", justify="right")
    sweep.add_column("batch_size", justify="right")
    sweep.add_column("dedup off", justify="right")
    sweep.add_column("dedup on", justify="right")
    defaults = result["params"].get("defaults", {})
    on = {(s["concurrency"], s["batch_size"]): s for s in sc["consume_dedup_on"]["sweep"]}
    for s in sc["consume_dedup_off"]["sweep"]:
        other = on.get((s["concurrency"], s["batch_size"]))
        is_default = (s["concurrency"], s["batch_size"]) == (
            defaults.get("concurrency"), defaults.get("batch_size"))
        sweep.add_row(str(s["concurrency"]), str(s["batch_size"]) + (" (defaults)"
                                                                     if is_default else ""),
                      _fmt_rate(s["jobs_per_s"]),
                      _fmt_rate(other["jobs_per_s"]) if other else "")
    console.print(sweep)

    lat = sc["latency"]
    cmd = result["commands"]
    extra = Table(title="latency at 20% of each mode's max, commands and memory")
    extra.add_column("what")
    for mode in ("off", "on"):
        for which in ("defaults", "best"):
            setting = _setting(cmd[f"dedup_{mode}"][which])
            extra.add_column(f"dedup {mode} {which} {setting}", justify="right")
    cols = [(f"dedup_{mode}", which) for mode in ("off", "on") for which in ("defaults", "best")]
    extra.add_row("offered (jobs/s)", *(_fmt_rate(lat[m]["offered_per_s"]) for m, _ in cols))
    extra.add_row("enqueue->start p50 (ms)", *(f"{lat[m][w]['p50_ms']:.2f}" for m, w in cols))
    extra.add_row("enqueue->start p99 (ms)", *(f"{lat[m][w]['p99_ms']:.2f}" for m, w in cols))
    extra.add_row("Redis commands/job (all, incl. in scripts)",
                  *(f"{cmd[m][w]['total_per_job']:.2f}" for m, w in cols))
    extra.add_row("client-sent commands/job",
                  *(f"{cmd[m][w]['client_commands_per_job']:.4f}" for m, w in cols))
    extra.add_row("hot-path round trips/job",
                  *(f"{cmd[m][w]['round_trips_per_job']:.4f}" for m, w in cols))
    extra.add_row("naive safety loop: commands/job", "", "",
                  f"{cmd['raw_safety']['total_per_job']:.2f}", "")
    mem = result["memory"]
    extra.add_row("done record MEMORY USAGE (bytes)", "", "", f"{mem['memory_usage_bytes']:.0f}",
                  "")
    extra.add_row("used_memory per 10k done records", "", "",
                  f"{mem['used_memory_per_10k'] / 1024:,.0f} KiB", "")
    console.print(extra)
    if "batch_handlers" in result:
        render_batch_handlers(result["batch_handlers"], console)
    if "recovery" in result:
        render_recovery(result["recovery"], console)
    if "peers" in result:
        render_peers(result["peers"], console)
    render_goals(result, console)
    load = result["machine"]
    console.print(f"load average {load['loadavg_start']} -> {load.get('loadavg_end')}; "
                  "figures are noisy when other work shares the machine.")


def render_goals(result: dict[str, Any], console: Console) -> None:
    """The goals, judged on the figures at the DEFAULT options; the same figure at the
    sweep's best setting beside them, labelled, never judged on."""
    goals = Table(title="goals, judged at the DEFAULT options (the sweep's best beside them)")
    goals.add_column("goal")
    goals.add_column("defaults", justify="right")
    goals.add_column("", justify="center")
    goals.add_column("pairs/runs: lowest to highest, passing", justify="right")
    goals.add_column("best (not judged)", justify="right")
    for g in result["goals"]:
        measured = "n/a" if g["measured"] is None else f"{g['measured']:.3g}"
        runs = g.get("runs") or []
        spread = (f"{min(runs):.3g} to {max(runs):.3g}, {g['runs_passing']} of {len(runs)}"
                  if runs else "")
        best = g.get("best")
        beside = ""
        if best and best["measured"] is not None:
            beside = (f"{best['measured']:.3g} at c={best['concurrency']} "
                      f"b={best['batch_size']} ({'meets' if best['pass'] else 'misses'})")
        goals.add_row(g["goal"], measured,
                      "[green]PASS[/green]" if g["pass"] else "[red]MISS[/red]", spread,
                      beside)
    console.print(goals)


def _pyplot() -> Any:
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise BenchError(
            "--plot needs matplotlib: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plot(result: dict[str, Any], path: str) -> None:
    """Write throughput by concurrency and batch size to ``path`` (PNG) with matplotlib."""
    plt = _pyplot()
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
        defaults = result["params"].get("defaults", {})
        at = [s for s in sc[key]["sweep"] if (s["concurrency"], s["batch_size"]) == (
            defaults.get("concurrency"), defaults.get("batch_size"))]
        if at:  # the setting users run, marked on its curve
            ax.plot([at[0]["concurrency"]], [at[0]["jobs_per_s"]], marker="*", markersize=16,
                    color="black", linestyle="none",
                    label=f"defaults (c={at[0]['concurrency']}, b={at[0]['batch_size']})")
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



def plot_peers(result: dict[str, Any], path: str) -> str:
    """Write the peers scenario as a bar chart (jobs/s, ratio to the ceiling on each bar)
    to ``path`` (PNG); a contender that failed gets an empty bar labelled n/a."""
    plt = _pyplot()
    peers = result["peers"]
    rows = peer_rows(peers)
    rates = [row.get("jobs_per_s", 0.0) for _, row in rows]
    colors = ["grey" if k in ("ceiling", "stream_floor")
              else "tab:blue" if k.startswith("streamwork") else "tab:orange"
              for k in peers["results"]]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.bar(range(len(rows)), rates, color=colors)
    for bar, (_, row) in zip(bars, rows, strict=True):
        text = (f"{row['jobs_per_s']:,.0f}\n{row['ratio']:.2f}x" if "ratio" in row
                else "n/a")
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                    textcoords="offset points")
    ax.set_xticks(range(len(rows)), [label for label, _ in rows], rotation=20, ha="right",
                  fontsize=9)
    ax.set_ylabel("jobs/s")
    ax.set_ylim(0, max([*rates, 1.0]) * 1.18)
    ax.set_title(f"one worker process, handler = one Redis INCR, {peers['jobs']:,} jobs "
                 f"(median of {peers['repeats']}; {result['date']}, "
                 f"{result['machine']['cpus']} cpus)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
