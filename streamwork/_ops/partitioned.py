"""A partitioned stream's figures: its partitions' :class:`~streamwork._ops.stats.StreamStats`
added up (:func:`merge_stats`, pure), read with each partition's own figures, the worker
owning it in ordered mode and, on a Cluster, the node serving it (:func:`partitioned_stats`),
and every stream of a server with partitioned ones counted once (:func:`sample_partitioned`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from streamwork._ops.replies import id_order, text
from streamwork._ops.replies import sum_known as _sum_known
from streamwork._ops.stats import (
    TOP_CONSUMERS,
    ConsumerStats,
    GroupStats,
    PartitionStats,
    StreamStats,
    discover_streams,
    read_streams,
)
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork.errors import ConfigError, StreamNotFound

__all__ = ["merge_stats", "partition_base", "partitioned_many", "partitioned_stats",
           "recorded_partitions", "recorded_partitions_many", "sample_partitioned",
           "sample_streams"]


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
        last_delivered_id=max((g.last_delivered_id for g in parts), key=id_order),
        top_consumers=top[:TOP_CONSUMERS],
        consumer_list=consumer_list,
        oldest_pending_id=None if oldest is None else oldest.oldest_pending_id,
        retries_waiting=sum(g.retries_waiting for g in parts),
        retry_lag=_sum_known(g.retry_lag for g in parts),
        retries_due=sum(g.retries_due for g in parts),
        paused=next((g.paused for g in parts if g.paused is not None), None),
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
        first_id=min(firsts, key=id_order) if firsts else None,
        last_id=max((s.last_id for s in parts), key=id_order, default="0-0"),
        groups=groups,
        delayed_total=sum(s.delayed_total for s in parts),
        delayed_due=sum(s.delayed_due for s in parts),
        dead=sum(s.dead for s in parts),
        outbox=sum(s.outbox for s in parts),
        entries_added=_sum_known(s.entries_added for s in parts),
        taken_at_ms=max((s.taken_at_ms for s in parts), default=0),
        level_length=_level_lengths(parts),
    )


def _level_lengths(parts: Sequence[StreamStats]) -> dict[str, int]:
    """Each priority level's entries over ``parts`` (levels some partition has)."""
    out: dict[str, int] = {}
    for s in parts:
        for level, n in s.level_length.items():
            out[level] = out.get(level, 0) + n
    return out


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


def _owner_reads(client: Any, parts: Sequence[tuple[str, StreamStats]],
                 ) -> list[dict[str, str | None]]:
    """Each partition's group -> lease holder (ordered mode), in one pipelined round trip."""
    pipe = client.pipeline(transaction=False)
    asked: list[list[str]] = []
    for name, st in parts:
        keys = StreamKeys.of_any(name)
        names: list[str] = []
        for g in st.groups:
            try:
                owner_key = keys.group(g.name).owner
            except ConfigError:
                continue
            pipe.get(owner_key)
            names.append(g.name)
        asked.append(names)
    replies = iter(pipe.execute() if len(pipe) else [])
    return [{g: None if (raw := next(replies)) is None else text(raw) for g in names}
            for names in asked]


def _picked(streams: Mapping[str, int], only: int | None) -> dict[str, list[tuple[int, str]]]:
    """Each partitioned stream's ``(index, partition stream)`` pairs looked at."""
    picked: dict[str, list[tuple[int, str]]] = {}
    for stream, partitions in streams.items():
        names = partition_names(stream, partitions)
        picked[stream] = list(enumerate(names)) if only is None else [(only, names[only])]
    return picked


def _assemble(client: Any, streams: Mapping[str, int], picked: Mapping[str, list[tuple[int, str]]],
              read: Mapping[str, StreamStats | StreamNotFound],
              only: int | None) -> dict[str, StreamStats | StreamNotFound]:
    """The partitioned streams' figures from their partitions' (``read``), with the owners
    read in one more round trip."""
    existing = [(name, st) for _, pairs in picked.items() for _, name in pairs
                if isinstance(st := read[name], StreamStats)]
    owners = dict(zip((name for name, _ in existing), _owner_reads(client, existing),
                      strict=True))
    out: dict[str, StreamStats | StreamNotFound] = {}
    for stream, pairs in picked.items():
        wrong = [st for _, name in pairs if isinstance(st := read[name], StreamNotFound)
                 and "does not exist" not in str(st)]
        if wrong:  # a partition's name holds a key of another type
            out[stream] = wrong[0]
            continue
        parts = [PartitionStats(i, name, st if isinstance(st := read[name], StreamStats)
                                else None, owners.get(name, {}), _node_of(client, name))
                 for i, name in pairs]
        out[stream] = _merged(stream, streams[stream], parts, only)
    return out


