"""Read-only figures of streams and consumer groups, for ``streamwork inspect`` and ``top``.

One call of :func:`stream_stats` reads, for stream ``S``: ``XINFO STREAM S``, ``XINFO
GROUPS S`` and per group ``XPENDING S G`` (summary), ``XPENDING S G - + 1`` (the oldest
pending entry and its idle time), ``XINFO CONSUMERS S G``, ``XPENDING`` of the group's retry
stream (counted in its pending) and ``ZCARD``/``ZCOUNT -inf now`` of its retry ZSET; then
the same counts of ``{S}:delayed`` (``now`` from the server's ``TIME``, the clock the
promoter uses) and ``XLEN {S}:dead``. Nothing is written. The commands are not one
snapshot: figures of a busy stream
can disagree by the few jobs that moved between two reads.

:func:`compute_rates` turns two samples into produced/s per stream and acked/s per group.
Fields Redis cannot report (``lag`` when the group's position is unknown, ``entries-read``
and ``entries-added`` before Redis 7.0) are ``None``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import redis

from ._keys import StreamKeys, is_dead_letter_stream, is_owned_key
from .errors import ConfigError, StreamNotFound

__all__ = [
    "ConsumerStats",
    "GroupStats",
    "StreamRates",
    "StreamStats",
    "compute_rates",
    "discover_streams",
    "sample",
    "stream_stats",
]

TOP_CONSUMERS: Final = 3  #: consumers listed in ``GroupStats.top_consumers``


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """One consumer of a group: deliveries it holds, seconds since it last talked to Redis."""

    name: str
    pending: int
    idle_s: float

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One consumer group of a stream."""

    name: str
    consumers: int
    pending: int
    #: idle seconds of the oldest pending entry (lowest id): time since it was last
    #: delivered, reclaimed or heartbeated; None when nothing is pending
    oldest_pending_age_s: float | None
    #: entries not yet delivered to the group; None when Redis cannot tell
    lag: int | None
    entries_read: int | None
    last_delivered_id: str
    top_consumers: list[tuple[str, int]] = field(default_factory=list)
    consumer_list: list[ConsumerStats] = field(default_factory=list)
    oldest_pending_id: str | None = None
    #: retries of this group waiting for their backoff (its retry ZSET); its retry stream's
    #: pending deliveries are counted in ``pending``
    retries_waiting: int = 0

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["top_consumers"] = [{"name": n, "pending": p} for n, p in self.top_consumers]
        return out


@dataclass(frozen=True, slots=True)
class StreamStats:
    """One stream, its groups, its delayed retries and its dead letters."""

    stream: str
    length: int
    first_id: str | None
    last_id: str
    groups: list[GroupStats]
    delayed_total: int
    delayed_due: int
    dead: int
    #: XINFO STREAM entries-added (every XADD ever, trimmed or not); None before Redis 7.0
    entries_added: int | None = None
    #: server time (Unix ms) when the sample was taken
    taken_at_ms: int = 0

    def group(self, name: str) -> GroupStats | None:
        return next((g for g in self.groups if g.name == name), None)

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["groups"] = [g.as_json() for g in self.groups]
        return out


