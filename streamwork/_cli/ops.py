"""``streamwork inspect``, ``streamwork top`` and ``streamwork job``: what operators look at
(read-only).

``register(main)`` adds the commands to the ``streamwork`` click group. The figures come
from :mod:`streamwork._ops.stats`; docs/guides/operations.md says what they mean.

``--partitions P`` reads a partitioned stream's P partitions and shows their sums, plus a
table per partition (with the worker owning it in ordered mode and, on a Cluster, the node
serving it); ``--partition N`` looks at partition N alone. ``job --partitions P`` finds the
job's record in whichever partition holds it.

Exit codes of ``inspect``: 0 fine, 1 error (Redis unreachable, no such stream), 2 a
``--fail-if`` threshold was crossed (click also uses 2 for a usage error, such as a bad
``--fail-if`` expression, so a misconfigured probe fails rather than passes).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import click
import redis
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from streamwork._cli.common import (
    check_recorded_partitions,
    chosen_partition,
    detect_partitions,
    fail,
    partition_options,
    partition_streams,
    url_option,
)
from streamwork._ops import stats
from streamwork._ops.stats import GroupStats, PartitionStats, StreamRates, StreamStats
from streamwork._producer.shells import Producer
from streamwork._redis import connection
from streamwork._wire.extensions import to_json
from streamwork._wire.partitions import partition_of
from streamwork._wire.records import CANCEL_EFFECTS
from streamwork.errors import RedisUnavailable, StreamworkError

__all__ = [
    "FAIL_EXIT_CODE",
    "Threshold",
    "check_thresholds",
    "fmt_age",
    "job_command",
    "parse_threshold",
    "register",
    "render_inspect",
    "render_top",
]

FAIL_EXIT_CODE: Final = 2  #: exit code of `inspect --fail-if` when a threshold is crossed
GROUP_METRICS: Final = ("lag", "pending", "oldest-pending")
STREAM_METRICS: Final = ("dead", "delayed", "delayed-due")
_EXPR: Final = re.compile(
    r"^\s*(?P<metric>[a-z-]+)\s*(?P<op>>=|>)\s*(?P<value>\d+(?:\.\d+)?)\s*$")
_FORMS: Final = (
    "use METRIC>N or METRIC>=N, METRIC one of lag, pending, oldest-pending (seconds), dead, "
    "delayed, delayed-due; e.g. --fail-if 'lag>10000' --fail-if 'oldest-pending>=300' "
    "(quote it: the shell takes a bare > for a redirection)"
)


# ---------------------------------------------------------------- thresholds (--fail-if)


@dataclass(frozen=True, slots=True)
class Threshold:
    """One ``--fail-if`` expression, e.g. ``lag>10000``."""

    metric: str
    op: str
    value: float

    def crossed(self, actual: float) -> bool:
        return actual >= self.value if self.op == ">=" else actual > self.value

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_threshold(text: str) -> Threshold:
    """``'lag>10000'`` -> Threshold; raises click.BadParameter naming the accepted forms."""
    m = _EXPR.match(text)
    if not m or m["metric"] not in GROUP_METRICS + STREAM_METRICS:
        raise click.BadParameter(f"{text!r} is not a threshold: {_FORMS}")
    return Threshold(m["metric"], m["op"], float(m["value"]))


def _thresholds(ctx: click.Context, param: click.Parameter,
                values: tuple[str, ...]) -> tuple[Threshold, ...]:
    return tuple(parse_threshold(v) for v in values)


def _fmt_value(metric: str, value: float) -> str:
    if metric == "oldest-pending":
        return f"{value:.1f}s" if value != int(value) else f"{value:g}s"
    return f"{value:g}"


def _group_value(metric: str, g: GroupStats) -> float | None:
    if metric == "lag":
        return None if g.lag is None else float(g.lag)
    if metric == "pending":
        return float(g.pending)
    return g.oldest_pending_age_s or 0.0  # oldest-pending; nothing pending counts as 0


def _stream_value(metric: str, s: StreamStats) -> float:
    if metric == "dead":
        return float(s.dead)
    if metric == "delayed":
        return float(s.delayed_total)
    return float(s.delayed_due)


def check_thresholds(samples: Sequence[StreamStats],
                     thresholds: Sequence[Threshold]) -> tuple[list[str], list[str]]:
    """(failures, warnings): one line per crossed threshold and stream, naming the worst
    group for group figures (``FAIL orders/billing: lag 12000 > 10000``); a warning when
    Redis cannot tell a group's lag, which is then not checked."""
    failures: list[str] = []
    warnings: list[str] = []
    for s in samples:
        for t in thresholds:
            if t.metric in STREAM_METRICS:
                value = _stream_value(t.metric, s)
                if t.crossed(value):
                    failures.append(f"FAIL {s.stream}: {t.metric} {_fmt_value(t.metric, value)} "
                                    f"{t.op} {_fmt_value(t.metric, t.value)}")
                continue
            worst: tuple[float, str] | None = None
            for g in s.groups:
                gv = _group_value(t.metric, g)
                if gv is None:
                    warnings.append(f"WARN {s.stream}/{g.name}: Redis cannot tell this group's "
                                    f"lag; {t} not checked")
                elif worst is None or gv > worst[0]:
                    worst = (gv, g.name)
            if worst is not None and t.crossed(worst[0]):
                failures.append(f"FAIL {s.stream}/{worst[1]}: {t.metric} "
                                f"{_fmt_value(t.metric, worst[0])} {t.op} "
                                f"{_fmt_value(t.metric, t.value)}")
    return failures, warnings


