"""Which idle deliveries the reclaimer may take back as a batch, and the deliveries this
process let go itself.

A delivery made once (or handed back unrun) is nearly always innocent: it comes back in a
batch. One delivered twice or more may have killed the process that held it, so it is a
suspect and runs alone. But a delivery this process read itself, and let go only because
Redis was unreachable while its lease ran out, did not kill anything: this process is
alive. `LetGo` remembers those, with the delivery count they had, so that after a second
outage in a row they still come back as a batch instead of one at a time. The count must
not have moved since (no one else took them meanwhile); they still count towards
``max_deliveries``, and a batch never takes one whose lone try would then be past it.

Leases that ran out while Redis answered (a handler blocking the event loop, a starved
machine) are not remembered: what blocked the loop may be among them, and taking them
back together would stall the batch again, and again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamwork._worker.core.delivery import Delivery, ref


class LetGo:
    """Deliveries let go here while innocent (``ref`` -> delivery count then), and those
    taken back as innocent (``ref`` -> the count they came back with); at most ``limit``
    of each, the oldest forgotten first (a forgotten one is merely taken back alone).
    ``redis_down``: whether Redis is, or just was, unreachable (the consumer's `Link`)."""

    __slots__ = ("_gone", "_kept", "limit", "max_deliveries", "redis_down")

    def __init__(self, limit: int, max_deliveries: int,
                 redis_down: Callable[[], bool] = lambda: False) -> None:
        self.limit = limit
        self.max_deliveries = max_deliveries
        self.redis_down = redis_down
        self._gone: dict[bytes, int] = {}
        self._kept: dict[bytes, int] = {}

    def remember(self, d: Delivery) -> None:
        """``d`` leaves without its outcome (its lease lapsed, or it vanished): remember it
        if Redis was unreachable and it was innocent here (a first delivery, or one taken
        back as innocent)."""
        kept = self._kept.pop(d.ref, None)
        if self.redis_down() and (d.count <= 1 or kept == d.count):
            _put(self._gone, d.ref, d.count, self.limit)

    def innocent(self, key: bytes, count: int) -> bool:
        """Whether this consumer's idle delivery ``key``, delivered ``count`` times, is one
        it let go while innocent and no one has taken since: its count is the same, or one
        more (a claim back by this consumer whose reply was lost, as Redis went down;
        another consumer's claim would have made the delivery its own)."""
        gone = self._gone.get(key)
        return gone is not None and gone <= count <= gone + 1 and (
            count + 2 <= self.max_deliveries)  # taken back, it would keep a lone try

    def taken_back(self, key: bytes, count: int) -> bool:
        """The reclaimer claimed ``key`` back, now delivered ``count`` times: whether it is
        one let go here while innocent (it then stays innocent)."""
        gone = self._gone.get(key)
        if gone is None or not gone < count <= gone + 2 or count >= self.max_deliveries:
            return False
        del self._gone[key]
        _put(self._kept, key, count, self.limit)
        return True


def _put(table: dict[bytes, int], key: bytes, count: int, limit: int) -> None:
    table.pop(key, None)
    table[key] = count
    while len(table) > limit:
        del table[next(iter(table))]


def first_deliveries(idle: list[Any], max_deliveries: int, me: str, src: int,
                     let_go: LetGo) -> tuple[list[Any], bool]:
    """The ids of the idle deliveries (an ``XPENDING`` listing of the stream ``src``) that
    may come back in a batch: made once, handed back unrun (count 0: by a worker stopped
    while paused), or let go innocent by this consumer (see `LetGo`). None when no lone
    try would be left after a batch (``max_deliveries`` under 3). Also whether any of them
    is ``me``'s own."""
    if max_deliveries < 3:
        return [], False
    mine = (me, me.encode())
    once = [p for p in idle if int(p["times_delivered"]) <= 1 or (
        p["consumer"] in mine and let_go.innocent(ref(src, _bytes(p["message_id"])),
                                                  int(p["times_delivered"])))]
    return [p["message_id"] for p in once], any(p["consumer"] in mine for p in once)


def _bytes(entry_id: bytes | str) -> bytes:
    return entry_id if isinstance(entry_id, bytes) else entry_id.encode()
