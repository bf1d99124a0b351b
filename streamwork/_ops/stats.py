"""Read-only figures of streams and consumer groups, for ``streamwork inspect`` and ``top``
and the dashboard.

:func:`read_streams` (behind :func:`stream_stats` and :func:`sample`) reads up to
:data:`CHUNK` streams in a server ``TIME`` (the clock the promoter uses: ``now``) and two
pipelined round trips, so that a server with thousands of streams costs a few round trips
per thousand streams, never one per stream: first, per stream ``S``, ``XINFO STREAM S``,
``XINFO GROUPS S``, ``ZCARD``/``ZCOUNT -inf now`` of ``{S}:delayed`` and ``XLEN {S}:dead``;
then, per group, ``XPENDING S G - + 1`` (the oldest pending entry and its idle time; only
when the group holds deliveries), ``XINFO CONSUMERS S G`` (only when it has consumers) and
its own side: ``XINFO GROUPS`` and ``XLEN`` of its retry stream, ``ZCARD``/``ZCOUNT -inf
now`` of its retry ZSET. Each command is O(1) or O(groups/consumers) on the server (no
script, nothing that walks the keyspace but the ``SCAN`` of :func:`discover_streams`), so
Redis is never blocked for long. Nothing is written. The commands are not one snapshot:
figures of a busy stream can disagree by the few jobs that moved between two reads.

A group's ``lag`` is what will reach it without any new send: the stream's entries not yet
delivered to it, plus its retry stream's (replayed dead letters, promoted retries), plus its
retries whose backoff is over but that no worker has promoted yet. Its ``pending`` counts
the deliveries it holds from both streams.

Fields Redis cannot report (``lag`` when the group's position is unknown, ``entries-read``
and ``entries-added`` before Redis 7.0) are ``None``. Rates between two samples are
:mod:`streamwork._ops.rates`'; a partitioned stream's figures (its partitions' added up)
are :mod:`streamwork._ops.partitioned`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import redis

from streamwork._ops.replies import entry_id, norm, opt_int, text
from streamwork._wire.keys import StreamKeys, is_dead_letter_stream, is_owned_key
from streamwork.errors import ConfigError, StreamNotFound

__all__ = [
    "ConsumerStats",
    "GroupStats",
    "PartitionStats",
    "RetrySide",
    "StreamStats",
    "discover_streams",
    "read_retry_side",
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


@dataclass(frozen=True, slots=True)
class RetrySide:
    """What waits for one group on its own side: its retry stream and its retry ZSET."""

    #: entries of the retry stream not yet delivered to the group; None when Redis cannot tell
    lag: int | None = 0
    pending: int = 0  #: deliveries from the retry stream not acknowledged yet
    waiting: int = 0  #: retries in the ZSET, due or not
    due: int = 0  #: of which due (score <= now): a worker of the group promotes them next

    def total_lag(self, stream_lag: int | None) -> int | None:
        """The group's whole lag given its lag on the stream itself: that, plus the retry
        stream's, plus the due retries; None when either lag is unknown."""
        if stream_lag is None or self.lag is None:
            return None
        return stream_lag + self.lag + self.due


def retry_side(group: str, groups_reply: Any, length: Any, waiting: Any, due: Any) -> RetrySide:
    """:class:`RetrySide` of ``group`` from the replies to ``XINFO GROUPS`` and ``XLEN`` of
    its retry stream and ``ZCARD``/``ZCOUNT -inf now`` of its retry ZSET (an exception in
    place of the XINFO/XLEN reply: no retry stream yet, counted as empty).

    Without a consumer group on the retry stream (its workers create it at id 0 when they
    start) every entry there is still to be delivered. A null lag (Redis < 7, or entries
    deleted past the group's position) stays unknown, as on the stream itself, unless the
    retry stream is empty."""
    entries = 0 if isinstance(length, Exception) else int(length or 0)
    found: dict[str, Any] | None = None
    if not isinstance(groups_reply, Exception):
        for raw in groups_reply or []:
            info = norm(raw)
            if text(info.get("name")) == group:
                found = info
                break
    if found is None:
        lag: int | None = entries
        pending = 0
    else:
        lag = opt_int(found.get("lag"))
        if lag is None and entries == 0:
            lag = 0
        pending = int(found.get("pending") or 0)
    return RetrySide(lag=lag, pending=pending, waiting=int(waiting or 0), due=int(due or 0))


def read_retry_side(client: Any, keys: StreamKeys, name: str, now_ms: int) -> RetrySide:
    """:class:`RetrySide` of group ``name`` (a sync client), read in one pipelined round
    trip; empty for a group name streamwork would not accept (it has no retry keys)."""
    try:
        gkeys = keys.group(name)
    except ConfigError:
        return RetrySide()
    pipe = client.pipeline(transaction=False)
    pipe.xinfo_groups(gkeys.retry)
    pipe.xlen(gkeys.retry)
    pipe.zcard(gkeys.retries)
    pipe.zcount(gkeys.retries, "-inf", now_ms)
    groups, length, waiting, due = pipe.execute(raise_on_error=False)
    for reply in (waiting, due):
        if isinstance(reply, Exception):
            raise reply
    return retry_side(name, groups, length, waiting, due)


@dataclass(frozen=True, slots=True)
class _GroupPlan:
    """What the second round trip asks about one group, and what it already knows."""

    info: dict[str, Any]
    oldest: bool  #: XPENDING - + 1 queued (the group holds deliveries)
    consumers: bool  #: XINFO CONSUMERS queued (the group has consumers)
    side: bool  #: the four reads of its retry side queued (a name streamwork accepts)


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


