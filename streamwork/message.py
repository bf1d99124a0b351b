"""Message: one delivery of a job, as a handler sees it."""

from __future__ import annotations

from dataclasses import dataclass, field

from .codec import Payload
from .errors import LockLost

__all__ = ["Message"]


@dataclass(slots=True, eq=False)
class Message:
    """One delivery of a job.

    ``attempt`` is 1 on the first delivery and counts every delivery Redis made, including
    ones whose worker crashed, and those of earlier entries of a retried job.
    ``fencing_token`` is strictly increasing per stream when ``dedup`` is on, else None:
    pass it to the system you write to so a stale holder's write can be rejected.
    """

    id: str
    stream: str
    key: str
    payload: Payload
    attempt: int
    enqueued_at: float
    headers: dict[str, str]
    fencing_token: int | None = None
    group: str = ""
    consumer: str = ""
    _lost: bool = field(default=False, repr=False)

    @property
    def lock_lost(self) -> bool:
        """True once this delivery's lease was lost; its result will not be acknowledged."""
        return self._lost

    def check(self) -> None:
        """Raise LockLost if the lease was lost; call it before each external write."""
        if self._lost:
            raise LockLost(
                f"job {self.key!r} (entry {self.id}) lost its lease: another worker may run it "
                "now; stop and do not write",
                self.key,
            )
