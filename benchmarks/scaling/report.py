"""The scaling study for people: rich tables (:func:`render`) and one PNG of every curve
(:func:`plot`, matplotlib imported only then, as the bench's ``--plot``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.report import _pyplot


def _rate(row: dict[str, Any]) -> str:
    ratio = f" ({row['ratio']:.2f}x)" if "ratio" in row else ""
    return f"{row['jobs_per_s']:,.0f}{ratio}"


def _cpu(row: dict[str, Any]) -> str:
    return f"{row['client_cpu_pct']:.0f}% / {row['redis_cpu_pct']:.0f}%"


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    return table


def render(result: dict[str, Any], console: Console) -> None:
    """Every section as a table; ratios are to the raw redis-py loop at the same point."""
    w = result["worker"]
    console.print(f"scaling study ({result['date']}, {result['machine']['cpus']} cpus, Redis "
                  f"{result['machine']['redis_server']}; worker: concurrency "
                  f"{w['concurrency']}, batch_size {w['batch_size']}, no-op handler)")
    t = _table("1. backlog: drain jobs/s (x raw XREADGROUP+XACK), then p99 enqueue->start "
               "of new jobs at 20% of the drain rate", "backlog", "raw jobs/s",
               "dedup off", "p99 off (ms)", "cpu off client/redis", "dedup on", "p99 on (ms)",
               "cpu on client/redis")
    for row in result["backlog"]:
        off, on = row["dedup_off"], row["dedup_on"]
        t.add_row(f"{row['backlog']:,}", _rate(row["raw_consume"]), _rate(off),
                  f"{off['latency']['p99_ms']:.2f}", _cpu(off), _rate(on),
                  f"{on['latency']['p99_ms']:.2f}", _cpu(on))
    console.print(t)
    t = _table("2. streams served by one process (one worker each, dedup on), same jobs in "
               "all", "streams", "jobs/stream", "raw jobs/s", "streamwork", "cpu client/redis",
               "join (s)", "Redis conns", "idle cmds/s (EVALSHA)", "idle cpu client/redis",
               "idle loop lag p50/max (ms)")
    for row in result["streams"]:
        on = row["dedup_on"]
        rate = _rate(on) + ("" if on["finished"] else
                            f" [unfinished: {on['jobs']:,}/{on['jobs_sent']:,} acked]")
        t.add_row(f"{row['streams']:,}", f"{row['jobs_per_stream']:,}",
                  _rate(row["raw_consume"]), rate, _cpu(on), f"{on['join_seconds']:.2f}",
                  f"{on['clients']:,}",
                  f"{on['idle_commands_per_s']:,.0f} ({on['idle_script_calls_per_s']:,.0f})",
                  f"{on['idle_client_cpu_pct']:.0f}% / {on['idle_redis_cpu_pct']:.0f}%",
                  f"{on['idle_loop_lag_ms_p50']:.1f} / {on['idle_loop_lag_ms_max']:.0f}")
    console.print(t)
    t = _table("3. payload size: jobs/s (x raw) and MB/s of payload", "payload", "jobs",
               "raw XADD", "send_many", "raw consume", "dedup off", "dedup on")
    for row in result["payloads"]:
        cells = [f"{_rate(row[k])}, {row[k]['mb_per_s']:,.1f} MB/s"
                 for k in ("raw_xadd", "produce", "raw_consume", "dedup_off", "dedup_on")]
        t.add_row(f"{row['payload_bytes']:,} B", f"{row['jobs']:,}", *cells)
    console.print(t)
    t = _table("4. worker processes (streamwork run --processes N): jobs/s (x one raw client); "
               "cpu workers / redis / rest of the machine", "processes", "dedup off",
               "cpu off", "dedup on", "cpu on")
    for row in result["processes"]:
        t.add_row(str(row["processes"]), *[x for mode in ("dedup_off", "dedup_on") for x in (
            _rate(row[mode]), f"{_cpu(row[mode])} / {row[mode]['others_cpu_pct']}%")])
    console.print(t)
    t = _table("5. Redis memory per item", "item", "sampled", "MEMORY USAGE (B)",
               "used_memory growth (B)")
    for key, row in result["memory"].items():
        t.add_row(key.replace("_", " "), f"{row['count']:,}",
                  f"{row['memory_usage_bytes_each']:,.0f}",
                  f"{row['used_memory_bytes_each']:,.0f}")
    console.print(t)
    t = _table("5. one worker process's RSS over a soak", "mode", "jobs", "seconds",
               "RSS start", "RSS end", "RSS max", "slope after warm-up")
    for mode, s in result["soak"].items():
        t.add_row(mode.replace("_", " "), f"{s['jobs']:,}", f"{s['seconds']:.1f}",
                  *[f"{s[k] / 2**20:.1f} MiB" for k in ("rss_start_bytes", "rss_end_bytes",
                                                       "rss_max_bytes")],
                  f"{s['slope_bytes_per_1k_jobs']:+,.0f} B / 1k jobs")
    console.print(t)
    t = _table("6. retention trimmer: one step (bounded trim.lua calls) over a stream of "
               "acknowledged entries", "entries", "trimmed", "step (ms)", "calls",
               "longest call (ms)", "longest Redis block (ms)", "ns/entry", "freed")
    for row in result["trimmer"]:
        t.add_row(f"{row['entries']:,}", f"{row['trimmed']:,}", f"{row['step_ms']:.1f}",
                  f"{row['calls']:,}", f"{row['longest_call_ms']:.2f}",
                  f"{row['longest_block_ms']:.2f}", f"{row['ns_per_entry']:.0f}",
                  f"{row['freed_bytes'] / 2**20:,.1f} MiB")
    console.print(t)
    render_ops(result["ops"], console)
    load = result["machine"]
    console.print(f"load average {load['loadavg_start']} -> {load.get('loadavg_end')}; "
                  f"{result['seconds']:.0f} s in all.")


def render_ops(ops: dict[str, Any], console: Console) -> None:
    """The dashboard / inspect section: ops_scale.py's table, or why it did not run."""
    if ops.get("status") != "ran":
        console.print(f"7. dashboard and inspect at many streams: not run "
                      f"({ops.get('module')} is not in this tree)")
        return
    from benchmarks.scenarios.ops_scale import ROWS

    t = _table("7. dashboard and streamwork inspect at many streams (ops_scale.py)",
               "streams", "what", "wall s", "client CPU s", "Redis CPU s", "Redis commands",
               "SLOWLOG max (ms)")
    for n, figures in ops["result"]["results"].items():
        for key, label in ROWS:
            f = figures[key]
            slow = f"{f['slowlog_max_ms']:.1f} ({f['slowest']})" if f["slowest"] else "0"
            t.add_row(f"{int(n):,}", label, f"{f['s']:.3f}", f"{f.get('cpu_s', 0):.3f}",
                      f"{f.get('redis_cpu_s', 0):.3f}", f"{f['commands']:,}", slow)
    console.print(t)


