"""Reading what redis-py returns to the ops layer's XINFO/XPENDING calls: text, optional
integers, reply maps, entry ids, and the order of stream entry ids (``ms-seq``), which
is time order across streams."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["entry_id", "id_order", "norm", "opt_int", "sum_known", "text"]


def text(value: Any) -> str:
    """A reply value as str (bytes decoded as UTF-8, undecodable bytes replaced)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def opt_int(value: Any) -> int | None:
    """A reply value as int; None when it is missing or not a number."""
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def sum_known(values: Iterable[int | None]) -> int | None:
    """The sum, or None when any value is unknown."""
    total = 0
    for v in values:
        if v is None:
            return None
        total += v
    return total


def norm(reply: Any) -> dict[str, Any]:
    """A reply map with str keys (redis-py gives str keys on RESP2, bytes on some paths)."""
    if isinstance(reply, Mapping):
        return {text(k): v for k, v in reply.items()}
    if isinstance(reply, (list, tuple)):  # a flat [k, v, k, v, ...] reply
        return {text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    return {}


def entry_id(entry: Any) -> str | None:
    """Id of an XINFO STREAM first/last-entry (``(id, fields)``), None when empty."""
    if not entry:
        return None
    return text(entry[0])


def id_order(entry_id: str) -> tuple[int, int]:
    """The sort key of a stream entry id ``ms-seq``: ``(ms, seq)`` (``(0, 0)`` for text
    that is not an id)."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0