def partitioned_many(client: Any, streams: Mapping[str, int],
                     only: int | None = None) -> dict[str, StreamStats | StreamNotFound]:
    """:func:`partitioned_stats` of each partitioned stream (name -> partition count), all
    read together: the partitions of every stream in :func:`read_streams`' few round trips,
    their owners in one more. A stream none of whose partitions exists, or one of whose
    partitions is a key of another type, maps to the StreamNotFound saying so."""
    picked = _picked(streams, only)
    flat = [name for pairs in picked.values() for _, name in pairs]
    read = dict(zip(flat, read_streams(client, flat), strict=True))
    return _assemble(client, streams, picked, read, only)


def sample_streams(client: Any, plain: Sequence[str],
                   split: Mapping[str, int]) -> list[StreamStats]:
    """The figures of the ``plain`` streams and of the partitioned ones (``split``: name ->
    partition count, summed over their partitions), all read together, sorted by name;
    those that do not exist are left out."""
    picked = _picked(split, None)
    flat = list(plain) + [name for pairs in picked.values() for _, name in pairs]
    read = dict(zip(flat, read_streams(client, flat), strict=True))
    out = [st for name in plain if isinstance(st := read[name], StreamStats)]
    out += [st for st in _assemble(client, split, picked, read, None).values()
            if isinstance(st, StreamStats)]
    return sorted(out, key=lambda s: s.stream)


def _merged(stream: str, partitions: int, parts: list[PartitionStats],
            only: int | None) -> StreamStats | StreamNotFound:
    found = [p.stats for p in parts if p.stats is not None]
    if not found:
        first, last = parts[0].stream, parts[-1].stream
        which = (f"partition {only} ({first})" if only is not None else
                 f"any of its {partitions} partitions ({first} ... {last})")
        return StreamNotFound(stream, f"has no stream for {which}: check --partitions "
                                      "(the partitions= its producers use)")
    label = stream if only is None else parts[0].stream
    merged = merge_stats(label, found)
    return dataclasses.replace(merged, partitions=tuple(parts), partition_count=partitions)


def partitioned_stats(client: Any, stream: str, partitions: int,
                      only: int | None = None) -> StreamStats:
    """Figures of the partitioned ``stream``: the sums over its ``partitions`` partitions
    (or over partition ``only``, then named by its own stream name), with each partition's
    own figures, owner (ordered mode) and Cluster node in ``partitions``. Raises
    StreamNotFound when none of the partitions looked at exists."""
    found = partitioned_many(client, {stream: partitions}, only)[stream]
    if isinstance(found, StreamNotFound):
        raise found
    return found


_PARTITION_NAME: Final = re.compile(r"^(?P<base>.+)#(?P<i>\d+)\.\d+$")


def recorded_partitions(client: Any, stream: str) -> int | None:
    """The partition count recorded for ``stream`` in ``{S}:partitions`` (by its first
    partitioned producer or worker; one GET), None when none is. Raises ConfigError for
    a name that cannot be partitioned, ValueError for a value that is not a count."""
    raw = client.get(StreamKeys.for_stream(stream).partitions)
    return None if raw is None else int(raw)


def recorded_partitions_many(client: Any, streams: Sequence[str]) -> dict[str, int]:
    """The partition count recorded for each of ``streams`` in one pipelined round trip:
    1 when none is, or for a name that cannot be partitioned, or a value that is not a
    count (as the dashboard reads them)."""
    keyed: list[tuple[str, str]] = []
    for stream in streams:
        try:
            keyed.append((stream, StreamKeys.for_stream(stream).partitions))
        except ConfigError:
            continue
    pipe = client.pipeline(transaction=False)
    for _, key in keyed:
        pipe.get(key)
    counts = dict.fromkeys(streams, 1)
    for (stream, _), raw in zip(keyed, pipe.execute() if keyed else [], strict=True):
        try:
            counts[stream] = 1 if raw is None else int(raw)
        except ValueError:
            continue
    return counts


def partition_base(name: str) -> str | None:
    """The stream ``name`` looks like a partition of (``S`` of ``S#i.n``), None when it
    does not look like one (whether it is one depends on the partition count)."""
    m = _PARTITION_NAME.match(name)
    return None if m is None else m["base"]


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
    return sample_streams(client, plain, dict.fromkeys(sorted(bases), partitions))
