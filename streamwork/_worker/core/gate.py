"""The start gate of one consumer: while a feature holds it closed, no job starts and the
reader reads nothing new. What is held stays held (leases and heartbeats go on); a job
whose start was already committed runs all the same."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Gate:
    """Open unless some holder (a name: who closed it) holds it closed; ``open`` is what
    the hot path looks at."""

    __slots__ = ("_holders", "_opened", "on_open", "open")

    def __init__(self, *closed_by: str) -> None:
        self._holders: set[str] = set(closed_by)
        self.open = not self._holders
        self._opened = asyncio.Event()
        if self.open:
            self._opened.set()
        #: told when the gate opens (the run queue wakes its parked runners)
        self.on_open: Callable[[], None] | None = None

    def close(self, holder: str) -> None:
        """``holder`` closes the gate (until it opens it again)."""
        self._holders.add(holder)
        self.open = False
        self._opened.clear()

    def release(self, holder: str) -> None:
        """``holder`` no longer holds the gate closed; it opens when nobody does."""
        self._holders.discard(holder)
        if self._holders or self.open:
            return
        self.open = True
        self._opened.set()
        if self.on_open is not None:
            self.on_open()

    def closed_by(self, holder: str) -> bool:
        return holder in self._holders

    async def opened(self) -> bool:
        """Return once the gate is open (at once if it is); False, so a loop step that
        waited here says it did not ask Redis."""
        await self._opened.wait()
        return False
