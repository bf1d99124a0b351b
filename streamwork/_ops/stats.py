"""Read-only figures of streams and consumer groups, for ``streamwork inspect`` and ``top``
and the dashboard.

:func:`read_streams` (behind :func:`stream_stats` and :func:`sample`) reads up to
:data:`CHUNK` streams in a server ``TIME`` (the clock the promoter uses: ``now``) and three
pipelined round trips, so that a server with thousands of streams costs a few round trips
per thousand streams, never one per stream: first, per stream ``S``, ``XINFO STREAM S``,
``XINFO GROUPS S``, ``ZCARD {S}:delayed``, ``XLEN {S}:dead``, ``XLEN {S}:outbox`` and
``EXISTS`` of its two priority level streams; then, per group ``G``,
``XPENDING S G - + 1`` (the oldest pending entry and its idle time; only when the group
holds deliveries), ``XINFO CONSUMERS S G`` (only when it has consumers), ``XINFO GROUPS``
of its retry stream, ``ZCARD`` of its retry ZSET and ``HGETALL`` of its pause hash, and
``XINFO GROUPS``, ``XLEN`` and ``XINFO STREAM`` of the level streams of a stream that has
them; last, only where needed, the due counts (``ZCOUNT -inf now`` of a ZSET that is not
empty) and ``XLEN`` of a retry stream whose group cannot tell its lag. Each command is O(1)
or O(groups/consumers) on the server (no script, nothing that walks the keyspace but the
``SCAN`` of :func:`discover_streams`), so Redis is never blocked for long. Nothing is
written. The commands are not one snapshot: figures of a busy stream can disagree by the
few jobs that moved between two reads.

Every figure counts the priority levels' streams too. A group's ``lag`` is what will reach
it without any new send: the entries not yet delivered to it, plus its retry stream's
(replays, promoted retries), plus its retries whose backoff is over but not yet promoted;
its ``pending`` and ``entries_read`` count its retry stream too.

Fields Redis cannot report (``lag`` when the group's position is unknown, ``entries-read``
and ``entries-added`` before Redis 7.0) are ``None``. Rates between two samples are
:mod:`streamwork._ops.rates`'; a partitioned stream's figures (its partitions' added up)
are :mod:`streamwork._ops.partitioned`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import redis

from streamwork._ops.replies import entry_id, norm, opt_int, sum_known, text
from streamwork._ops.sides import (
    RetrySide,
    add_read,
    level_read,
    level_side,
    level_streams,
    named,
    retry_side,
)
from streamwork._wire.keys import StreamKeys, is_dead_letter_stream, is_owned_key
from streamwork._wire.pausing import PauseState, parse_pause
from streamwork._wire.priorities import sibling_streams
from streamwork.errors import ConfigError, StreamNotFound

__all__ = [
    "ConsumerStats",
    "GroupStats",
    "PartitionStats",
    "RetrySide",
    "StreamStats",
    "discover_streams",
    "read_streams",
    "retry_side",
    "sample",
    "stream_stats",
]

TOP_CONSUMERS: Final = 3  #: consumers listed in ``GroupStats.top_consumers``
#: streams read per pipelined round trip (at most a few thousand commands in one)
CHUNK: Final = 200


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
    #: jobs that will reach the group without any new send: entries of the stream and of
    #: its retry stream not yet delivered to it, plus its due retries not yet promoted
    #: (``retry_lag`` and ``retries_due`` are those parts); None when Redis cannot tell
    lag: int | None
    entries_read: int | None
    last_delivered_id: str
    top_consumers: list[tuple[str, int]] = field(default_factory=list)
    consumer_list: list[ConsumerStats] = field(default_factory=list)
    oldest_pending_id: str | None = None
    #: retries of this group waiting for their backoff (its retry ZSET); its retry stream's
    #: pending deliveries are counted in ``pending``
    retries_waiting: int = 0
    #: entries of the group's retry stream (replays, promoted retries) not yet delivered to
    #: it, counted in ``lag``; None when Redis cannot tell
    retry_lag: int | None = 0
    #: of ``retries_waiting``, those whose backoff is over but not yet promoted onto the
    #: retry stream (a worker of the group does that), counted in ``lag``
    retries_due: int = 0
    #: jobs sent at priority high or low not yet delivered to the group, per level (only
    #: levels jobs were sent at), counted in ``lag``; their pending ones are in ``pending``
    priority_lag: dict[str, int | None] = field(default_factory=dict)
    paused: PauseState | None = None  #: why and since when it is paused (None: it runs)

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
    #: a partitioned stream: the partitions these figures add up (all of them, or the one
    #: asked for), each with its own figures; empty for a plain stream
    partitions: tuple[PartitionStats, ...] = ()
    #: how many partitions the stream is split into (1: not partitioned)
    partition_count: int = 1
    #: jobs its handlers sent to other slots (Redis Cluster) not yet moved to their targets
    outbox: int = 0
    #: of ``length``, the entries of each priority level stream (``high``, ``low``: those
    #: jobs were sent at); ``length`` and ``entries_added`` count every level
    level_length: dict[str, int] = field(default_factory=dict)

    def group(self, name: str) -> GroupStats | None:
        return next((g for g in self.groups if g.name == name), None)

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(dataclasses.replace(self, groups=[], partitions=()))
        out["groups"] = [g.as_json() for g in self.groups]
        if self.partitions:
            out["partitions"] = [p.as_json() for p in self.partitions]
        else:  # a plain stream: the same document as before partitions existed
            del out["partitions"], out["partition_count"]
        return out


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """One partition of a partitioned stream."""

    index: int  #: 0-based
    stream: str  #: its stream name, ``S#i.n``
    stats: StreamStats | None  #: None when its stream does not exist (nothing sent to it yet)
    #: ordered mode: group -> member id of the worker holding the partition's lease (None:
    #: no lease, e.g. the group does not run in ordered mode)
    owners: dict[str, str | None] = field(default_factory=dict)
    node: str | None = None  #: on a Cluster: ``host:port`` of the master serving its slot

    def as_json(self) -> dict[str, Any]:
        return {"index": self.index, "stream": self.stream, "node": self.node,
                "owners": dict(self.owners),
                "stats": None if self.stats is None else self.stats.as_json()}


def _now_ms(client: Any) -> int:
    secs, micros = client.time()
    return int(secs) * 1000 + int(micros) // 1000


class _Later:
    """Commands queued on a pipeline, each with what to do with its reply."""

    def __init__(self, client: Any) -> None:
        self.pipe = client.pipeline(transaction=False)
        self._then: list[Callable[[Any], None]] = []

    def ask(self, then: Callable[[Any], None]) -> Any:
        """The pipeline to queue one command on; ``then(reply)`` runs on :meth:`run`."""
        self._then.append(then)
        return self.pipe

    def run(self) -> None:
        """One round trip (none when nothing is queued); an error reply is handed over."""
        if self._then:
            for then, reply in zip(self._then, self.pipe.execute(raise_on_error=False),
                                   strict=True):
                then(reply)


@dataclass(slots=True)
class _Group:
    """One group's replies as they come in (round trips 2 and 3 of :func:`_read_chunk`)."""

    info: dict[str, Any]
    name: str
    oldest: Any = ()
    consumers: Any = ()
    side: bool = True  #: has a retry side (a group name streamwork accepts)
    retry_groups: Any = None
    length: Any = 0
    waiting: Any = 0
    due: Any = 0
    paused: Any = None  #: HGETALL of its pause hash

    def ask(self, now: _Later, later: _Later, stream: str, keys: StreamKeys,
            now_ms: int) -> None:
        """Queue the group's reads: its oldest pending delivery (when it holds any), its
        consumers (when it has any), its retry side (what is unknown until then: later)."""
        if int(self.info.get("pending") or 0) > 0:
            now.ask(partial(setattr, self, "oldest")).xpending_range(
                stream, self.name, min="-", max="+", count=1)
        if int(self.info.get("consumers") or 0) > 0:
            now.ask(partial(setattr, self, "consumers")).xinfo_consumers(stream, self.name)
        try:
            gkeys = keys.group(self.name)
        except ConfigError:  # a group streamwork would not accept has no retry keys
            self.side = False
            return

        def retry_groups(reply: Any) -> None:
            self.retry_groups = reply
            found = None if isinstance(reply, Exception) else named(reply, self.name)
            if not isinstance(reply, Exception) and (found is None or found.get("lag") is None):
                later.ask(partial(setattr, self, "length")).xlen(gkeys.retry)

        def waiting(reply: Any) -> None:
            self.waiting = _checked(reply)
            if int(reply or 0) > 0:
                later.ask(partial(setattr, self, "due")).zcount(gkeys.retries, "-inf", now_ms)

        now.ask(retry_groups).xinfo_groups(gkeys.retry)
        now.ask(partial(setattr, self, "paused")).hgetall(gkeys.paused)
        now.ask(waiting).zcard(gkeys.retries)

    def stats(self) -> GroupStats | None:
        """The group's figures; None when it was deleted between two round trips."""
        if any(_gone(x, "nogroup", "no such key") for x in (self.oldest, self.consumers)):
            return None
        info = self.info
        oldest_age: float | None = None
        oldest_id: str | None = None
        if _checked(self.oldest):
            first = norm(self.oldest[0])
            oldest_id = text(first.get("message_id"))
            oldest_age = int(first.get("time_since_delivered") or 0) / 1000
        consumer_list = sorted(
            (ConsumerStats(text(c["name"]), int(c.get("pending") or 0),
                           int(c.get("idle") or 0) / 1000)
             for c in (norm(x) for x in _checked(self.consumers))),
            key=lambda c: (-c.pending, c.name))
        side = (retry_side(self.name, self.retry_groups, self.length, self.waiting,
                           _checked(self.due)) if self.side else RetrySide())
        last = text(info.get("last-delivered-id") or b"0-0")
        return GroupStats(
            name=self.name,
            consumers=int(info.get("consumers") or 0),
            pending=int(info.get("pending") or 0) + side.pending,
            oldest_pending_age_s=oldest_age,
            lag=side.total_lag(opt_int(info.get("lag"))),
            entries_read=add_read(opt_int(info.get("entries-read")), last, side.entries_read),
            last_delivered_id=last,
            top_consumers=[(c.name, c.pending) for c in consumer_list if c.pending > 0
                           ][:TOP_CONSUMERS],
            consumer_list=consumer_list,
            oldest_pending_id=oldest_id,
            retries_waiting=side.waiting,
            retry_lag=side.lag,
            retries_due=side.due,
            paused=parse_pause(_checked(self.paused)))


