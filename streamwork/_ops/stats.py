"""Read-only figures of streams and consumer groups, for ``streamwork inspect`` and ``top``.

One call of :func:`stream_stats` reads, for stream ``S``: ``XINFO STREAM S``, ``XINFO
GROUPS S`` and per group ``XPENDING S G`` (summary), ``XPENDING S G - + 1`` (the oldest
pending entry and its idle time), ``XINFO CONSUMERS S G``, and one pipelined round trip on
the group's own side (:func:`read_retry_side`): ``XINFO GROUPS`` and ``XLEN`` of its retry
stream, ``ZCARD``/``ZCOUNT -inf now`` of its retry ZSET; then the same counts of
``{S}:delayed`` (``now`` from the server's ``TIME``, the clock the promoter uses) and ``XLEN
{S}:dead``. Nothing is written. The commands are not one snapshot: figures of a busy stream
can disagree by the few jobs that moved between two reads.

A group's ``lag`` is what will reach it without any new send: the stream's entries not yet
delivered to it, plus its retry stream's (replayed dead letters, promoted retries), plus its
retries whose backoff is over but that no worker has promoted yet. Its ``pending`` counts
the deliveries it holds from both streams.

:func:`compute_rates` turns two samples into produced/s per stream and acked/s per group.
Fields Redis cannot report (``lag`` when the group's position is unknown, ``entries-read``
and ``entries-added`` before Redis 7.0) are ``None``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import redis

from streamwork._wire.keys import StreamKeys, is_dead_letter_stream, is_owned_key
from streamwork._wire.partitions import partition_names
from streamwork.errors import ConfigError, StreamNotFound

__all__ = [
    "ConsumerStats",
    "GroupStats",
    "PartitionStats",
    "RetrySide",
    "StreamRates",
    "StreamStats",
    "compute_rates",
    "discover_streams",
    "merge_stats",
    "partitioned_stats",
    "read_retry_side",
    "retry_side",
    "sample",
    "sample_partitioned",
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
            info = _norm(raw)
            if _s(info.get("name")) == group:
                found = info
                break
    if found is None:
        lag: int | None = entries
        pending = 0
    else:
        lag = _opt_int(found.get("lag"))
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
        side = read_retry_side(client, keys, g.name, now_ms)
        waiting, due = waiting + side.waiting, due + side.due
        groups.append(dataclasses.replace(
            g, lag=side.total_lag(g.lag), pending=g.pending + side.pending,
            retries_waiting=side.waiting, retry_lag=side.lag, retries_due=side.due))
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


# ---------------------------------------------------------------- partitioned streams


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0


def _sum_known(values: Iterable[int | None]) -> int | None:
    """The sum, or None when any value is unknown."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def _merge_group(parts: Sequence[GroupStats]) -> GroupStats:
    """One group's figures over the partitions it exists on: counts add up, a consumer
    (same name on several partitions: one worker) counts once, the oldest pending entry is
    the oldest of all."""
    consumers: dict[str, ConsumerStats] = {}
    for g in parts:
        for c in g.consumer_list:
            seen = consumers.get(c.name)
            consumers[c.name] = c if seen is None else ConsumerStats(
                c.name, seen.pending + c.pending, min(seen.idle_s, c.idle_s))
    consumer_list = sorted(consumers.values(), key=lambda c: (-c.pending, c.name))
    # each partition's top_consumers holds its top few only: rank the full lists' sums
    top = [(c.name, c.pending) for c in consumer_list if c.pending > 0]
    aged = [g for g in parts if g.oldest_pending_age_s is not None]
    oldest = max(aged, key=lambda g: g.oldest_pending_age_s or 0.0) if aged else None
    return GroupStats(
        name=parts[0].name,
        consumers=len(consumers) if consumers else max(g.consumers for g in parts),
        pending=sum(g.pending for g in parts),
        oldest_pending_age_s=None if oldest is None else oldest.oldest_pending_age_s,
        lag=_sum_known(g.lag for g in parts),
        entries_read=_sum_known(g.entries_read for g in parts),
        last_delivered_id=max((g.last_delivered_id for g in parts), key=_id_key),
        top_consumers=top[:TOP_CONSUMERS],
        consumer_list=consumer_list,
        oldest_pending_id=None if oldest is None else oldest.oldest_pending_id,
        retries_waiting=sum(g.retries_waiting for g in parts),
        retry_lag=_sum_known(g.retry_lag for g in parts),
        retries_due=sum(g.retries_due for g in parts),
    )


