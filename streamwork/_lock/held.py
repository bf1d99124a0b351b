"""Handles on a granted Redlock: `HeldLock` (sync) and `AsyncHeldLock`, both views of one
`Grant`'s state. A handle gets from its Redlock only what it needs: the protocol (`Core`)
and the function that performs its network rounds, so it never imports the Redlock."""

from __future__ import annotations

from collections.abc import Awaitable
from types import TracebackType
from typing import Protocol, TypeVar

from streamwork._lock.core import HELD, Clock, Core, Grant, Steps

_T = TypeVar("_T")


class Run(Protocol):
    """Performs a protocol's rounds on every master (blocking) and returns its result."""

    def __call__(self, steps: Steps[_T]) -> _T: ...


class AsyncRun(Protocol):
    """Performs a protocol's rounds on every master (asyncio) and returns its result."""

    def __call__(self, steps: Steps[_T]) -> Awaitable[_T]: ...


class GrantView:
    """Read-only view of a granted lock (shared by `HeldLock` and `AsyncHeldLock`)."""

    __slots__ = ("_clock", "_grant")

    def __init__(self, grant: Grant, clock: Clock) -> None:
        self._grant = grant
        self._clock = clock

    @property
    def resource(self) -> str:
        return self._grant.resource

    @property
    def key(self) -> str:
        """The lock's key on every master."""
        return self._grant.key

    @property
    def fencing_token(self) -> int:
        """Strictly increasing per resource (while a quorum keeps its data); pass it along
        with every write so the resource can reject holders that are no longer current."""
        return self._grant.token

    @property
    def ttl(self) -> float:
        """TTL of the last grant or extension, seconds."""
        return self._grant.ttl

    @property
    def valid_for(self) -> float:
        """Seconds left before the local (monotonic) deadline; 0 once released or lost."""
        if self._grant.state != HELD:
            return 0.0
        return max(0.0, self._grant.deadline - self._clock())

    @property
    def held(self) -> bool:
        """True while neither released nor lost and the deadline has not passed."""
        return self.valid_for > 0

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.resource!r} token={self.fencing_token} "
            f"{self._grant.state} valid_for={self.valid_for:.3f}s>"
        )


class HeldLock(GrantView):
    """A lock granted by `Redlock`; a context manager that releases it on exit."""

    __slots__ = ("_core", "_run")

    def __init__(self, grant: Grant, core: Core, run: Run) -> None:
        super().__init__(grant, core.clock)
        self._core = core
        self._run = run

    def extend(self, ttl: float | None = None) -> float:
        """Reset the lock's TTL (default: the last one) on every master that still holds it.

        Returns the new `valid_for`. Raises `LockLost` -- final, after giving back the
        masters it still held -- when fewer than a quorum extended it or no time is left.
        Never recreates an expired key.
        """
        self._run(self._core.extend(self._grant, ttl))
        return self.valid_for

    def release(self) -> bool:
        """Delete the lock on every master still holding our value (never someone else's).

        Returns True if a quorum still held it, False if it had expired, been taken over,
        been released already or too few masters answered. Never raises for those.
        """
        return self._run(self._core.release(self._grant))

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class AsyncHeldLock(GrantView):
    """A lock granted by `AsyncRedlock`; an async context manager that releases it on exit."""

    __slots__ = ("_core", "_run")

    def __init__(self, grant: Grant, core: Core, run: AsyncRun) -> None:
        super().__init__(grant, core.clock)
        self._core = core
        self._run = run

    async def extend(self, ttl: float | None = None) -> float:
        """As `HeldLock.extend`."""
        await self._run(self._core.extend(self._grant, ttl))
        return self.valid_for

    async def release(self) -> bool:
        """As `HeldLock.release`."""
        return await self._run(self._core.release(self._grant))

    async def __aenter__(self) -> AsyncHeldLock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
