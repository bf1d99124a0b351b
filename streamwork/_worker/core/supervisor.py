"""Supervision of a worker's internal tasks: a worker is whole, or it exits.

Every loop runs under `Supervisor.loop`, which hands any error to `faults.classify` once:
transient errors are ridden out with backoff, a vanished group is recreated, anything else
stops the worker (it drains, then ``run`` raises WorkerFailed). A task that ends while the
worker is not stopping is a bug, and stops it too: never half-alive.

Whether Redis is up is the `Link`'s business: a transient error starts an outage (one
WARNING, readiness false, a backoff that grows with the failed calls), and only a Redis
call made after it began and answered ends it (one INFO line). A loop step says whether
it reached Redis; one that only waited proves nothing either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, TypeVar

from streamwork._redis.connection import reconnect_delay
from streamwork._redis.faults import Fault, classify
from streamwork._redis.tls import TlsError
from streamwork._telemetry.logs import WORKER_LOGGER, fields, seconds
from streamwork._worker.core import looplag
from streamwork.errors import PermissionDenied, WorkerFailed

log = logging.getLogger(WORKER_LOGGER)

T = TypeVar("T")


class StoppedBeforeStart(Exception):
    """A stop was asked while the worker was still starting (waiting for Redis)."""


class Link:
    """What a worker's loops know of their Redis server: answering, or down since when
    and after how many failed calls. Shared by every supervisor whose loops use the same
    client, so one outage is one WARNING when Redis is lost and one INFO line when it is
    back, and their backoff grows together while it stays down.

    Only a call that was made after the outage began and answered ends it: a loop step
    that did not reach Redis (it waited for room, had nothing to lease or to flush) is no
    news, nor is a late reply to a call sent before the outage. Likewise a failure of a
    call made before Redis came back belongs to the outage that ended."""

    #: its two lines (the error; the outage's length and failed calls): a subclass watching
    #: something else than the stream's Redis says what
    LOST: ClassVar[str] = "redis unavailable, retrying with backoff: %s"
    BACK: ClassVar[str] = "redis available again after %.1f s and %d failed calls"

    def __init__(self, **log_fields: str) -> None:
        self._fields = log_fields
        self.failures = 0  # failed calls of the current outage (0: Redis answers)
        self.down_since: float | None = None  # monotonic time of its first failure
        self.up_since = 0.0  # monotonic time the last outage ended
        self.last_down = 0.0  # monotonic time the last outage began (0: there was none)

    @property
    def up(self) -> bool:
        return self.failures == 0

    def failed(self, exc: BaseException, since: float) -> bool:
        """A call made at ``since`` (monotonic) met a transient error; whether it counts
        against Redis. A timeout across a stall of the event loop (a handler blocking it,
        `looplag`) does not: the reply was late because nothing read it."""
        if self.failures == 0 and since < self.up_since:
            return False  # sent while Redis was still down: that outage is over
        stalled = looplag.excuses(exc, since)
        if stalled is not None:
            log.debug("a Redis call timed out across a %s s stall of the event loop (not an "
                      "outage): %s", seconds(stalled), exc, extra=fields(**self._fields))
            return False
        self.failures += 1
        if self.failures == 1:
            self.down_since = time.monotonic()
            log.warning(self.LOST, exc, extra=fields(**self._fields))
        return True

    def answered(self, since: float) -> None:
        """A call made at ``since`` (monotonic) or later answered."""
        if not self.failures or self.down_since is None or since < self.down_since:
            return
        now = time.monotonic()
        down_ms = round((now - self.down_since) * 1000)
        log.info(self.BACK, down_ms / 1000, self.failures, extra=fields(
            **self._fields, duration_ms=down_ms, count=self.failures))
        self.failures, self.last_down = 0, self.down_since
        self.down_since, self.up_since = None, now

    def down_lately(self, within: float) -> bool:
        """Whether Redis is unreachable now, or was less than ``within`` seconds ago."""
        return not self.up or time.monotonic() - self.up_since < within

    def in_outage(self, when: float, margin: float) -> bool:
        """Whether monotonic time ``when`` (a lease's deadline) fell in an outage: the one
        under way, or the last one (from ``margin`` s before it began until it ended)."""
        if not self.up:
            return True
        return bool(self.last_down) and self.last_down - margin <= when <= self.up_since

    def delay(self) -> float:
        """Seconds a loop waits after a failure: grows with the outage's failed calls."""
        return reconnect_delay(self.failures)


class QuorumLink(Link):
    """What a worker knows of its lock quorum (``lock_urls``): reached (a quorum of masters
    answered, granting or refusing) or not (too few answered), with the same rules as
    `Link`: one WARNING when it is lost, one INFO line when it is back."""

    LOST = ("lock quorum unreachable (%s): this worker starts no job and reads nothing new, "
            "and hands the jobs it cannot lock back to the group for a worker that reaches "
            "the quorum; retrying with backoff")
    BACK = ("lock quorum available again after %.1f s and %d failed calls: jobs start "
            "again")


class Supervisor:
    """Owns a worker's tasks, its stop signal and (through its `Link`) what it knows of
    Redis being up or down."""

    def __init__(self, recreate: Callable[[], Awaitable[None]],
                 on_fault: Callable[[], None] | None = None, *, link: Link | None = None,
                 explain: Callable[[BaseException], BaseException | None] | None = None,
                 **log_fields: str) -> None:
        self._recreate = recreate
        self._on_fault = on_fault
        #: a fatal error in the words the worker stops with (a refused permission:
        #: `PermissionDenied`, naming what to grant), or None to keep it as it is
        self._explain = explain
        self._fields = log_fields
        self.link = link if link is not None else Link(**log_fields)
        self.tasks: dict[asyncio.Task[None], str] = {}
        self.dead_tasks: list[str] = []
        self.fatal: WorkerFailed | None = None
        self.stopping = False
        self.stop_event: asyncio.Event | None = None

    @property
    def failures(self) -> int:
        """Failed calls of the current Redis outage (0: Redis answers)."""
        return self.link.failures

    def spawn(self, what: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a task; if it ever ends on its own, the worker stops."""
        task = asyncio.get_running_loop().create_task(coro, name=f"streamwork-{what}")
        self.tasks[task] = what
        task.add_done_callback(self._ended)
        return task

    def loop(self, what: str, step: Callable[[], Awaitable[bool]]) -> asyncio.Task[None]:
        """A task running ``step`` again and again, riding out the errors it raises.
        ``step`` returns whether it reached Redis (a call answered): only then may it end
        an outage; a step that only waited proves nothing."""

        async def supervised() -> None:
            while True:
                since = time.monotonic()
                try:
                    reached = await step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not await self.ride_out(what, exc, since):
                        return
                else:
                    if reached:
                        self.link.answered(since)

        return self.spawn(what, supervised())

    def _ended(self, task: asyncio.Task[None]) -> None:
        what = self.tasks.get(task, task.get_name())
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and self.stopping:
            return
        self.dead_tasks.append(what)
        self.fail(what, exc or RuntimeError(f"the {what} task returned unexpectedly"))

    async def ride_out(self, what: str, exc: BaseException, since: float) -> bool:
        """Deal with an error a loop met in a step begun at ``since``: back off
        (transient), recreate the group (gone), or stop the worker (anything else).
        Returns whether the loop may go on."""
        kind = classify(exc)
        if kind is Fault.TRANSIENT:
            await self.backoff(exc, since)
            return True
        if kind is Fault.GONE:
            log.warning("consumer group missing (%s); recreating it", exc, extra=fields(
                **self._fields))
            again_since = time.monotonic()
            try:
                await self._recreate()
            except Exception as again:
                return await self.ride_out("group", again, again_since)
            self.link.answered(again_since)
            return True
        self.fail(what, exc)
        return False

    def explained(self, exc: BaseException) -> BaseException:
        """``exc``, or the error that says it better (`PermissionDenied` for a missing ACL
        permission), raised from it."""
        better = self._explain(exc) if self._explain is not None else None
        if better is None or better is exc:
            return exc
        better.__cause__ = exc
        return better

    def fail(self, what: str, exc: BaseException) -> None:
        """Stop the worker: it met an error no backoff will cure. It drains, then ``run``
        raises WorkerFailed. A refused permission is logged without a traceback: its
        message says what was refused and what to grant."""
        if self.fatal is None:
            exc = self.explained(exc)
            self.fatal = WorkerFailed(what, exc)
            denied = isinstance(exc, PermissionDenied)
            log.error("%s failed; the worker stops: %s", what, exc,
                      exc_info=None if denied else exc, extra=fields(**self._fields))
        if self.stop_event is not None:
            self.stop_event.set()

    async def until_ok(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` (Redis calls) at start, retried through transient errors and a vanished
        group; TLS that cannot work as configured raises its ConfigError (`TlsError`) as it
        is; anything else is logged (with its traceback, but for a refused permission,
        which says all) and raises WorkerFailed (not started: nothing is held yet). A stop
        asked meanwhile raises StoppedBeforeStart (the worker returns without having
        served: nothing of it to drain)."""
        while True:
            if self.stop_event is not None and self.stop_event.is_set():
                raise StoppedBeforeStart(what)
            since = time.monotonic()
            try:
                result = await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, TlsError):
                    raise  # the URL's fault, found before serving: say so, and only that
                if classify(exc) is Fault.FATAL:
                    cause = self.explained(exc)
                    failed = WorkerFailed(what, cause, started=False)
                    log.error("%s", failed, exc_info=None if isinstance(
                        cause, PermissionDenied) else exc, extra=fields(**self._fields))
                    raise failed from exc
                await self.backoff(exc, since, stop_cuts=True)
            else:
                self.link.answered(since)
                return result

    async def backoff(self, exc: BaseException, since: float, *,
                      stop_cuts: bool = False) -> None:
        """Note a transient error of a call made at ``since`` and sleep the reconnect
        backoff, which grows while Redis stays down. With ``stop_cuts`` a stop cuts the
        pause short (starting: nothing to wait for). Loops keep their pause while the
        worker stops: those still running then (heartbeat, flusher) must not retry in a
        tight loop through the drain; cancelling them interrupts the pause."""
        if self.link.failed(exc, since) and self._on_fault is not None:
            self._on_fault()
        delay = self.link.delay()
        if self.stop_event is None or not stop_cuts:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), delay)

    def alive(self) -> bool:
        """Serving, with every task running."""
        return self.fatal is None and not self.dead_tasks and bool(self.tasks)


async def cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end. A cancel that lands inside a redis-py
    read can surface as a timeout or connection error, which a loop treats as transient
    and survives; so cancel again until every task has really ended."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.2)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not warn about it


async def uninterrupted(step: Awaitable[T]) -> T:
    """Run a step that changes state in Redis (acks, leases) to its end even if the caller
    is cancelled meanwhile, so its outcome is recorded here too; then let the cancellation
    through. Such steps are one or two script calls long. Returns what the step returned."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    result = task.result()
    if cancelled:
        raise asyncio.CancelledError
    return result
