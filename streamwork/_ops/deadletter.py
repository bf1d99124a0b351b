"""Dead-letter stream operations: list, replay, purge (used by the CLI and by users).

A dead letter ``{S}:dead`` entry has the fields ``reason``, ``error_type``, ``detail``
(message and short traceback), ``src_stream``, ``src_id``, ``attempts``, ``group``,
``consumer``, ``worker``, ``ts`` (Unix ms) and every original field of the job's entry,
byte for byte, under ``f.<name>`` (``f.d`` is the body).

A partitioned stream keeps one dead-letter stream per partition (each partition's own keys):
:func:`list_dead_partitions` merges them oldest first, :func:`locate_dead` says which
partition holds a dead-letter id, and a replay or purge runs per partition, each replay
going back into the same partition's group retry stream.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
import redis

from streamwork._ops.replies import id_order
from streamwork._redis import scripts
from streamwork._wire.codec import decode_body
from streamwork._wire.extensions import to_json
from streamwork._wire.keys import StreamKeys
from streamwork.errors import DecodeError

__all__ = ["DeadLetterEntry", "PartitionDeadLetter", "list_dead", "list_dead_many",
           "list_dead_partitions", "locate_dead", "purge_dead", "replay_dead"]

CHUNK: Final = 200  #: dead-letter streams read per pipelined round trip


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One dead letter, decoded for display; ``original`` keeps the raw fields."""

    id: str
    reason: str
    error_type: str
    detail: str
    src_id: str
    attempts: int
    consumer: str
    ts_ms: int
    key: str | None
    payload: Any
    original: dict[str, bytes] = field(repr=False)
    group: str = ""  #: the consumer group it died in (a replay goes back to it)

    def as_json(self) -> dict[str, Any]:
        """The dead letter as JSON values, losslessly: ``payload`` as `json_value` gives
        it (None when the body does not decode; Decimal and UUID as str, date and datetime
        in ISO 8601, an ext type of a codec as ``{"ext", "hex"}``), ``original`` each entry
        field's bytes as `json_bytes` gives them (a field name that is not UTF-8:
        ``base64:<its bytes>``)."""
        return {
            "id": self.id, "reason": self.reason, "error_type": self.error_type,
            "detail": self.detail, "src_id": self.src_id, "attempts": self.attempts,
            "consumer": self.consumer, "group": self.group, "ts_ms": self.ts_ms,
            "key": self.key,
            "payload": json_value(self.payload),
            "original": {_json_name(k): json_bytes(v) for k, v in self.original.items()},
        }


#: the keys of the objects that stand for values JSON has no form of (see `json_value`)
MARKERS: Final = frozenset({"base64", "map", "float"})


