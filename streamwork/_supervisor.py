"""Supervision of a worker's internal tasks: a worker is whole, or it exits.

Every loop runs under `Supervisor.loop`, which hands any error to `faults.classify` once:
transient errors are ridden out with backoff, a vanished group is recreated, anything else
stops the worker (it drains, then ``run`` raises WorkerFailed). A task that ends while the
worker is not stopping is a bug, and stops it too: never half-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ._connection import reconnect_delay
from ._faults import Fault, classify
from ._logs import WORKER_LOGGER, fields
from .errors import WorkerFailed

log = logging.getLogger(WORKER_LOGGER)

T = TypeVar("T")


class StoppedBeforeStart(Exception):
    """A stop was asked while the worker was still starting (waiting for Redis)."""


class Supervisor:
    """Owns a worker's tasks, its Redis error backoff and its stop signal."""

    def __init__(self, recreate: Callable[[], Awaitable[None]],
                 on_fault: Callable[[], None] | None = None, **log_fields: str) -> None:
        self._recreate = recreate
        self._on_fault = on_fault
        self._fields = log_fields
        self.tasks: dict[asyncio.Task[None], str] = {}
        self.dead_tasks: list[str] = []
        self.fatal: WorkerFailed | None = None
        self.failures = 0  # consecutive transient errors (0: the last call answered)
        self.stopping = False
        self.stop_event: asyncio.Event | None = None

    def spawn(self, what: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a task; if it ever ends on its own, the worker stops."""
        task = asyncio.get_running_loop().create_task(coro, name=f"streamwork-{what}")
        self.tasks[task] = what
        task.add_done_callback(self._ended)
        return task

    def loop(self, what: str, step: Callable[[], Awaitable[Any]]) -> asyncio.Task[None]:
        """A task running ``step`` again and again, riding out the errors it raises."""

        async def supervised() -> None:
            while True:
                try:
                    await step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not await self.ride_out(what, exc):
                        return
                else:
                    self.ok()

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

    async def ride_out(self, what: str, exc: BaseException) -> bool:
        """Deal with an error a loop met: back off (transient), recreate the group (gone),
        or stop the worker (anything else). Returns whether the loop may go on."""
        kind = classify(exc)
        if kind is Fault.TRANSIENT:
            await self.backoff(exc)
            return True
        if kind is Fault.GONE:
            log.warning("consumer group missing (%s); recreating it", exc, extra=fields(
                **self._fields))
            try:
                await self._recreate()
            except Exception as again:
                return await self.ride_out("group", again)
            return True
        self.fail(what, exc)
        return False

    def fail(self, what: str, exc: BaseException) -> None:
        """Stop the worker: it met an error no backoff will cure. It drains, then ``run``
        raises WorkerFailed."""
        if self.fatal is None:
            self.fatal = WorkerFailed(what, exc)
            log.error("%s failed; the worker stops: %s", what, exc, exc_info=exc,
                      extra=fields(**self._fields))
        if self.stop_event is not None:
            self.stop_event.set()

    async def until_ok(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()``, retried through transient errors and a vanished group; anything else
        raises WorkerFailed. A stop asked meanwhile raises StoppedBeforeStart (the worker
        returns without having served: nothing of it to drain)."""
        while True:
            if self.stop_event is not None and self.stop_event.is_set():
                raise StoppedBeforeStart(what)
            try:
                result = await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if classify(exc) is Fault.FATAL:
                    raise WorkerFailed(what, exc) from exc
                await self.backoff(exc)
            else:
                self.ok()
                return result

    async def backoff(self, exc: BaseException) -> None:
        """Note a transient error and sleep the reconnect backoff."""
        self.failures += 1
        if self._on_fault is not None:
            self._on_fault()
        if self.failures == 1:
            log.warning("redis unavailable, retrying with backoff: %s", exc,
                        extra=fields(**self._fields))
        pause = reconnect_delay(self.failures)
        if self.stop_event is None:
            await asyncio.sleep(pause)
        else:  # a stop cuts the pause short
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), pause)

    def ok(self) -> None:
        """A call answered: the outage, if any, is over."""
        if self.failures:
            log.warning("redis available again after %d failed calls", self.failures,
                        extra=fields(**self._fields))
            self.failures = 0

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


async def uninterrupted(step: Awaitable[None]) -> None:
    """Run a step that changes state in Redis (acks, leases) to its end even if the caller
    is cancelled meanwhile, so its outcome is recorded here too; then let the cancellation
    through. Such steps are one or two script calls long."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError
