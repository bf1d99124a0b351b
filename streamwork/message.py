"""Message: one delivery of a job, as a handler sees it."""

from __future__ import annotations

from collections.abc import Sequence
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
    staged: list[tuple[str, tuple[str, ...], tuple[str | int | float | bytes, ...]]] = field(
        default_factory=list, repr=False)

    def stage(self, command: str, keys: Sequence[str] = (),
              args: Sequence[str | int | float | bytes] = ()) -> None:
        """Stage a Redis write that is applied atomically with this job's acknowledgement
        (and done-marker), so it takes effect exactly once, or not at all if the job's
        outcome is not recorded (crash, lost lease, failure).

        ``keys`` come first in the command, then ``args``: ``msg.stage("HINCRBY",
        ["{orders}:totals"], ["eur", 250])``. On Redis Cluster every key must share the
        stream's hash tag (``{S}``). A command Redis rejects (e.g. WRONGTYPE) is skipped
        and logged; the job's other staged writes still apply.
        """
        if not isinstance(command, str) or not command:
            raise ValueError("stage(): command must be a Redis command name such as 'SET'")
        self.staged.append((command, tuple(keys), tuple(args)))

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