def plot(result: dict[str, Any], path: str) -> None:
    """One PNG, a panel per curve: backlog, streams, payload, processes, RSS, trimmer."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    ax = axes[0][0]
    xs = [r["backlog"] for r in result["backlog"]]
    for key, label in (("raw_consume", "raw XREADGROUP+XACK"), ("dedup_off", "dedup off"),
                       ("dedup_on", "dedup on")):
        ax.plot(xs, [r[key]["jobs_per_s"] for r in result["backlog"]], marker="o", label=label)
    ax.set(xscale="log", xlabel="jobs waiting in the stream", ylabel="jobs/s", title="backlog")
    twin = ax.twinx()
    for key, style in (("dedup_off", "--"), ("dedup_on", ":")):
        twin.plot(xs, [r[key]["latency"]["p99_ms"] for r in result["backlog"]], style,
                  color="grey", label=f"p99 ms {key.replace('_', ' ')}")
    twin.set_ylabel("p99 enqueue->start (ms)")
    ax.legend(fontsize=7, loc="lower left")
    twin.legend(fontsize=7, loc="lower right")
    ax = axes[0][1]
    xs = [r["streams"] for r in result["streams"]]
    ax.plot(xs, [r["raw_consume"]["jobs_per_s"] for r in result["streams"]], marker="o",
            label="raw XREADGROUP+XACK (all streams per call)")
    ax.plot(xs, [r["dedup_on"]["jobs_per_s"] for r in result["streams"]], marker="o",
            label="streamwork, a worker per stream")
    ax.set(xscale="log", yscale="log", xlabel="streams in one process", ylabel="jobs/s",
           title="streams per process")
    twin = ax.twinx()
    twin.plot(xs, [r["dedup_on"]["idle_commands_per_s"] for r in result["streams"]], "--",
              color="grey", label="idle Redis commands/s")
    twin.set(yscale="symlog", ylabel="idle Redis commands/s")
    ax.legend(fontsize=7, loc="lower left")
    twin.legend(fontsize=7, loc="upper center")
    ax = axes[0][2]
    xs = [r["payload_bytes"] for r in result["payloads"]]
    for key in ("raw_xadd", "produce", "raw_consume", "dedup_off", "dedup_on"):
        ax.plot(xs, [r[key]["mb_per_s"] for r in result["payloads"]], marker="o",
                label=key.replace("_", " "))
    ax.set(xscale="log", xlabel="payload bytes", ylabel="MB/s of payload", title="payload size")
    ax.legend(fontsize=7)
    ax = axes[1][0]
    xs = [r["processes"] for r in result["processes"]]
    for key in ("dedup_off", "dedup_on"):
        ax.plot(xs, [r[key]["jobs_per_s"] for r in result["processes"]], marker="o",
                label=key.replace("_", " "))
    ax.axhline(result["processes"][0]["raw_consume"]["jobs_per_s"], color="grey", ls="--",
               label="one raw client")
    ax.set(xticks=xs, xlabel="worker processes (2 cores)", ylabel="jobs/s",
           title="worker processes")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax = axes[1][1]
    for mode, s in result["soak"].items():
        ax.plot([j for j, _ in s["samples"]], [b / 2**20 for _, b in s["samples"]],
                marker=".", label=f"{mode.replace('_', ' ')}: "
                                  f"{s['slope_bytes_per_1k_jobs']:+,.0f} B / 1k jobs")
    ax.axvline(result["soak"]["dedup_on"]["warm_up_jobs"], color="grey", ls=":", lw=1)
    ax.set(xlabel="jobs done", ylabel="worker RSS (MiB)", title="worker RSS over a soak")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax = axes[1][2]
    xs = [r["entries"] for r in result["trimmer"]]
    ax.plot(xs, [r["step_ms"] for r in result["trimmer"]], marker="o", label="trim step")
    ax.plot(xs, [r["longest_block_ms"] for r in result["trimmer"]], marker="o",
            label="longest Redis block (SLOWLOG; one bounded call)")
    ax.set(xscale="log", yscale="log", xlabel="acknowledged entries trimmed", ylabel="ms",
           title="retention trimmer")
    ax.legend(fontsize=7)
    fig.suptitle(f"streamwork scaling ({result['date']}, {result['machine']['cpus']} cpus)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
