"""What the dashboard shows, read from Redis with a sync client; and its actions.

The figures come from :mod:`streamwork._ops.stats`, the code behind ``streamwork inspect
--json``, so the page and the CLI agree: a plain stream's figures are those of
``inspect --json``; a partitioned stream (its partition count recorded in
``{S}:partitions``) is shown once, as the sums over its partitions, the figures of
``inspect S --json``. Dead letters go through :mod:`streamwork._ops.deadletter` (list, replay,
purge), job lookups through :meth:`streamwork.Producer.status` and pausing a group
through :meth:`streamwork.Producer.pause` / ``resume``, as ``streamwork dlq``, ``job``,
``pause`` and ``resume`` do.

Anything shown of a payload, result, key or error text is cut to a preview
(:func:`preview`, :func:`clip`); the template escapes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import redis

from streamwork._ops import deadletter, partitioned, stats
from streamwork._ops.replies import id_order
from streamwork._ops.stats import StreamStats
from streamwork._producer.shells import Producer
from streamwork._redis.faults import denial
from streamwork._text import redact_url
from streamwork._wire.joins import JoinStatus
from streamwork._wire.partitions import partition_names
from streamwork._wire.records import JobStatus
from streamwork.errors import ConfigError, StreamworkError

__all__ = [
    "PREVIEW_CHARS",
    "DeadRow",
    "JobLookup",
    "clip",
    "dead_letters",
    "lookup_job",
    "partition_streams",
    "partition_streams_of",
    "pause_group",
    "preview",
    "purge",
    "redact_url",
    "replay",
    "resume_group",
    "snapshot",
]

PREVIEW_CHARS: Final = 2048  #: characters of a payload's / result's repr shown at most
KEY_CHARS: Final = 256  #: characters of a job key shown at most
SHORT_CHARS: Final = 300  #: characters of a reason or an error's first line shown in a row
DEAD_SHOWN: Final = 50  #: dead letters listed per stream (oldest first)


def clip(text: str, limit: int = PREVIEW_CHARS) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with "…"."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A size-capped ``repr`` of a decoded payload or result."""
    return clip(repr(value), limit)


def _recorded_partitions(client: Any, base: str) -> int:
    """The partition count recorded for ``base`` (``{S}:partitions``), 1 when none is."""
    try:
        count = partitioned.recorded_partitions(client, base)
    except ValueError:  # a name that cannot be partitioned (ConfigError), or not a count
        return 1
    return 1 if count is None else count


def snapshot(client: Any) -> list[StreamStats]:
    """Every stream on the server, sorted by name: plain streams as ``inspect --json``
    shows them, partitioned streams as the sums over their partitions (with each
    partition in ``partitions``), as ``inspect S --json`` shows them. A few pipelined
    round trips per thousand streams (the SCAN, the partition counts, the figures)."""
    names = stats.discover_streams(client)
    bases = sorted({b for name in names if (b := partitioned.partition_base(name)) is not None})
    counts = partitioned.recorded_partitions_many(client, bases)
    split = {base: count for base, count in counts.items()
             if count > 1 and _names(base, count)}
    owned = {n for base, count in split.items() for n in _names(base, count)}
    return partitioned.sample_streams(client, [name for name in names if name not in owned],
                                      split)


def _names(base: str, count: int) -> tuple[str, ...]:
    try:
        return partition_names(base, count)
    except ConfigError:
        return ()


def partition_streams_of(client: Any, stream: str) -> list[tuple[int | None, str]]:
    """Like :func:`partition_streams`, from the partition count recorded for ``stream``."""
    count = _recorded_partitions(client, stream)
    names = _names(stream, count) if count > 1 else ()
    return list(enumerate(names)) if names else [(None, stream)]


def partition_streams(s: StreamStats) -> list[tuple[int | None, str]]:
    """The streams holding ``s``'s dead letters: ``[(None, name)]`` for a plain stream,
    ``(index, partition stream)`` for each partition of a partitioned one."""
    if not s.partitions:
        return [(None, s.stream)]
    return [(p.index, p.stream) for p in s.partitions]


@dataclass(frozen=True, slots=True)
class DeadRow:
    """One dead letter as listed: where it is (the partition's own stream) and previews."""

    where: str  #: the stream whose dead-letter stream holds it (a partition's name)
    partition: int | None
    entry: deadletter.DeadLetterEntry

    @property
    def key(self) -> str:
        return clip(self.entry.key or "?", KEY_CHARS)

    @property
    def reason(self) -> str:
        return clip(self.entry.reason, SHORT_CHARS)

    @property
    def payload(self) -> str:
        return preview(self.entry.payload)

    @property
    def error(self) -> str:
        """``error_type: first line of the detail``, capped."""
        first = self.entry.detail.splitlines()[0] if self.entry.detail else ""
        return clip(f"{self.entry.error_type}: {first}" if self.entry.error_type else first,
                    SHORT_CHARS)

    @property
    def detail(self) -> str:
        return clip(self.entry.detail)


