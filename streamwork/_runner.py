"""Running handlers: ``concurrency`` long-lived runner tasks (no task per message), each
job bounded by its time limit (``timeout``, the seed's watchdog).

An ``async def`` handler runs on the loop and is cancelled when its limit passes; a plain
``def`` runs on a daemon thread pool, and since a thread cannot be stopped, a job past its
limit is let go (its lease released with the failure) and whatever it returns later is
dropped. Either way the job fails with reason ``timeout``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from opentelemetry import trace

from . import _telemetry as telemetry
from ._delivery import Delivery, Failure, State
from ._logs import WORKER_LOGGER, fields
from ._message import Message, revoke
from ._pool import DaemonPool
from ._retry import retry_delay_for
from .errors import DeadLetter, Retry

if TYPE_CHECKING:
    from ._config import WorkerConfig
    from ._outcomes import Outcomes

log = logging.getLogger(WORKER_LOGGER)

TRACEBACK_LIMIT: Final = 2000  #: characters of traceback kept in a dead letter

Handler = Callable[[Message], Any]  #: ``async def handle(msg)`` or a plain ``def``


class HandlerTimeout(Exception):
    """A handler ran past its job's time limit (``timeout``)."""


class RunnerHost(Protocol):
    """What the runners need of the consumer."""

    cfg: WorkerConfig
    name: str
    queue: asyncio.Queue[Delivery]
    outcomes: Outcomes
    tracing: bool
    metering: bool
    counts: Counter[str]

    def count(self, what: str, n: int = 1, outcome: str | None = None) -> None: ...
    def forget(self, d: Delivery, outcome: str = "lost") -> None: ...


class Runner:
    """The handler and how to run it; ``loop()`` is one runner task."""

    def __init__(self, host: RunnerHost, handle: Handler) -> None:
        self.host = host
        self._handle = handle
        self._is_async = inspect.iscoroutinefunction(handle)
        cfg = host.cfg
        self._pool = None if self._is_async else DaemonPool(cfg.concurrency, f"sw-{cfg.stream}")

    def close(self) -> None:
        """Stop idle pool threads (busy ones end with their job; they never block exit)."""
        if self._pool is not None:
            self._pool.shutdown()

    async def loop(self) -> None:
        """One runner: take queued deliveries and run their handlers, one at a time."""
        loop = asyncio.get_running_loop()
        runner = asyncio.current_task()
        assert runner is not None
        cfg = self.host.cfg
        debug = log.isEnabledFor(logging.DEBUG)
        while True:
            d = await self.host.queue.get()
            msg = d.msg
            if d.dropped:
                self.host.forget(d)
                continue
            d.state = State.RUNNING
            d.started = time.monotonic()
            timer = (None if d.limit is None
                     else loop.call_later(d.limit, self._time_out, d, runner))
            if self.host.tracing:
                d.span = telemetry.consumer_span(
                    cfg.stream, cfg.group, msg.id, msg.attempt, msg.key, msg.headers)
            if debug:
                log.debug("job started", extra=fields(
                    stream=cfg.stream, group=cfg.group, consumer=self.host.name, key=msg.key,
                    entry_id=msg.id, attempt=msg.attempt))
            try:
                if d.span is None:
                    d.result = await self._call(msg)
                else:
                    with trace.use_span(d.span, end_on_exit=False):
                        d.result = await self._call(msg)
            except asyncio.CancelledError:
                if not d.timed_out:
                    telemetry.end_span(d.span, "cancelled")
                    self.host.forget(d)
                    raise
                _uncancel(runner)
                self._timed_out(d, debug)
            except Exception as exc:
                if d.timed_out:
                    _uncancel(runner)
                    self._timed_out(d, debug)
                else:
                    self._finished(d, "failed", debug)
                    self._failed(d, exc)
            else:
                if d.timed_out:  # the handler swallowed its cancellation
                    _uncancel(runner)
                    self._timed_out(d, debug)
                else:
                    self._finished(d, "ok", debug)
                    self._succeeded(d)
            finally:
                if timer is not None:
                    timer.cancel()

    async def _call(self, msg: Message) -> Any:
        """Run the handler: on the loop (async) or on a pool thread (plain def)."""
        if self._pool is None:
            return await self._handle(msg)
        elif self.host.tracing:
            ctx = contextvars.copy_context()
            return await asyncio.wrap_future(self._pool.submit(ctx.run, self._handle, msg))
        else:
            return await asyncio.wrap_future(self._pool.submit(self._handle, msg))

    def _time_out(self, d: Delivery, runner: asyncio.Task[None]) -> None:
        """The job's time limit passed: cancel its handler (an async one stops at its next
        await; a sync one's thread cannot be stopped, so its delivery is let go)."""
        if d.state == State.RUNNING and not d.timed_out:
            d.timed_out = True
            revoke(d.msg)  # msg.check() now raises: the job is someone else's again
            runner.cancel()

    def _timed_out(self, d: Delivery, debug: bool) -> None:
        if self._pool is not None:
            self._pool.abandon()  # its thread may still run: keep the pool's size for others
        self._finished(d, "timeout", debug)
        self.host.count("timed_out", 1)
        self._failed(d, HandlerTimeout(
            f"the handler ran longer than its time limit of {d.limit or 0:g} s (timeout) and "
            f"was {'cancelled' if self._is_async else 'abandoned; its late outcome is dropped'}"))

    def _finished(self, d: Delivery, result: str, debug: bool) -> None:
        if not (self.host.metering or debug):
            return
        took = time.monotonic() - d.started
        if self.host.metering:
            telemetry.record_duration(took, self.host.cfg.stream, self.host.cfg.group, result)
        if debug:
            log.debug("job finished", extra=fields(
                stream=self.host.cfg.stream, group=self.host.cfg.group, consumer=self.host.name,
                key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt,
                duration_ms=round(took * 1000, 2), outcome=result))

    def _succeeded(self, d: Delivery) -> None:
        if d.dropped:  # its lease was lost while it ran
            self.host.forget(d)
        else:
            self.host.outcomes.succeeded(d)

    def _failed(self, d: Delivery, exc: Exception) -> None:
        if d.dropped:
            self.host.forget(d)
            return
        cfg, msg = self.host.cfg, d.msg
        etype = type(exc).__name__
        detail = f"{exc}\n" + "".join(traceback.format_exception(exc))[-TRACEBACK_LIMIT:]
        if isinstance(exc, DeadLetter):
            action, reason, delay = "d", f"dead_letter: {exc.reason}", 0.0
        elif msg.attempt >= cfg.max_deliveries:
            action, reason, delay = "d", "timeout" if d.timed_out else "max_deliveries", 0.0
        else:
            action = "r"
            reason = "timeout" if d.timed_out else "retry"
            explicit = exc.delay if isinstance(exc, Retry) else None
            delay = retry_delay_for(msg.attempt, cfg.retry_delay, cfg.retry_max_delay,
                                    explicit=explicit)
        log.warning("job failed: %s", "retrying" if action == "r" else "dead-lettered",
                    extra=fields(stream=cfg.stream, group=cfg.group, consumer=self.host.name,
                                 key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                                 error_type=etype, reason=reason,
                                 duration_ms=round((time.monotonic() - d.started) * 1000, 1)))
        self.host.outcomes.add_failure(Failure(
            d, d.entry_id, d.src, action, round(delay * 1000), msg.attempt, reason, etype, detail,
            msg.key, d.body, exc))


def _uncancel(task: asyncio.Task[None]) -> None:
    """Withdraw a cancellation this worker made itself (a time limit), on Pythons that
    count them (3.11+), so later timeouts inside handlers are not confused."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()
