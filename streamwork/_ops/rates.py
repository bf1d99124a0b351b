"""Rates between two samples of a stream: produced/s of the stream and acked/s of each
group, for ``streamwork top`` and the dashboard's sparklines."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamwork._ops.stats import GroupStats, StreamStats

__all__ = ["StreamRates", "compute_rates", "rates_between"]


@dataclass(frozen=True, slots=True)
class StreamRates:
    """Rates between two samples of one stream; None where they cannot be computed."""

    stream: str
    interval_s: float
    produced_per_s: float | None
    acked_per_s: dict[str, float | None]

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _per_s(delta: float, seconds: float) -> float:
    return max(0.0, delta) / seconds


def _entries_read(g: GroupStats) -> int | None:
    if g.entries_read is None and g.last_delivered_id == "0-0":
        return 0  # a group created at 0 that has not read yet
    return g.entries_read


def compute_rates(before: StreamStats, after: StreamStats,
                  interval_s: float | None = None) -> StreamRates:
    """produced/s and acked/s per group between two samples of the same stream.

    produced/s is the growth of ``entries-added`` (Redis 7+); without it, the growth of the
    length when it grew or the last id moved (trimming hides entries, so that one is a
    lower bound). acked/s of a group is ``(entries-read growth - pending growth) /
    interval``: what the group read and no longer holds. Both count every priority level
    (and acked/s the group's retry stream), as the samples' figures do. ``interval_s``
    defaults to the server-time difference.
    """
    seconds = interval_s if interval_s is not None else (
        (after.taken_at_ms - before.taken_at_ms) / 1000)
    if seconds <= 0:
        return StreamRates(after.stream, 0.0, None, {g.name: None for g in after.groups})
    produced: float | None
    if before.entries_added is not None and after.entries_added is not None:
        produced = _per_s(after.entries_added - before.entries_added, seconds)
    elif after.last_id == before.last_id and after.length <= before.length:
        produced = 0.0  # (the last id is the stream's own: a level may have grown)
    elif after.length >= before.length:
        produced = _per_s(after.length - before.length, seconds)
    else:
        produced = None
    acked: dict[str, float | None] = {}
    for g in after.groups:
        prev = before.group(g.name)
        read_before = _entries_read(prev) if prev is not None else None
        read_after = _entries_read(g)
        if prev is None or read_before is None or read_after is None:
            acked[g.name] = None
            continue
        read = read_after - read_before
        acked[g.name] = None if read < 0 else _per_s(read - (g.pending - prev.pending), seconds)
    return StreamRates(after.stream, seconds, produced, acked)




def rates_between(before: Sequence[StreamStats],
                  after: Sequence[StreamStats]) -> dict[str, StreamRates]:
    """The rates of every stream sampled both times, by stream name; a partitioned
    stream's partitions too (each by its own stream name)."""
    prev = {s.stream: s for s in before}
    rates = {s.stream: compute_rates(prev[s.stream], s) for s in after if s.stream in prev}
    for s in after:  # a partitioned stream: each partition's rates too
        old = {p.stream: p.stats for p in prev[s.stream].partitions} if s.stream in prev else {}
        for p in s.partitions:
            was = old.get(p.stream)
            if p.stats is not None and was is not None:
                rates[p.stream] = compute_rates(was, p.stats)
    return rates
