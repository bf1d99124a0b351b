"""What waits for a consumer group besides the stream itself: its retry side (retry stream
and retry ZSET) and the stream's priority levels (``{S}:p:high``, ``{S}:p:low``), read
from the replies :mod:`streamwork._ops.stats` and the worker's gauges collect."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamwork._ops.replies import norm, opt_int, text
from streamwork._wire.priorities import SIBLINGS


@dataclass(frozen=True, slots=True)
class RetrySide:
    """What waits for one group on its own side: its retry stream and its retry ZSET."""

    #: entries of the retry stream not yet delivered to the group; None when Redis cannot tell
    lag: int | None = 0
    pending: int = 0  #: deliveries from the retry stream not acknowledged yet
    waiting: int = 0  #: retries in the ZSET, due or not
    due: int = 0  #: of which due (score <= now): a worker of the group promotes them next
    #: entries the group has read from the retry stream (XINFO GROUPS entries-read; 0
    #: without the group there); None when Redis cannot tell
    entries_read: int | None = 0

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
    found = None if isinstance(groups_reply, Exception) else named(groups_reply, group)
    read: int | None = 0
    if found is None:
        lag: int | None = entries
        pending = 0
    else:
        lag = opt_int(found.get("lag"))
        if lag is None and entries == 0:
            lag = 0
        pending = int(found.get("pending") or 0)
        read = read_count(found)
    return RetrySide(lag=lag, pending=pending, waiting=int(waiting or 0), due=int(due or 0),
                     entries_read=read)


def read_count(info: dict[str, Any]) -> int | None:
    """A group's entries-read from its XINFO GROUPS entry: 0 for a group that has read
    nothing yet (Redis says null until its first read from id 0), None when Redis cannot
    tell (before 7.0, or a group created at another id that has not read since)."""
    read = opt_int(info.get("entries-read"))
    if read is None and text(info.get("last-delivered-id") or b"0-0") == "0-0":
        return 0
    return read


def named(groups_reply: Any, name: str) -> dict[str, Any] | None:
    """The entry of group ``name`` in an XINFO GROUPS reply, None when it has none."""
    for raw in groups_reply or []:
        info = norm(raw)
        if text(info.get("name")) == name:
            return info
    return None



def add_read(read: int | None, last_id: str, more: int | None) -> int | None:
    """A group's entries-read on the stream (``read``, as Redis says it: null before its
    first read from id 0, ``last_id`` still ``0-0``) plus what it read elsewhere (``more``:
    its retry stream, the levels); Redis's own figure when ``more`` is 0."""
    if more == 0:
        return read
    counted = 0 if read is None and last_id == "0-0" else read
    return None if counted is None or more is None else counted + more


def level_read(group: str, replies: list[Any]) -> int | None:
    """The entries ``group`` has read from the stream's level streams (XINFO GROUPS
    entries-read), from the replies :func:`level_side` takes: 0 for a level without the
    group (nothing delivered from it yet), None when Redis cannot tell."""
    total = 0
    for groups_reply in replies[::2]:
        found = None if isinstance(groups_reply, Exception) else named(groups_reply, group)
        if found is not None:
            read = read_count(found)
            if read is None:
                return None
            total += read
    return total


def level_streams(infos: list[Any]) -> dict[str, tuple[int, int | None]]:
    """``(length, entries-added)`` of each level stream that exists (entries-added None
    before Redis 7.0), from the replies to ``XINFO STREAM`` of each in SIBLINGS order (an
    error: no such stream; none at all: the stream has no level). They count in the
    stream's length and entries-added: a job sent at high or low is one of the stream's."""
    out: dict[str, tuple[int, int | None]] = {}
    for level, reply in zip(SIBLINGS, infos, strict=False):
        if isinstance(reply, Exception):
            continue
        info = norm(reply)
        out[level] = (int(info.get("length") or 0), opt_int(info.get("entries-added")))
    return out


def level_side(group: str, replies: list[Any]) -> tuple[dict[str, int | None], int]:
    """The lag per level (``high``, ``low``: levels with a stream only) and the pending
    deliveries on the levels of ``group``, from the replies to ``XINFO GROUPS`` and ``XLEN``
    of each level stream in SIBLINGS order (an error: no such stream; none at all: the
    stream has no level). Without the group on
    an existing level stream (no worker has looked since the first job was sent there),
    every entry there is lag."""
    lags: dict[str, int | None] = {}
    pending = 0
    if not replies:  # the stream has no level stream (nothing was asked)
        return lags, pending
    for level, groups_reply, length in zip(SIBLINGS, replies[::2], replies[1::2], strict=True):
        if isinstance(length, Exception) or not length:
            continue
        found = None if isinstance(groups_reply, Exception) else named(groups_reply, group)
        if found is None:
            lags[level] = int(length)
            continue
        lags[level] = opt_int(found.get("lag"))
        pending += int(found.get("pending") or 0)
    return lags, pending