def dead_letters(client: Any, streams: Sequence[StreamStats],
                 count: int = DEAD_SHOWN) -> dict[str, list[DeadRow]]:
    """The oldest ``count`` dead letters of each of ``streams`` that has any (merged over
    a partitioned stream's partitions), by stream name: one pipelined read of them all."""
    places = {s.stream: partition_streams(s) for s in streams if s.dead}
    found = deadletter.list_dead_many(
        client, [name for where in places.values() for _, name in where], count)
    out: dict[str, list[DeadRow]] = {}
    for stream, where in places.items():
        rows = [DeadRow(name, i, e) for i, name in where for e in found[name]]
        rows.sort(key=lambda d: (id_order(d.entry.id), d.partition or 0))
        out[stream] = rows[:count]
    return out


def replay(client: Any, wheres: Sequence[str], ids: Sequence[str] | None) -> tuple[int, int]:
    """Replay dead letters of the streams ``wheres`` (a stream, or its partitions): the
    given ids (all in ``wheres[0]``), or all of each. Returns (replayed, skipped)."""
    if ids is not None:
        return deadletter.replay_dead(client, wheres[0], list(ids))
    replayed = skipped = 0
    for where in wheres:
        r, s = deadletter.replay_dead(client, where, None)
        replayed, skipped = replayed + r, skipped + s
    return replayed, skipped


def purge(client: Any, wheres: Sequence[str], ids: Sequence[str] | None) -> int:
    """Delete dead letters of ``wheres``: the given ids (in ``wheres[0]``), or all."""
    if ids is not None:
        return deadletter.purge_dead(client, wheres[0], ids=list(ids))
    return sum(deadletter.purge_dead(client, where) for where in wheres)


@dataclass(frozen=True, slots=True)
class JobLookup:
    """A job looked up by key: one status per group asked (every group when none was
    named), or the error that stopped the lookup."""

    stream: str
    key: str
    group: str
    statuses: tuple[JobStatus, ...] = ()
    error: str = ""
    join: JoinStatus | None = None  #: the join of that key whose callback is this stream's


def lookup_job(client: Any, streams: Sequence[StreamStats], stream: str, key: str,
               group: str = "") -> JobLookup:
    """What each group of ``stream`` (or just ``group``) knows of job ``key``, read with
    :meth:`Producer.status` (``streamwork job``'s reading) over the dashboard's client."""
    found = next((s for s in streams if s.stream == stream), None)
    if found is None:
        return JobLookup(stream, key, group, error=f"no stream named {stream!r} on this server")
    if not key:
        return JobLookup(stream, key, group, error="give the job's key")
    if group and found.group(group) is None:
        return JobLookup(stream, key, group, error=f"stream {stream!r} has no consumer group "
                                                   f"named {group!r}")
    groups = [group] if group else [g.name for g in found.groups]
    if not groups:
        return JobLookup(stream, key, group, error=f"stream {stream!r} has no consumer group "
                                                   "yet: no job of it has started")
    count = found.partition_count
    producer = Producer(client, partitions={stream: count} if count > 1 else 1)
    try:
        statuses = tuple(producer.status(stream, key, group=g) for g in groups)
        joined = producer.join_status(stream, key) if count <= 1 else None
        return JobLookup(stream, key, group, statuses,
                         join=joined if joined is not None and joined.state != "unknown"
                         else None)
    except StreamworkError as exc:
        return JobLookup(stream, key, group, error=str(exc))


def _group_producer(client: Any, stream: str, group: str) -> Producer:
    """A producer over the dashboard's client for ``stream`` (its partitions), once
    ``group`` is found among the stream's groups; ValueError saying what is wrong else."""
    names: set[str] = set()
    for _, name in partition_streams_of(client, stream):
        try:
            names.update(g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
                         for g in client.xinfo_groups(name))
        except redis.ResponseError as exc:  # no such stream (partition)
            if denial(exc) is not None:  # the user may not ask: a 403 says so
                raise
            continue
    if group not in names:
        raise ValueError(f"stream {stream!r} has no consumer group {group!r}")
    count = _recorded_partitions(client, stream)
    return Producer(client, partitions={stream: count} if count > 1 else 1)


def pause_group(client: Any, stream: str, group: str, reason: str) -> None:
    """Pause ``group`` of ``stream`` (every partition's), as ``streamwork pause`` does."""
    _group_producer(client, stream, group).pause(stream, group, reason=reason)


def resume_group(client: Any, stream: str, group: str) -> bool:
    """Resume ``group`` of ``stream``; whether it was paused."""
    return _group_producer(client, stream, group).resume(stream, group)