def _queue_group(pipe: Any, stream: str, keys: StreamKeys, info: dict[str, Any],
                 now_ms: int) -> _GroupPlan:
    name = text(info["name"])
    plan = _GroupPlan(info, int(info.get("pending") or 0) > 0,
                      int(info.get("consumers") or 0) > 0, True)
    if plan.oldest:
        pipe.xpending_range(stream, name, min="-", max="+", count=1)
    if plan.consumers:
        pipe.xinfo_consumers(stream, name)
    try:
        gkeys = keys.group(name)
    except ConfigError:  # a group streamwork would not accept has no retry keys
        return dataclasses.replace(plan, side=False)
    pipe.xinfo_groups(gkeys.retry)
    pipe.xlen(gkeys.retry)
    pipe.zcard(gkeys.retries)
    pipe.zcount(gkeys.retries, "-inf", now_ms)
    return plan


def _group_stats(plan: _GroupPlan, replies: Iterator[Any]) -> GroupStats | None:
    """A group's figures from its plan and its replies (consumed from ``replies``); None
    when it was deleted between the two round trips."""
    info, name = plan.info, text(plan.info["name"])
    oldest = next(replies) if plan.oldest else []
    consumers_raw = next(replies) if plan.consumers else []
    side_replies = [next(replies) for _ in range(4)] if plan.side else []
    if _gone(oldest, "nogroup", "no such key") or _gone(consumers_raw, "nogroup",
                                                          "no such key"):
        return None
    oldest_age: float | None = None
    oldest_id: str | None = None
    if _checked(oldest):
        first = norm(oldest[0])
        oldest_id = text(first.get("message_id"))
        oldest_age = int(first.get("time_since_delivered") or 0) / 1000
    consumer_list = [
        ConsumerStats(text(c["name"]), int(c.get("pending") or 0), int(c.get("idle") or 0) / 1000)
        for c in (norm(x) for x in _checked(consumers_raw))
    ]
    consumer_list.sort(key=lambda c: (-c.pending, c.name))
    side = RetrySide()
    if side_replies:
        groups, length, waiting, due = side_replies
        side = retry_side(name, groups, length, _checked(waiting), _checked(due))
    return GroupStats(
        name=name,
        consumers=int(info.get("consumers") or 0),
        pending=int(info.get("pending") or 0) + side.pending,
        oldest_pending_age_s=oldest_age,
        lag=side.total_lag(opt_int(info.get("lag"))),
        entries_read=opt_int(info.get("entries-read")),
        last_delivered_id=text(info.get("last-delivered-id") or b"0-0"),
        top_consumers=[(c.name, c.pending) for c in consumer_list if c.pending > 0
                       ][:TOP_CONSUMERS],
        consumer_list=consumer_list,
        oldest_pending_id=oldest_id,
        retries_waiting=side.waiting,
        retry_lag=side.lag,
        retries_due=side.due,
    )


def _read_chunk(client: Any, names: Sequence[str]) -> list[StreamStats | StreamNotFound]:
    """:func:`read_streams` of at most :data:`CHUNK` streams: TIME, then two pipelined
    round trips (the streams, then their groups)."""
    now_ms = _now_ms(client)
    keys = [StreamKeys.of_any(name) for name in names]
    pipe = client.pipeline(transaction=False)
    for name, k in zip(names, keys, strict=True):
        pipe.xinfo_stream(name)
        pipe.xinfo_groups(name)
        pipe.zcard(k.delayed)
        pipe.zcount(k.delayed, "-inf", now_ms)
        pipe.xlen(k.dead)
    first = pipe.execute(raise_on_error=False)
    pipe = client.pipeline(transaction=False)
    plans: list[list[_GroupPlan] | StreamNotFound] = []
    for i, (name, k) in enumerate(zip(names, keys, strict=True)):
        info, groups_raw = first[5 * i], first[5 * i + 1]
        if _gone(info, "no such key") or _gone(groups_raw, "no such key"):
            plans.append(StreamNotFound(name))
        elif _gone(info, "wrongtype"):
            plans.append(_not_found(client, name))
        else:
            _checked(info)
            plans.append([_queue_group(pipe, name, k, norm(raw), now_ms)
                          for raw in _checked(groups_raw)])
    replies = iter(pipe.execute(raise_on_error=False) if len(pipe) else [])
    out: list[StreamStats | StreamNotFound] = []
    for i, (name, plan) in enumerate(zip(names, plans, strict=True)):
        if isinstance(plan, StreamNotFound):
            out.append(plan)
            continue
        read = [_group_stats(p, replies) for p in plan]
        groups = sorted((g for g in read if g is not None), key=lambda g: g.name)
        info = norm(first[5 * i])
        delayed, due, dead = (_checked(x) for x in first[5 * i + 2: 5 * i + 5])
        last = info.get("last-generated-id") or entry_id(info.get("last-entry")) or "0-0"
        out.append(StreamStats(
            stream=name,
            length=int(info.get("length") or 0),
            first_id=entry_id(info.get("first-entry")),
            last_id=text(last),
            groups=groups,
            delayed_total=int(delayed) + sum(g.retries_waiting for g in groups),
            delayed_due=int(due) + sum(g.retries_due for g in groups),
            dead=int(dead),
            entries_added=opt_int(info.get("entries-added")),
            taken_at_ms=now_ms,
        ))
    return out


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