def merge_stats(stream: str, parts: Sequence[StreamStats]) -> StreamStats:
    """The figures of ``parts`` (a stream's partitions) added up, named ``stream``: length,
    lag, pending, retries, delayed and dead letters are sums (lag, entries-read and
    entries-added are None when any partition cannot tell), groups are merged by name,
    first/last id are the oldest/newest over all partitions."""
    names = sorted({g.name for s in parts for g in s.groups})
    groups = [_merge_group([g for s in parts for g in s.groups if g.name == name])
              for name in names]
    firsts = [s.first_id for s in parts if s.first_id]
    return StreamStats(
        stream=stream,
        length=sum(s.length for s in parts),
        first_id=min(firsts, key=_id_key) if firsts else None,
        last_id=max((s.last_id for s in parts), key=_id_key, default="0-0"),
        groups=groups,
        delayed_total=sum(s.delayed_total for s in parts),
        delayed_due=sum(s.delayed_due for s in parts),
        dead=sum(s.dead for s in parts),
        entries_added=_sum_known(s.entries_added for s in parts),
        taken_at_ms=max((s.taken_at_ms for s in parts), default=0),
    )


def _node_of(client: Any, key: str) -> str | None:
    """``host:port`` of the Cluster node serving ``key`` (from the client's slot map, no
    round trip); None on a single server."""
    find = getattr(client, "get_node_from_key", None)
    if find is None:
        return None
    try:
        node = find(key)
    except Exception:  # only a label: an unknown slot map is no error
        return None
    return None if node is None else f"{node.host}:{node.port}"


def _owners(client: Any, stream: str, groups: Iterable[GroupStats]) -> dict[str, str | None]:
    keys = StreamKeys.of_any(stream)
    owners: dict[str, str | None] = {}
    for g in groups:
        try:
            owner_key = keys.group(g.name).owner
        except ConfigError:
            continue
        raw = client.get(owner_key)
        owners[g.name] = None if raw is None else _s(raw)
    return owners


def partitioned_stats(client: Any, stream: str, partitions: int,
                      only: int | None = None) -> StreamStats:
    """Figures of the partitioned ``stream``: the sums over its ``partitions`` partitions
    (or over partition ``only``, then named by its own stream name), with each partition's
    own figures, owner (ordered mode) and Cluster node in ``partitions``. Raises
    StreamNotFound when none of the partitions looked at exists."""
    names = partition_names(stream, partitions)
    picked = list(enumerate(names)) if only is None else [(only, names[only])]
    parts: list[PartitionStats] = []
    for i, name in picked:
        try:
            st: StreamStats | None = stream_stats(client, name)
        except StreamNotFound as exc:
            if "does not exist" not in str(exc):
                raise
            st = None
        owners = {} if st is None else _owners(client, name, st.groups)
        parts.append(PartitionStats(i, name, st, owners, _node_of(client, name)))
    found = [p.stats for p in parts if p.stats is not None]
    if not found:
        which = (f"partition {only} ({names[only]})" if only is not None else
                 f"any of its {partitions} partitions ({names[0]} ... {names[-1]})")
        raise StreamNotFound(stream, f"has no stream for {which}: check --partitions "
                                     "(the partitions= its producers use)")
    label = stream if only is None else names[only]
    merged = merge_stats(label, found)
    return dataclasses.replace(merged, partitions=tuple(parts), partition_count=partitions)


_PARTITION_NAME: Final = re.compile(r"^(?P<base>.+)#(?P<i>\d+)\.\d+$")


def _base_of(name: str, partitions: int) -> str | None:
    """The partitioned stream ``name`` is a partition of (with this partition count)."""
    m = _PARTITION_NAME.match(name)
    if m is None or int(m["i"]) >= partitions:
        return None
    try:
        names = partition_names(m["base"], partitions)
    except ConfigError:
        return None
    return m["base"] if names[int(m["i"])] == name else None


def sample_partitioned(client: Any, partitions: int) -> list[StreamStats]:
    """Like :func:`sample` over every stream, but the partitions of a stream split into
    ``partitions`` count as that one stream (their sums); other streams as they are."""
    plain: list[str] = []
    bases: set[str] = set()
    for name in discover_streams(client):
        base = _base_of(name, partitions) if partitions > 1 else None
        if base is None:
            plain.append(name)
        else:
            bases.add(base)
    out = sample(client, plain)
    for base in bases:
        try:
            out.append(partitioned_stats(client, base, partitions))
        except StreamNotFound:
            continue
    return sorted(out, key=lambda s: s.stream)


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