@dataclass(frozen=True, slots=True)
class StreamRates:
    """Rates between two samples of one stream; None where they cannot be computed."""

    stream: str
    interval_s: float
    produced_per_s: float | None
    acked_per_s: dict[str, float | None]

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _s(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _opt_int(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _norm(reply: Any) -> dict[str, Any]:
    """A reply map with str keys (redis-py gives str keys on RESP2, bytes on some paths)."""
    if isinstance(reply, Mapping):
        return {_s(k): v for k, v in reply.items()}
    if isinstance(reply, (list, tuple)):  # a flat [k, v, k, v, ...] reply
        return {_s(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    return {}


def _entry_id(entry: Any) -> str | None:
    """Id of an XINFO STREAM first/last-entry (``(id, fields)``), None when empty."""
    if not entry:
        return None
    return _s(entry[0])


def _now_ms(client: Any) -> int:
    secs, micros = client.time()
    return int(secs) * 1000 + int(micros) // 1000


def _retry_side(client: Any, keys: StreamKeys, name: str, now_ms: int) -> tuple[int, int, int]:
    """(pending on the group's retry stream, retries waiting, of which due) of group
    ``name``; zeros for a group name streamwork would not accept."""
    try:
        gkeys = keys.group(name)
    except ConfigError:
        return 0, 0, 0
    try:
        pending = int(_norm(client.xpending(gkeys.retry, name)).get("pending") or 0)
    except redis.ResponseError:  # no retry stream (or group on it) yet
        pending = 0
    return (pending, int(client.zcard(gkeys.retries)),
            int(client.zcount(gkeys.retries, "-inf", now_ms)))


def _group_stats(client: Any, stream: str, info: Mapping[str, Any]) -> GroupStats | None:
    name = _s(info["name"])
    try:
        summary = _norm(client.xpending(stream, name))
        oldest = client.xpending_range(stream, name, min="-", max="+", count=1)
        consumers_raw = client.xinfo_consumers(stream, name)
    except redis.ResponseError as exc:
        if "NOGROUP" in str(exc):  # deleted between XINFO GROUPS and now
            return None
        raise
    pending = int(summary.get("pending") or 0)
    per_consumer = [(_s(c["name"]), int(c["pending"]))
                    for c in (_norm(x) for x in summary.get("consumers") or [])]
    per_consumer.sort(key=lambda np: (-np[1], np[0]))
    oldest_age: float | None = None
    oldest_id: str | None = None
    if oldest:
        first = _norm(oldest[0])
        oldest_id = _s(first.get("message_id"))
        oldest_age = int(first.get("time_since_delivered") or 0) / 1000
    consumer_list = [
        ConsumerStats(_s(c["name"]), int(c.get("pending") or 0), int(c.get("idle") or 0) / 1000)
        for c in (_norm(x) for x in consumers_raw)
    ]
    consumer_list.sort(key=lambda c: (-c.pending, c.name))
    return GroupStats(
        name=name,
        consumers=int(info.get("consumers") or 0),
        pending=pending,
        oldest_pending_age_s=oldest_age,
        lag=_opt_int(info.get("lag")),
        entries_read=_opt_int(info.get("entries-read")),
        last_delivered_id=_s(info.get("last-delivered-id") or b"0-0"),
        top_consumers=per_consumer[:TOP_CONSUMERS],
        consumer_list=consumer_list,
        oldest_pending_id=oldest_id,
    )


def stream_stats(client: Any, stream: str) -> StreamStats:
    """Figures of ``stream`` (a sync client with bytes replies); raises StreamNotFound."""
    kind = _s(client.type(stream))
    if kind == "none":
        raise StreamNotFound(stream)
    if kind != "stream":
        raise StreamNotFound(stream, f"is a {kind}, not a stream")
    now_ms = _now_ms(client)
    try:
        info = _norm(client.xinfo_stream(stream))
        groups_raw = client.xinfo_groups(stream)
    except redis.ResponseError as exc:
        if "no such key" in str(exc).lower():  # deleted since TYPE
            raise StreamNotFound(stream) from None
        raise
    keys = StreamKeys.of_any(stream)
    groups, waiting, due = [], 0, 0
    for raw in groups_raw:
        g = _group_stats(client, stream, _norm(raw))
        if g is None:
            continue
        retry_pending, retry_waiting, retry_due = _retry_side(client, keys, g.name, now_ms)
        waiting, due = waiting + retry_waiting, due + retry_due
        groups.append(dataclasses.replace(g, pending=g.pending + retry_pending,
                                          retries_waiting=retry_waiting))
    groups.sort(key=lambda g: g.name)
    last = info.get("last-generated-id") or _entry_id(info.get("last-entry")) or "0-0"
    return StreamStats(
        stream=stream,
        length=int(info.get("length") or 0),
        first_id=_entry_id(info.get("first-entry")),
        last_id=_s(last),
        groups=groups,
        delayed_total=int(client.zcard(keys.delayed)) + waiting,
        delayed_due=int(client.zcount(keys.delayed, "-inf", now_ms)) + due,
        dead=int(client.xlen(keys.dead)),
        entries_added=_opt_int(info.get("entries-added")),
        taken_at_ms=now_ms,
    )


def discover_streams(client: Any, *, include_dead: bool = False) -> list[str]:
    """Every stream on the server (SCAN TYPE stream), sorted, without dead-letter streams."""
    found: set[str] = set()
    for raw in client.scan_iter(count=1000, _type="stream"):
        try:
            name = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            continue  # not a name streamwork could have created or can address
        if is_dead_letter_stream(name):
            if include_dead:
                found.add(name)
        elif not is_owned_key(name):  # a group's retry stream belongs to its stream
            found.add(name)
    return sorted(found)


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
    length when the last id moved (trimming hides entries, so that one is a lower bound).
    acked/s of a group is ``(entries-read growth - pending growth) / interval``: what the
    group read and no longer holds. ``interval_s`` defaults to the server-time difference.
    """
    seconds = interval_s if interval_s is not None else (
        (after.taken_at_ms - before.taken_at_ms) / 1000)
    if seconds <= 0:
        return StreamRates(after.stream, 0.0, None, {g.name: None for g in after.groups})
    produced: float | None
    if before.entries_added is not None and after.entries_added is not None:
        produced = _per_s(after.entries_added - before.entries_added, seconds)
    elif after.last_id == before.last_id:
        produced = 0.0
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


def sample(client: Any, streams: Iterable[str] | None = None) -> list[StreamStats]:
    """Stats of ``streams`` (default: every discovered stream); missing ones are skipped."""
    names = list(streams) if streams is not None else discover_streams(client)
    out: list[StreamStats] = []
    for name in names:
        try:
            out.append(stream_stats(client, name))
        except StreamNotFound:
            continue
    return out
