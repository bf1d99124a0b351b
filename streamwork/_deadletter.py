"""Dead-letter stream operations: list, replay, purge (used by the CLI and by users).

A dead letter ``{S}:dead`` entry has the fields ``reason``, ``error_type``, ``detail``
(message and short traceback), ``src_stream``, ``src_id``, ``attempts``, ``group``,
``consumer``, ``worker``, ``ts`` (Unix ms) and every original field of the job's entry,
byte for byte, under ``f.<name>`` (``f.d`` is the body).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _scripts as scripts
from ._codec import decode_body
from ._keys import StreamKeys
from .errors import DecodeError

__all__ = ["DeadLetterEntry", "list_dead", "purge_dead", "replay_dead"]


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
        payload = self.payload
        if isinstance(payload, bytes):
            payload = payload.hex()
        return {
            "id": self.id, "reason": self.reason, "error_type": self.error_type,
            "detail": self.detail, "src_id": self.src_id, "attempts": self.attempts,
            "consumer": self.consumer, "group": self.group, "ts_ms": self.ts_ms,
            "key": self.key,
            "payload": payload,
            "original": {k: v.decode("utf-8", "replace") for k, v in self.original.items()},
        }


def _text(values: dict[bytes, bytes], name: str) -> str:
    return values.get(name.encode(), b"").decode("utf-8", "replace")


def _decode_id(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def _parse(entry_id: bytes, values: dict[bytes, bytes]) -> DeadLetterEntry:
    original = {k[2:].decode("utf-8", "replace"): v for k, v in values.items()
                if k.startswith(b"f.")}
    key: str | None = None
    payload: Any = None
    try:
        env = decode_body(values.get(b"f.d"))
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
