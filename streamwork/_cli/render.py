"""The rich tables of ``streamwork inspect`` (:func:`render_inspect`) and of a ``streamwork
top`` frame (:func:`render_top`); the figures are :mod:`streamwork._ops.stats`' and
:mod:`streamwork._ops.rates`', written as :mod:`streamwork._ops.format` writes them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Final

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from streamwork._ops.format import fmt_age, fmt_count, fmt_rate
from streamwork._ops.rates import StreamRates
from streamwork._ops.stats import GroupStats, PartitionStats, StreamStats
from streamwork._ops.summary import oldest, total_pending, worst_lag

__all__ = ["render_inspect", "render_overview", "render_top"]

#: the overview's columns: (heading, right-aligned)
_OVERVIEW: Final = (("stream", False), ("length", True), ("groups", True), ("lag (max)", True),
                    ("pending", True), ("oldest pending", True), ("delayed due/all", True),
                    ("dead", True))


def _title(s: StreamStats) -> str:
    if not s.partitions:
        return f"stream {s.stream}"
    if len(s.partitions) == 1 and s.partition_count > 1:
        return f"stream {s.stream} (partition {s.partitions[0].index} of {s.partition_count})"
    return f"stream {s.stream} (totals of {len(s.partitions)} partitions)"


def _stream_table(s: StreamStats) -> Table:
    table = Table(title=_title(s), title_justify="left", title_style="bold")
    cols = ("length", "entries added", "first id", "last id", "delayed due/all", "dead")
    for col in cols + (("outbox",) if s.outbox else ()):  # chained jobs not moved yet
        table.add_column(col, justify="left" if "id" in col else "right", no_wrap=True)
    table.add_row(fmt_count(s.length), fmt_count(s.entries_added), s.first_id or "-", s.last_id,
                  f"{s.delayed_due:,} / {s.delayed_total:,}", fmt_count(s.dead),
                  *((fmt_count(s.outbox),) if s.outbox else ()))
    return table


def _top(g: GroupStats) -> str:
    return "\n".join(f"{name} ({pending:,})" for name, pending in g.top_consumers) or "-"


def _state(g: GroupStats) -> Text:
    """``running``, or ``paused`` with its reason (a paused group starts no job)."""
    if g.paused is None:
        return Text("running")
    return Text("paused" + (f": {g.paused.reason}" if g.paused.reason else ""), style="yellow")


def _groups_table(s: StreamStats) -> Table:
    table = Table(title=f"groups of {s.stream}", title_justify="left")
    table.add_column("group", no_wrap=True)
    for col in ("consumers", "entries-read", "lag", "pending", "oldest pending"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("top consumers (pending)")
    table.add_column("state")
    for g in s.groups:
        table.add_row(g.name, fmt_count(g.consumers), fmt_count(g.entries_read),
                      fmt_count(g.lag), fmt_count(g.pending), fmt_age(g.oldest_pending_age_s),
                      _top(g), _state(g))
    return table


def _consumers_table(s: StreamStats) -> Table:
    table = Table(title=f"consumers of {s.stream}", title_justify="left")
    table.add_column("group", no_wrap=True)
    table.add_column("consumer")
    table.add_column("pending", justify="right", no_wrap=True)
    table.add_column("idle", justify="right", no_wrap=True)
    for g in s.groups:
        for c in g.consumer_list:
            table.add_row(g.name, c.name, fmt_count(c.pending), fmt_age(c.idle_s))
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
        figures = [fmt_count(st.length), f"{st.delayed_due:,} / {st.delayed_total:,}",
                   fmt_count(st.dead)]
        if not st.groups:
            table.add_row(*head, *figures, "-", "", "", "", "")
        for g in st.groups:
            table.add_row(*head, *figures, g.name, fmt_count(g.lag), fmt_count(g.pending),
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


def render_overview(samples: Sequence[StreamStats]) -> str:
    """One line per stream, as plain aligned text (the dashboard's stream list): what
    ``inspect`` prints for many streams, where thousands of rich tables would take
    seconds to draw."""
    rows = [[s.stream + (f" ({s.partition_count} partitions)" if s.partitions else ""),
             fmt_count(s.length), str(len(s.groups)),
             fmt_count(worst_lag(s)) if s.groups else "-", fmt_count(total_pending(s)),
             fmt_age(oldest(s)), f"{s.delayed_due:,} / {s.delayed_total:,}", fmt_count(s.dead)]
            for s in samples]
    heads = [head for head, _ in _OVERVIEW]
    widths = [max(len(cells[i]) for cells in [heads, *rows]) for i in range(len(heads))]
    return "\n".join(
        "  ".join(cell.rjust(w) if right else cell.ljust(w)
                  for cell, w, (_, right) in zip(cells, widths, _OVERVIEW, strict=True)).rstrip()
        for cells in [heads, *rows])


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
    groups.add_column("state")
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
        streams.add_row(s.stream, fmt_count(s.length), fmt_rate(r.produced_per_s if r else None),
                        f"{s.delayed_due:,} / {s.delayed_total:,}", fmt_count(s.dead))
        for g in s.groups:
            label = f"{s.stream}/{g.name}"
            groups.add_row(label, fmt_count(g.lag), fmt_count(g.pending),
                           fmt_age(g.oldest_pending_age_s),
                           fmt_rate(r.acked_per_s.get(g.name) if r else None),
                           fmt_count(g.consumers), _state(g))
            idle = {c.name: c.idle_s for c in g.consumer_list}
            for name, pending in g.top_consumers:
                busy.add_row(label, name, fmt_count(pending), fmt_age(idle.get(name)))
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
    produced = fmt_rate(r.produced_per_s if r else None)
    if not st.groups:
        table.add_row(label, "-", fmt_count(st.length), produced, "", "", "",
                      fmt_count(st.dead), "", *node)
    for g in st.groups:
        table.add_row(label, g.name, fmt_count(st.length), produced, fmt_count(g.lag),
                      fmt_count(g.pending), fmt_rate(r.acked_per_s.get(g.name) if r else None),
                      fmt_count(st.dead), _owner(p, g.name), *node)