# ---------------------------------------------------------------- rendering


def fmt_age(seconds: float | None) -> str:
    """``0.4s``, ``42s``, ``4m07s``, ``2h03m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _title(s: StreamStats) -> str:
    if not s.partitions:
        return f"stream {s.stream}"
    if len(s.partitions) == 1 and s.partition_count > 1:
        return f"stream {s.stream} (partition {s.partitions[0].index} of {s.partition_count})"
    return f"stream {s.stream} (totals of {len(s.partitions)} partitions)"


def _stream_table(s: StreamStats) -> Table:
    table = Table(title=_title(s), title_justify="left", title_style="bold")
    for col in ("length", "entries added", "first id", "last id", "delayed due/all", "dead"):
        table.add_column(col, justify="left" if "id" in col else "right", no_wrap=True)
    table.add_row(_n(s.length), _n(s.entries_added), s.first_id or "-", s.last_id,
                  f"{s.delayed_due:,} / {s.delayed_total:,}", _n(s.dead))
    return table


def _top(g: GroupStats) -> str:
    return "\n".join(f"{name} ({pending:,})" for name, pending in g.top_consumers) or "-"


def _groups_table(s: StreamStats) -> Table:
    table = Table(title=f"groups of {s.stream}", title_justify="left")
    table.add_column("group", no_wrap=True)
    for col in ("consumers", "entries-read", "lag", "pending", "oldest pending"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("top consumers (pending)")
    for g in s.groups:
        table.add_row(g.name, _n(g.consumers), _n(g.entries_read), _n(g.lag), _n(g.pending),
                      fmt_age(g.oldest_pending_age_s), _top(g))
    return table


def _consumers_table(s: StreamStats) -> Table:
    table = Table(title=f"consumers of {s.stream}", title_justify="left")
    table.add_column("group", no_wrap=True)
    table.add_column("consumer")
    table.add_column("pending", justify="right", no_wrap=True)
    table.add_column("idle", justify="right", no_wrap=True)
    for g in s.groups:
        for c in g.consumer_list:
            table.add_row(g.name, c.name, _n(c.pending), fmt_age(c.idle_s))
    return table


def _owner(p: PartitionStats, group: str) -> str:
    return p.owners.get(group) or "-"


def _partitions_table(s: StreamStats) -> Table:
    """One row per partition and group: the partition's own figures and, in ordered mode,
    the member id of the worker that owns it (and its Cluster node, on a Cluster)."""
    cluster = any(p.node for p in s.partitions)
    table = Table(title=f"partitions of {s.stream}", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("stream", no_wrap=True)
    if cluster:
        table.add_column("node", no_wrap=True)
    for col in ("length", "delayed due/all", "dead"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("group", no_wrap=True)
    for col in ("lag", "pending", "oldest pending"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("owner (ordered)")
    for p in s.partitions:
        head = [str(p.index), p.stream] + ([p.node or "?"] if cluster else [])
        st = p.stats
        if st is None:
            table.add_row(*head, "-", "-", "-", "(no stream yet)", "", "", "", "")
            continue
        figures = [_n(st.length), f"{st.delayed_due:,} / {st.delayed_total:,}", _n(st.dead)]
        if not st.groups:
            table.add_row(*head, *figures, "-", "", "", "", "")
        for g in st.groups:
            table.add_row(*head, *figures, g.name, _n(g.lag), _n(g.pending),
                          fmt_age(g.oldest_pending_age_s), _owner(p, g.name))
    return table


def render_inspect(s: StreamStats) -> RenderableType:
    """The human view of one stream: stream figures, groups, consumers (and, for a
    partitioned stream, each partition's figures)."""
    parts: list[RenderableType] = [_stream_table(s)]
    if s.groups:
        parts.append(_groups_table(s))
        if any(g.consumer_list for g in s.groups):
            parts.append(_consumers_table(s))
    else:
        parts.append(Text("  no consumer groups: nothing reads this stream yet", style="yellow"))
    if s.partitions:
        parts.append(_partitions_table(s))
    parts.append(Text(""))
    return Group(*parts)


def render_top(samples: Sequence[StreamStats], rates: dict[str, StreamRates],
               interval_s: float) -> RenderableType:
    """One frame of ``top``: streams, groups, busiest consumers; rates where two samples
    of a stream exist (``-`` otherwise)."""
    if not samples:
        return Text("no streams found")
    taken = max(s.taken_at_ms for s in samples)
    clock = time.strftime("%H:%M:%S", time.localtime(taken / 1000))
    streams = Table(title=f"streamwork top  {clock}  (rates over {interval_s:g}s)",
                    title_justify="left")
    streams.add_column("stream", no_wrap=True)
    for col in ("length", "produced/s", "delayed due/all", "dead"):
        streams.add_column(col, justify="right", no_wrap=True)
    groups = Table(title="groups", title_justify="left")
    groups.add_column("stream/group", no_wrap=True)
    for col in ("lag", "pending", "oldest pending", "acked/s", "consumers"):
        groups.add_column(col, justify="right", no_wrap=True)
    split = Table(title="partitions", title_justify="left")
    split.add_column("stream#partition", no_wrap=True)
    split.add_column("group", no_wrap=True)
    for col in ("length", "produced/s", "lag", "pending", "acked/s", "dead"):
        split.add_column(col, justify="right", no_wrap=True)
    split.add_column("owner (ordered)")
    cluster = any(p.node for s in samples for p in s.partitions)
    if cluster:
        split.add_column("node", no_wrap=True)
    busy = Table(title="busiest consumers", title_justify="left")
    busy.add_column("stream/group", no_wrap=True)
    busy.add_column("consumer")
    busy.add_column("pending", justify="right", no_wrap=True)
    busy.add_column("idle", justify="right", no_wrap=True)
    for s in samples:
        r = rates.get(s.stream)
        streams.add_row(s.stream, _n(s.length), _rate(r.produced_per_s if r else None),
                        f"{s.delayed_due:,} / {s.delayed_total:,}", _n(s.dead))
        for g in s.groups:
            label = f"{s.stream}/{g.name}"
            groups.add_row(label, _n(g.lag), _n(g.pending), fmt_age(g.oldest_pending_age_s),
                           _rate(r.acked_per_s.get(g.name) if r else None), _n(g.consumers))
            idle = {c.name: c.idle_s for c in g.consumer_list}
            for name, pending in g.top_consumers:
                busy.add_row(label, name, _n(pending), fmt_age(idle.get(name)))
        for p in s.partitions:
            _partition_rows(split, s, p, rates.get(p.stream), cluster)
    parts: list[RenderableType] = [streams]
    if groups.row_count:
        parts.append(groups)
    if split.row_count:
        parts.append(split)
    if busy.row_count:
        parts.append(busy)
    return Group(*parts)


def _partition_rows(table: Table, s: StreamStats, p: PartitionStats,
                    r: StreamRates | None, cluster: bool) -> None:
    label = f"{s.stream}#{p.index}" if len(s.partitions) > 1 else p.stream
    node = [p.node or "?"] if cluster else []
    st = p.stats
    if st is None:
        table.add_row(label, "(no stream yet)", "-", "-", "", "", "", "", "", *node)
        return
    produced = _rate(r.produced_per_s if r else None)
    if not st.groups:
        table.add_row(label, "-", _n(st.length), produced, "", "", "", _n(st.dead), "", *node)
    for g in st.groups:
        table.add_row(label, g.name, _n(st.length), produced, _n(g.lag), _n(g.pending),
                      _rate(r.acked_per_s.get(g.name) if r else None), _n(st.dead),
                      _owner(p, g.name), *node)


# ---------------------------------------------------------------- commands


def _console() -> Console:
    console = Console()
    if not console.is_terminal and console.width < 160:
        console = Console(width=160)  # piped or captured: do not squeeze the tables
    return console


@contextmanager
def _errors(url: str, what: str) -> Iterator[None]:
    """Turn Redis and streamwork errors into one clear line and exit code 1."""
    try:
        yield
    except StreamworkError as exc:
        raise click.ClickException(str(exc)) from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise click.ClickException(str(RedisUnavailable(what, url, exc))) from None
    except redis.RedisError as exc:
        raise click.ClickException(f"Redis at {url} answered with an error: {exc}") from None


@dataclass(frozen=True, slots=True)
class _View:
    """What ``inspect``/``top`` look at: one stream or all, and its partitions."""

    stream: str | None
    partitions: int = 1
    partition: int | None = None


def _view(stream: str | None, partitions: int, partition: int | None) -> _View:
    """The checked options (a click usage error, before any connection, when they do not
    fit together)."""
    chosen = chosen_partition(partitions, partition)
    if partitions == 1:
        return _View(stream)
    if stream is None:
        if chosen is not None:
            raise click.UsageError("--partition N needs a STREAM: name the partitioned stream, "
                                   "e.g. `streamwork inspect orders --partitions 4 "
                                   "--partition 2`")
        return _View(None, partitions)
    partition_streams(stream, partitions, chosen)  # checks the name suits partitioning
    return _View(stream, partitions, chosen)


def _sample(client: Any, view: _View, first: bool = True) -> list[StreamStats]:
    if view.partitions > 1:
        if view.stream is not None:
            if first:
                check_recorded_partitions(client, view.stream, view.partitions)
            return [stats.partitioned_stats(client, view.stream, view.partitions,
                                            view.partition)]
        return stats.sample_partitioned(client, view.partitions)
    if view.stream is not None:
        return [stats.stream_stats(client, view.stream)]
    return stats.sample(client)


def inspect_command(stream: str | None, as_json: bool, fail_if: Sequence[Threshold],
                    quiet: bool, url: str | None, partitions: int | None = None,
                    partition: int | None = None) -> None:
    """Body of ``streamwork inspect`` (see ``register``)."""
    view = _view(stream, detect_partitions(url, stream, partitions), partition)
    resolved = connection.resolve_url(url)
    with _errors(resolved, "streamwork inspect"):
        client = connection.sync_client(resolved)
        try:
            samples = _sample(client, view)
        finally:
            client.close()
    if as_json:
        doc: Any = (samples[0].as_json() if stream is not None
                    else [s.as_json() for s in samples])
        click.echo(json.dumps(doc, indent=None if quiet else 2))
    elif not quiet:
        console = _console()
        if not samples:
            console.print(f"no streams at {resolved}")
        for s in samples:
            console.print(render_inspect(s))
    failures, warnings = check_thresholds(samples, fail_if)
    for line in _missing_partitions(samples) + warnings + failures:
        click.echo(line, err=True)
    if failures:
        click.get_current_context().exit(FAIL_EXIT_CODE)


def _missing_partitions(samples: Sequence[StreamStats]) -> list[str]:
    """A WARN line per partitioned stream some of whose partitions have no stream: nothing
    was sent or read there yet, or --partitions is not the stream's partition count."""
    lines = []
    for s in samples:
        missing = [p for p in s.partitions if p.stats is None]
        if missing:
            which = ", ".join(f"{p.index} ({p.stream})" for p in missing)
            lines.append(f"WARN {s.stream}: no stream for partition {which} of "
                         f"{s.partition_count}: nothing sent or read there yet, or the stream "
                         f"is not split into {s.partition_count} (check --partitions)")
    return lines


def top_command(stream: str | None, interval: float, once: bool, url: str | None,
                partitions: int | None = None, partition: int | None = None) -> None:
    """Body of ``streamwork top`` (see ``register``)."""
    view = _view(stream, detect_partitions(url, stream, partitions), partition)
    resolved = connection.resolve_url(url)
    console = _console()
    with _errors(resolved, "streamwork top"):
        client = connection.sync_client(resolved)
        try:
            before = _sample(client, view)
            names = [s.stream for s in before]
            if once:
                time.sleep(interval)
                after = (_sample(client, view, first=False) if view.partitions > 1
                         else stats.sample(client, names))
                console.print(_frame(before, after, interval))
                return
            def frames() -> Iterator[RenderableType]:
                """A frame now (without rates), then one per interval, forever."""
                nonlocal before
                yield _frame([], before, interval)
                while True:
                    time.sleep(interval)
                    after = (_sample(client, view, first=False) if view.partitions > 1
                             else stats.sample(client, [stream] if stream else None))
                    yield _frame(before, after, interval)
                    before = after

            try:
                if console.is_terminal:
                    _redraw(console, frames())
                else:  # a pipe or a file: a live display would write nothing
                    _append(console, frames())
            except KeyboardInterrupt:
                pass
        finally:
            client.close()


def _redraw(console: Console, frames: Iterator[RenderableType]) -> None:
    """`top` on a terminal: each frame replaces the one before."""
    with Live(next(frames), console=console, auto_refresh=False,
              redirect_stdout=False) as live:
        for frame in frames:
            live.update(frame, refresh=True)


def _append(console: Console, frames: Iterator[RenderableType]) -> None:
    """`top` into a pipe or a file (`top | tee top.log`): the frames one after another,
    plain, each flushed when printed (a reader that went away, `top | head`, ends it:
    rich exits 1 on a broken pipe)."""
    for frame in frames:
        console.print(frame)
        console.print()
        console.file.flush()


def _frame(before: Sequence[StreamStats], after: Sequence[StreamStats],
           interval: float) -> RenderableType:
    prev = {s.stream: s for s in before}
    rates = {s.stream: stats.compute_rates(prev[s.stream], s)
             for s in after if s.stream in prev}
    for s in after:  # a partitioned stream: each partition's rates too
        old = {p.stream: p.stats for p in prev[s.stream].partitions} if s.stream in prev else {}
        for p in s.partitions:
            was = old.get(p.stream)
            if p.stats is not None and was is not None:
                rates[p.stream] = stats.compute_rates(was, p.stats)
    return render_top(after, rates, interval)


def _found_in(producer: Producer, picked: Sequence[tuple[int, str]], group: str,
              key: str) -> tuple[int, str] | None:
    """The partition whose record of job ``key`` the status came from: the key's own
    partition first (where the producer sent it, unless an order key chose another)."""
    home = partition_of(key, len(picked))
    for i, name in sorted(picked, key=lambda p: p[0] != home):
        if producer.status(name, key, group=group).state != "unknown":
            return i, name
    return None


def cancel_command(stream: str, key: str, group: str | None, reason: str,
                   order_key: str | None, url: str | None, given: int | None = None) -> None:
    """Body of ``streamwork cancel`` (see ``register``)."""
    partitions = detect_partitions(url, stream, given)
    partition_streams(stream, partitions, None)  # checks the name suits partitioning
    resolved = connection.resolve_url(url)
    with _errors(resolved, "streamwork cancel"):
        producer = Producer.from_url(resolved, partitions={stream: partitions})
        try:
            was = producer.cancel(stream, key, group=group, reason=reason, order_key=order_key)
        finally:
            producer.close()
    click.echo(f"{key}: {CANCEL_EFFECTS.get(was, was)}")


def job_command(stream: str, key: str, group: str | None, as_json: bool, url: str | None,
                given: int | None = None, partition: int | None = None) -> None:
    """Body of ``streamwork job`` (see ``register``)."""
    partitions = detect_partitions(url, stream, given)
    picked = partition_streams(stream, partitions, partition)
    where: tuple[int, str] | None = None
    if partitions > 1:
        resolved = connection.resolve_url(url)
        with _errors(resolved, "streamwork job"):
            client = connection.sync_client(resolved)
            try:
                check_recorded_partitions(client, stream, partitions)
            finally:
                client.close()
    try:
        if partitions == 1:
            with Producer.from_url(url) as producer:
                st = producer.status(stream, key, group=group)
        else:
            # a mapping: the partitions' own names are plain streams to this producer
            with Producer.from_url(url, partitions={stream: partitions}) as producer:
                if partition is not None:
                    where = picked[0]
                    st = producer.status(where[1], key, group=group)
                else:
                    st = producer.status(stream, key, group=group)
                    if st.state != "unknown":
                        where = _found_in(producer, picked, st.group, key)
    except StreamworkError as exc:
        fail(str(exc))
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(st):
        fields[f.name] = getattr(st, f.name)
        if f.name == "stream" and partitions > 1:
            fields["partition"] = None if where is None else where[0]
            fields["partition_stream"] = None if where is None else where[1]
    if as_json:
        fields["result"] = to_json(st.result)  # Decimal, datetime, ...: str, ISO 8601
        click.echo(json.dumps(fields, default=repr, ensure_ascii=False))
        return
    for name, value in fields.items():
        if name == "partition_stream":
            continue
        if name == "partition":
            value = "none has a record" if where is None else f"{where[0]} ({where[1]})"
        if value in (None, "") and name not in ("state", "result"):
            continue
        if name in ("updated_at", "due") and value is not None:
            value = f"{value:.3f} ({_ago(value)})"
        shown = repr(value) if name == "result" else str(value)
        # a traceback's lines line up under the first one's value, not at the margin
        click.echo(f"{name:>15}: " + shown.rstrip("\n").replace("\n", "\n" + " " * 17))


def _ago(when: float) -> str:
    delta = time.time() - when
    return f"{delta:.1f} s ago" if delta >= 0 else f"in {-delta:.1f} s"


def register(main: click.Group) -> None:
    """Add ``inspect``, ``top`` and ``job`` to the ``streamwork`` command group
    (idempotent)."""
    @click.command("inspect")
    @click.argument("stream", required=False)
    @click.option("--json", "as_json", is_flag=True, help="print JSON instead of tables")
    @click.option("--fail-if", "fail_if", multiple=True, callback=_thresholds,
                  metavar="EXPR",
                  help="exit 2 with a FAIL line on stderr when crossed, e.g. 'lag>10000', "
                       "'dead>0', 'pending>=500', 'oldest-pending>300', 'delayed>1000', "
                       "'delayed-due>0' (repeatable; quote it)")
    @click.option("--quiet", "-q", is_flag=True,
                  help="no tables (JSON on one line): only FAIL/WARN lines and the exit code")
    @partition_options
    @url_option
    def inspect(stream: str | None, as_json: bool, fail_if: tuple[Threshold, ...],
                quiet: bool, partitions: int | None, partition: int | None,
                url: str | None) -> None:
        """Groups, consumers, lag, pending (count, oldest age), delayed and dead letters of
        STREAM, or of every stream when none is given; a partitioned stream's totals and
        each partition with --partitions P. A group's lag counts what will reach it
        without a new send: unread entries of the stream and of its retry stream (replayed
        dead letters, retries) and its due retries. Exit 0 OK, 1 error, 2 --fail-if hit."""
        inspect_command(stream, as_json, fail_if, quiet, url, partitions, partition)

    @click.command("top")
    @click.argument("stream", required=False)
    @click.option("--interval", type=click.FloatRange(min=0.1), default=1.0,
                  show_default=True, help="seconds between refreshes (and rate windows)")
    @click.option("--once", is_flag=True,
                  help="take two samples --interval apart, print one frame and exit")
    @partition_options
    @url_option
    def top(stream: str | None, interval: float, once: bool, partitions: int | None,
            partition: int | None, url: str | None) -> None:
        """Live view of every stream (or STREAM): inspect's figures plus produced/s and
        acked/s (partitioned streams as totals and per partition with --partitions P).
        On a terminal it redraws in place; into a pipe or a file (`top | tee top.log`)
        it prints a plain frame every --interval. Ctrl-C quits."""
        top_command(stream, interval, once, url, partitions, partition)

    @click.command("job")
    @click.argument("stream")
    @click.argument("key")
    @click.option("--group", default=None,
                  help="consumer group (may be left out when the stream has only one)")
    @click.option("--json", "as_json", is_flag=True, help="print the status as one JSON object")
    @partition_options
    @url_option
    def job(stream: str, key: str, group: str | None, as_json: bool, partitions: int | None,
            partition: int | None, url: str | None) -> None:
        """Show what GROUP knows of job KEY: running, waiting, done (with its result), dead
        (with reason and dead-letter id) or unknown; with --partitions P, from whichever
        partition holds it (and which one that is)."""
        job_command(stream, key, group, as_json, url, partitions, partition)

    @click.command("cancel")
    @click.argument("stream")
    @click.argument("key")
    @click.option("--group", default=None,
                  help="consumer group (may be left out when the stream has only one)")
    @click.option("--reason", default="", help="why; kept in the job's status")
    @click.option("--order-key", default=None,
                  help="the order key the job was sent with, if not its key (partitioned)")
    @partition_options
    @url_option
    def cancel(stream: str, key: str, group: str | None, reason: str,
               order_key: str | None, partitions: int | None, partition: int | None,
               url: str | None) -> None:
        """Cancel job KEY for GROUP: queued, delayed or waiting, it will not run; running,
        its handler sees msg.cancelled; done, nothing changes. Prints the state it was in.
        Needs dedup on the workers (the default)."""
        cancel_command(stream, key, group, reason, order_key, url, partitions)

    for command in (inspect, top, job, cancel):
        if command.name not in main.commands:
            main.add_command(command)
