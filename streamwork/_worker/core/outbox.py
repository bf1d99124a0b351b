"""Outcomes decided and not yet written: successes, failures and acks of known duplicates,
waiting for the flusher (outcomes.py) to send them in batches."""

from __future__ import annotations

import asyncio

from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.failure import Failure


class Outbox:
    """The outcome buffers of one consumer; ``needed`` is set while any waits."""

    def __init__(self) -> None:
        self.acks: list[tuple[bytes, int]] = []  # duplicates the local cache knows are done
        self.done: list[Delivery] = []
        self.failed: list[Failure] = []
        self.needed = asyncio.Event()

    def size(self) -> int:
        return len(self.acks) + len(self.done) + len(self.failed)

    def pending(self) -> bool:
        return bool(self.acks or self.done or self.failed)

    def add_done(self, d: Delivery) -> None:
        self.done.append(d)
        self.needed.set()

    def add_failure(self, f: Failure) -> None:
        self.failed.append(f)
        self.needed.set()

    def add_ack(self, entry_id: bytes, src: int) -> None:
        self.acks.append((entry_id, src))
        self.needed.set()

    def discard(self, d: Delivery) -> bool:
        """Take a delivery's outcome back before it is written; True if it was waiting."""
        if d in self.done:
            self.done.remove(d)
            return True
        for f in self.failed:
            if f.delivery is d:
                self.failed.remove(f)
                return True
        return False

    def take(self) -> tuple[list[tuple[bytes, int]], list[Delivery], list[Failure]]:
        """Everything waiting, for one flush (the buffers start empty again)."""
        taken = self.acks, self.done, self.failed
        self.acks, self.done, self.failed = [], [], []
        return taken

    def put_back(self, acks: list[tuple[bytes, int]], done: list[Delivery],
                 failed: list[Failure]) -> None:
        """What a flush could not write, first in line for the next (not the dropped)."""
        self.acks[:0] = acks
        self.done[:0] = [d for d in done if not d.dropped]
        self.failed[:0] = failed
        self.needed.set()