def _gone(reply: Any, *markers: str) -> bool:
    """Whether ``reply`` is an error reply whose text holds one of ``markers``."""
    return isinstance(reply, redis.ResponseError) and any(
        m in str(reply).lower() for m in markers)


def _checked(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


def _not_found(client: Any, stream: str) -> StreamNotFound:
    """Why XINFO STREAM found no stream: gone, or a key of another type (one TYPE)."""
    kind = text(client.type(stream))
    if kind in ("none", "stream"):  # gone, or made again since: not there when read
        return StreamNotFound(stream)
    return StreamNotFound(stream, f"is a {kind}, not a stream")


@dataclass(slots=True)
class _Stream:
    """One stream's replies as they come in (round trips 1 to 3 of :func:`_read_chunk`)."""

    name: str
    keys: StreamKeys
    info: Any = None
    groups_raw: Any = None
    delayed: Any = 0
    due: Any = 0
    dead: Any = 0
    outbox: Any = 0
    groups: list[_Group] = field(default_factory=list)
    levels: list[Any] = field(default_factory=list)  #: XINFO GROUPS, XLEN of each level
    level_info: list[Any] = field(default_factory=list)  #: XINFO STREAM of each level

    def stats(self, now_ms: int) -> StreamStats:
        read = [_with_levels(g, self.levels) for g in (g.stats() for g in self.groups)]
        groups = sorted((g for g in read if g is not None), key=lambda g: g.name)
        info = norm(self.info)
        last = info.get("last-generated-id") or entry_id(info.get("last-entry")) or "0-0"
        levels = level_streams(self.level_info)
        return StreamStats(
            stream=self.name,
            length=int(info.get("length") or 0) + sum(n for n, _ in levels.values()),
            first_id=entry_id(info.get("first-entry")),
            last_id=text(last),
            groups=groups,
            delayed_total=int(_checked(self.delayed)) + sum(g.retries_waiting for g in groups),
            delayed_due=int(_checked(self.due)) + sum(g.retries_due for g in groups),
            dead=int(_checked(self.dead)),
            outbox=int(_checked(self.outbox)),
            entries_added=sum_known([opt_int(info.get("entries-added")),
                                     *(added for _, added in levels.values())]),
            taken_at_ms=now_ms,
            level_length={level: n for level, (n, _) in levels.items()},
        )


def _read_chunk(client: Any, names: Sequence[str]) -> list[StreamStats | StreamNotFound]:
    """:func:`read_streams` of at most :data:`CHUNK` streams: TIME, then three pipelined
    round trips: the streams; their groups; the counts only needed when some are not
    zero (due delayed jobs and retries) or when a retry stream's group cannot tell its lag.
    """
    now_ms = _now_ms(client)
    first, second, third = _Later(client), _Later(client), _Later(client)
    streams = [_Stream(name, StreamKeys.of_any(name)) for name in names]
    for st in streams:
        first.ask(partial(setattr, st, "info")).xinfo_stream(st.name)
        first.ask(partial(setattr, st, "groups_raw")).xinfo_groups(st.name)
        first.ask(partial(_delayed, third, st, now_ms)).zcard(st.keys.delayed)
        first.ask(partial(setattr, st, "dead")).xlen(st.keys.dead)
        first.ask(partial(setattr, st, "outbox")).xlen(st.keys.outbox)
        first.ask(partial(_levels, second, st)).exists(*sibling_streams(st.keys))
    first.run()
    out: list[StreamStats | StreamNotFound | _Stream] = []
    for st in streams:
        if _gone(st.info, "no such key") or _gone(st.groups_raw, "no such key"):
            out.append(StreamNotFound(st.name))
        elif _gone(st.info, "wrongtype"):
            out.append(_not_found(client, st.name))
        else:
            _checked(st.info)
            for raw in _checked(st.groups_raw):
                info = norm(raw)
                group = _Group(info, text(info["name"]))
                group.ask(second, third, st.name, st.keys, now_ms)
                st.groups.append(group)
            out.append(st)
    second.run()
    third.run()
    return [x.stats(now_ms) if isinstance(x, _Stream) else x for x in out]


def _with_levels(g: GroupStats | None, replies: list[Any]) -> GroupStats | None:
    """``g`` with the lag, the pending deliveries and the entries read of the stream's
    priority levels added (``replies``: :func:`_levels`'; none when it has no level)."""
    if g is None or not replies:
        return g
    lags, pending = level_side(g.name, replies)
    lag = None if g.lag is None or None in lags.values() else g.lag + sum(
        v or 0 for v in lags.values())
    read = add_read(g.entries_read, g.last_delivered_id, level_read(g.name, replies))
    return dataclasses.replace(g, pending=g.pending + pending, priority_lag=lags, lag=lag,
                               entries_read=read)


def _levels(later: _Later, st: _Stream, reply: Any) -> None:
    """The priority levels of a stream that has some (most have none: one EXISTS)."""
    if not isinstance(reply, Exception) and int(reply or 0) > 0:
        for level in sibling_streams(st.keys):
            later.ask(st.levels.append).xinfo_groups(level)
            later.ask(st.levels.append).xlen(level)
            later.ask(st.level_info.append).xinfo_stream(level)


def _delayed(later: _Later, st: _Stream, now_ms: int, reply: Any) -> None:
    st.delayed = reply
    if not isinstance(reply, Exception) and int(reply or 0) > 0:
        later.ask(partial(setattr, st, "due")).zcount(st.keys.delayed, "-inf", now_ms)


def read_streams(client: Any, names: Sequence[str]) -> list[StreamStats | StreamNotFound]:
    """The figures of each of ``names`` (a sync client with bytes replies), in order, or
    the StreamNotFound saying why there are none: a TIME and two pipelined round trips
    per :data:`CHUNK` streams, however many groups they have."""
    out: list[StreamStats | StreamNotFound] = []
    for i in range(0, len(names), CHUNK):
        out += _read_chunk(client, names[i:i + CHUNK])
    return out


def stream_stats(client: Any, stream: str) -> StreamStats:
    """Figures of ``stream`` (a sync client with bytes replies); raises StreamNotFound."""
    found = read_streams(client, [stream])[0]
    if isinstance(found, StreamNotFound):
        raise found
    return found


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


def sample(client: Any, streams: Iterable[str] | None = None) -> list[StreamStats]:
    """Stats of ``streams`` (default: every discovered stream); missing ones are skipped."""
    names = list(streams) if streams is not None else discover_streams(client)
    return [s for s in read_streams(client, names) if isinstance(s, StreamStats)]
