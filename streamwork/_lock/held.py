"""Handles on a granted Redlock: `HeldLock` (sync) and `AsyncHeldLock`, both views of one
lease's state, with extend and release going through the Redlock that granted them."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING

from streamwork._lock.core import HELD, Clock, Lease

if TYPE_CHECKING:
    from streamwork._lock.redlock import AsyncRedlock, Redlock


class LeaseView:
    """Read-only view of a granted lock (shared by `HeldLock` and `AsyncHeldLock`)."""

    __slots__ = ("_clock", "_lease")

    def __init__(self, lease: Lease, clock: Clock) -> None:
        self._lease = lease
        self._clock = clock

    @property
    def resource(self) -> str:
        return self._lease.resource

    @property
    def key(self) -> str:
        """The lock's key on every master."""
        return self._lease.key

    @property
    def fencing_token(self) -> int:
        """Strictly increasing per resource (while a quorum keeps its data); pass it along
        with every write so the resource can reject holders that are no longer current."""
        return self._lease.token

    @property
    def ttl(self) -> float:
        """TTL of the last grant or extension, seconds."""
        return self._lease.ttl

    @property
    def valid_for(self) -> float:
        """Seconds left before the local (monotonic) deadline; 0 once released or lost."""
        if self._lease.state != HELD:
            return 0.0
        return max(0.0, self._lease.deadline - self._clock())

    @property
    def held(self) -> bool:
        """True while neither released nor lost and the deadline has not passed."""
        return self.valid_for > 0

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.resource!r} token={self.fencing_token} "
            f"{self._lease.state} valid_for={self.valid_for:.3f}s>"
        )


class HeldLock(LeaseView):
    """A lock granted by `Redlock`; a context manager that releases it on exit."""

    __slots__ = ("_redlock",)

    def __init__(self, redlock: Redlock, lease: Lease) -> None:
        super().__init__(lease, redlock.clock)
        self._redlock = redlock

    def extend(self, ttl: float | None = None) -> float:
        """Reset the lock's TTL (default: the last one) on every master that still holds it.

        Returns the new `valid_for`. Raises `LockLost` -- final, after giving back the
        masters it still held -- when fewer than a quorum extended it or no time is left.
        Never recreates an expired key.
        """
        self._redlock._run(self._redlock._core.extend(self._lease, ttl))
        return self.valid_for

    def release(self) -> bool:
        """Delete the lock on every master still holding our value (never someone else's).

        Returns True if a quorum still held it, False if it had expired, been taken over,
        been released already or too few masters answered. Never raises for those.
        """
        return self._redlock._run(self._redlock._core.release(self._lease))

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class AsyncHeldLock(LeaseView):
    """A lock granted by `AsyncRedlock`; an async context manager that releases it on exit."""

    __slots__ = ("_redlock",)

    def __init__(self, redlock: AsyncRedlock, lease: Lease) -> None:
        super().__init__(lease, redlock.clock)
        self._redlock = redlock

    async def extend(self, ttl: float | None = None) -> float:
        """As `HeldLock.extend`."""
        await self._redlock._run(self._redlock._core.extend(self._lease, ttl))
        return self.valid_for

    async def release(self) -> bool:
        """As `HeldLock.release`."""
        return await self._redlock._run(self._redlock._core.release(self._lease))

    async def __aenter__(self) -> AsyncHeldLock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()


