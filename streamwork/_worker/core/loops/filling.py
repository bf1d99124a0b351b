"""How full a busy reader lets a worker get before it reads again: with room for less than
half a batch it waits for room for half a batch, at most FILL_WAIT since the room first
fell short, so reads and claims come in batches rather than a few jobs each (a worker
still fills up to concurrency + batch_size)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Final

FILL_WAIT: Final = 0.02  #: s a busy reader waits at most for room for half a batch


class Fill:
    """The reader's pacing: ``low`` is half a batch (or of the capacity, if smaller)."""

    def __init__(self, room: asyncio.Event, low: int) -> None:
        self._room = room  # set by the holdings whenever deliveries leave
        self.low = max(1, low)
        self._since = 0.0  # monotonic time the room first fell short (0: it has not)

    async def short(self, room: int) -> bool:
        """Whether to wait rather than read for ``room`` now; waits a little if so."""
        if room >= self.low:
            self._since = 0.0
            return False
        now = time.monotonic()
        since = self._since = self._since or now
        if now - since >= FILL_WAIT:
            self._since = 0.0
            return False  # read what there is room for (fill up to capacity)
        self._room.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._room.wait(), FILL_WAIT - (now - since))
        return True
