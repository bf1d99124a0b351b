"""Leasing waiting deliveries: the claimer takes the leases (claim.lua) of what the reader
admitted, in the order read, so the reader reads the next batch while Redis answers; the
leaser tries again those that still wait (a live duplicate holds the job, the lock quorum
is down, Redis refused): waiting never uses up an attempt."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from streamwork._worker.core.supervisor import uninterrupted

if TYPE_CHECKING:
    from streamwork._worker.core.delivery import Delivery

WAIT_RETRY: Final = 0.2  #: s before a waiting delivery's lease is tried again (first time)
WAIT_RETRY_MAX: Final = 2.0  #: s, cap of that pause while nothing gets leased


class Claimer:
    """Deliveries admitted and waiting for their first lease, and the loop step taking
    them. On an error they stay waiting: the leaser tries them again."""

    def __init__(self, waiting: dict[bytes, Delivery], batch_size: int,
                 lease: Callable[[list[Delivery]], Awaitable[bool]]) -> None:
        self._waiting = waiting  # the holdings' deliveries waiting for a lease
        self._batch_size = batch_size
        self._lease = lease
        self._unclaimed: list[Delivery] = []
        self._due = asyncio.Event()
        self._backoff = WAIT_RETRY  # the leaser's

    def add(self, ds: list[Delivery]) -> None:
        """Admitted, held as waiting: their leases are the claimer's to take."""
        self._unclaimed.extend(ds)
        self._due.set()

    async def claim_once(self) -> bool:
        """Take the leases of up to batch_size of them; returns whether Redis was asked."""
        if not self._unclaimed:
            self._due.clear()
            await self._due.wait()
            return False
        n, waiting = self._batch_size, self._waiting
        batch, self._unclaimed = self._unclaimed[:n], self._unclaimed[n:]
        # one let go meanwhile (stopping while paused, reported gone) is no longer waiting
        batch = [d for d in batch if waiting.get(d.ref) is d]
        return bool(batch) and await uninterrupted(self._lease(batch))

    async def retry_once(self) -> bool:
        """The leaser: try again to lease deliveries that wait, pausing longer while nothing
        gets through (0.2 s doubling to 2 s). Returns whether Redis was asked."""
        await asyncio.sleep(self._backoff)
        waiting = self._waiting
        before = len(waiting)
        reached = bool(waiting) and await uninterrupted(self._lease(list(waiting.values())))
        self._backoff = (WAIT_RETRY if not before or len(waiting) < before
                       else min(self._backoff * 2, WAIT_RETRY_MAX))
        return reached