def json_bytes(data: bytes) -> str | dict[str, str]:
    """Bytes as JSON: the text when they are valid UTF-8, else ``{"base64": "..."}``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def json_value(value: Any) -> Any:
    """A decoded MessagePack value as JSON, so that the value can be told back exactly:
    ``bytes`` -> ``{"base64": "..."}`` (a str stays a str); a map whose keys are not all
    str, or that would read as one of these markers -> ``{"map": [[key, value], ...]}``;
    NaN and the infinities -> ``{"float": "nan" | "inf" | "-inf"}``; lists stay lists."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": str(value)}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and not (
                len(value) == 1 and next(iter(value)) in MARKERS):
            return {k: json_value(v) for k, v in value.items()}
        return {"map": [[json_value(k), json_value(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)) and not isinstance(value, msgpack.ExtType):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return to_json(value)  # the ext types: Decimal, UUID, date, datetime, a codec's


def _json_name(name: str) -> str:
    """A field name decoded with surrogateescape, as a JSON object key."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raw = name.encode("utf-8", "surrogateescape")
        return "base64:" + base64.b64encode(raw).decode("ascii")
    return name


def _text(values: dict[bytes, bytes], name: str) -> str:
    return values.get(name.encode(), b"").decode("utf-8", "replace")


def _decode_id(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def _parse(entry_id: bytes, values: dict[bytes, bytes]) -> DeadLetterEntry:
    # surrogateescape: a name that is not UTF-8 keeps its bytes (see _json_name)
    original = {k[2:].decode("utf-8", "surrogateescape"): v for k, v in values.items()
                if k.startswith(b"f.")}
    key: str | None = None
    payload: Any = None
    try:
        env = decode_body(values.get(b"f.d"), keep_ext=True)  # whatever codec wrote it
        key, payload = env.key, env.payload
    except DecodeError:
        pass
    return DeadLetterEntry(
        id=entry_id.decode(), reason=_text(values, "reason"),
        error_type=_text(values, "error_type"), detail=_text(values, "detail"),
        src_id=_text(values, "src_id"), attempts=int(_text(values, "attempts") or 0),
        consumer=_text(values, "consumer"), ts_ms=int(_text(values, "ts") or 0),
        key=key, payload=payload, original=original, group=_text(values, "group"),
    )


def list_dead(
    client: Any, stream: str, count: int = 100, start: str = "-"
) -> list[DeadLetterEntry]:
    """The oldest ``count`` dead letters of ``stream`` from ``start`` on."""
    keys = StreamKeys.for_stream(stream)
    return [_parse(eid, values) for eid, values in client.xrange(keys.dead, start, "+", count)]


def list_dead_many(client: Any, streams: Sequence[str], count: int = 100,
                   ) -> dict[str, list[DeadLetterEntry]]:
    """The oldest ``count`` dead letters of each of ``streams``, read in one pipelined
    round trip per :data:`CHUNK` streams (not one per stream)."""
    out: dict[str, list[DeadLetterEntry]] = {}
    for i in range(0, len(streams), CHUNK):
        names = streams[i:i + CHUNK]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.xrange(StreamKeys.for_stream(name).dead, "-", "+", count)
        for name, page in zip(names, pipe.execute(), strict=True):
            out[name] = [_parse(eid, values) for eid, values in page]
    return out


def replay_dead(client: Any, stream: str, ids: Sequence[str] | None = None,
                batch: int = 100, *, group: str | None = None) -> tuple[int, int]:
    """Hand dead letters (all when ``ids`` is None; only ``group``'s when given) back to
    the group each died in, as fresh jobs on that group's retry stream: other groups of the
    stream never see them again. Each leaves the dead-letter stream in the same atomic step.
    Returns (replayed, skipped)."""
    keys = StreamKeys.for_stream(stream)
    if group is not None:
        keys.group(group)  # checks the name
    runner = scripts.SyncScripts(client)

    def replay(chunk: Sequence[str]) -> tuple[int, int]:
        replayed, skipped = runner.run(scripts.replay(keys, group or "", chunk))
        return int(replayed), int(skipped)

    replayed = skipped = 0
    if ids is not None:
        todo = list(ids)
        for i in range(0, len(todo), batch):
            r, s = replay(todo[i:i + batch])
            replayed, skipped = replayed + r, skipped + s
        return replayed, skipped
    # Only what is dead now: a replayed job that fails again is dead-lettered under a new
    # id past this one, and must not be replayed again by this same call (no endless loop).
    last = client.xrevrange(keys.dead, "+", "-", count=1)
    if not last:
        return replayed, skipped
    end = _decode_id(last[0][0])
    start = "-"
    while True:
        page = client.xrange(keys.dead, start, end, batch)
        if not page:
            return replayed, skipped
        page_ids = [_decode_id(eid) for eid, _ in page]
        r, s = replay(page_ids)
        replayed, skipped = replayed + r, skipped + s
        if page_ids[-1] == end:
            return replayed, skipped
        start = "(" + page_ids[-1]


def purge_dead(client: Any, stream: str, *, older_than_ms: int | None = None,
               ids: Sequence[str] | None = None) -> int:
    """Delete dead letters: the given ids, or those older than ``older_than_ms`` (Unix ms),
    or all of them. Returns how many were deleted."""
    keys = StreamKeys.for_stream(stream)
    if ids is not None:
        return int(client.xdel(keys.dead, *ids)) if ids else 0
    if older_than_ms is None:
        return int(client.xtrim(keys.dead, maxlen=0, approximate=False))
    return int(client.xtrim(keys.dead, minid=f"{older_than_ms}-0", approximate=False))


# ---------------------------------------------------------------- partitioned streams


@dataclass(frozen=True, slots=True)
class PartitionDeadLetter:
    """A dead letter of one partition of a partitioned stream."""

    partition: int  #: 0-based
    stream: str  #: the partition's stream name (``S#i.n``)
    entry: DeadLetterEntry

    def as_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "stream": self.stream, **self.entry.as_json()}


def list_dead_partitions(client: Any, partitions: Iterable[tuple[int, str]],
                         count: int = 100) -> list[PartitionDeadLetter]:
    """The oldest ``count`` dead letters over ``partitions`` (``(number, stream name)``
    pairs), oldest first: dead-letter ids are times, so they order across partitions."""
    pairs = list(partitions)
    found = list_dead_many(client, [name for _, name in pairs], count)
    merged = [PartitionDeadLetter(i, name, e) for i, name in pairs for e in found[name]]
    merged.sort(key=lambda d: (id_order(d.entry.id), d.partition))
    return merged[:count]


def locate_dead(client: Any, streams: Sequence[str], ids: Sequence[str]) -> dict[str, list[str]]:
    """Which of ``streams`` (partitions) hold each dead-letter id in their dead-letter stream:
    id -> the streams, in the order given (empty: none has it). Reads only."""
    where: dict[str, list[str]] = {i: [] for i in ids}
    for name in streams:
        dead = StreamKeys.for_stream(name).dead
        pipe = client.pipeline(transaction=False)
        for entry_id in where:
            pipe.xrange(dead, entry_id, entry_id, count=1)
        for entry_id, found in zip(where, pipe.execute(raise_on_error=False), strict=True):
            if found and not isinstance(found, redis.RedisError):
                where[entry_id].append(name)
    return where
