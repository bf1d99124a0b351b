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
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from opentelemetry import trace

from streamwork._redis.faults import Fault, classify
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import (
    WORKER_LOGGER,
    describe,
    error_message,
    fields,
    seconds,
    traceback_text,
)
from streamwork._text import text
from streamwork._wire.message import Message, revoke
from streamwork._worker.delivery import Delivery, Failure, RunQueue, State
from streamwork._worker.limits import KeyFailed, Limits, retry_key_after
from streamwork._worker.pool import DaemonPool
from streamwork._worker.retry import retry_delay_for
from streamwork._worker.start import Start
from streamwork.errors import DeadLetter, Retry

if TYPE_CHECKING:
    from streamwork._worker.config import WorkerConfig
    from streamwork._worker.leases import Lease
    from streamwork._worker.outcomes import Outcomes
    from streamwork._worker.start import Starter

log = logging.getLogger(WORKER_LOGGER)

TRACEBACK_LIMIT: Final = 2000  #: characters of traceback kept in a dead letter
START_RETRY: Final = 0.2  #: s before a job whose start Redis could not record tries again

Handler = Callable[[Message], Any]  #: ``async def handle(msg)`` or a plain ``def``


class HandlerTimeout(Exception):
    """A handler ran past its job's time limit (``timeout``)."""


class JobCancelled(Exception):
    """The job was cancelled (``producer.cancel``) while its handler ran."""


class RunnerHost(Protocol):
    """What the runners need of the consumer."""

    cfg: WorkerConfig
    name: str
    queue: RunQueue
    outcomes: Outcomes
    tracing: bool
    metering: bool
    counts: Counter[str]

    slots: asyncio.Semaphore | None
    limits: Limits | None
    lease: Lease
    starter: Starter | None

    def count(self, what: str, n: int = 1, outcome: str | None = None) -> None: ...
    def forget(self, d: Delivery, outcome: str = "lost") -> None: ...
    def lose(self, d: Delivery, why: str) -> None: ...
    def vanish(self, d: Delivery) -> None: ...
    def cancelled_unstarted(self, d: Delivery) -> None: ...
    def retry_in_place(self, d: Delivery, delay: float) -> None: ...
    def requeue_later(self, d: Delivery, delay: float) -> None: ...


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
        host = self.host
        cfg = host.cfg
        queue = host.queue
        ready = queue.ready
        debug = log.isEnabledFor(logging.DEBUG)
        watch = _Watch(self, runner, loop)
        call = self._handle if self._pool is None else self._call_sync
        clock = loop.time  # the loop's clock: what its timers (the time limit) run on
        running = State.RUNNING
        finish = self._succeeded
        slots = host.slots  # shared by the consumers of a partitioned worker
        cancellable = cfg.cancel_running and self._is_async
        limits = host.limits if host.limits is not None and host.limits.on else None
        try:
            while True:
                # take a ready delivery without a round trip through the loop
                if ready:
                    d = ready.popleft()
                    if ready:
                        queue.kick()  # more ready: a parked runner may take the next
                else:
                    d = await queue.get()
                if slots is not None:
                    try:
                        await slots.acquire()
                    except asyncio.CancelledError:
                        host.forget(d)
                        raise
                    if d.dropped:
                        slots.release()
                msg = d.msg
                if d.dropped:
                    host.forget(d)
                    if limits is not None and d.ref in limits.held:
                        await self._give_back(limits, d)
                    continue
                if limits is not None:
                    allowed = await self._within_limits(limits, d)
                    if not allowed:
                        if slots is not None:
                            slots.release()
                        if allowed is False:  # None: it failed, its concurrency_key raised
                            host.requeue_later(d, retry_key_after())  # waits, no attempt
                        continue
                # the last check, after every wait (a slot, a limit, its turn): a delivery
                # whose lease was lost, that another worker took or whose job was cancelled
                # meanwhile does not start
                if not await self._may_start(d):
                    if slots is not None:
                        slots.release()
                    if limits is not None and d.ref in limits.held:
                        await self._give_back(limits, d)
                    continue
                d.state = running
                if cancellable:
                    d.task = runner
                d.started = now = clock()
                if d.limit is not None:
                    watch.d = d
                    watch.due = due = now + d.limit
                    if watch.timer is None or watch.when > due:
                        watch.arm(due)
                if host.tracing:
                    d.span = telemetry.consumer_span(
                        cfg.stream, cfg.group, msg.id, msg.attempt, msg.key, msg.headers)
                if debug:
                    log.debug("job started", extra=fields(
                        stream=cfg.stream, group=cfg.group, consumer=host.name, key=msg.key,
                        entry_id=msg.id, attempt=msg.attempt))
                try:
                    if d.span is None:
                        d.result = await call(msg)
                    else:
                        # the exception is recorded when the outcome is (end_span, which
                        # copes with one whose __str__ raises), not here
                        with trace.use_span(d.span, end_on_exit=False, record_exception=False,
                                            set_status_on_exception=False):
                            d.result = await call(msg)
                except asyncio.CancelledError:
                    if d.cancelling:  # its job was cancelled (cancel_running)
                        _uncancel(runner)
                        self._finished(d, "cancelled", debug)
                        self._failed(d, JobCancelled("the job was cancelled while it ran"))
                        continue
                    if not d.timed_out:
                        telemetry.end_span(d.span, "cancelled")
                        host.forget(d)
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
                        if host.metering or debug:
                            self._finished(d, "ok", debug)
                        finish(d)
                finally:
                    watch.d = None
                    d.task = None
                    if slots is not None:
                        slots.release()
                    if limits is not None and d.ref in limits.held:
                        await self._give_back(limits, d)
        finally:
            watch.close()

    async def _may_start(self, d: Delivery) -> bool:
        """Whether ``d``'s handler may start now: not dropped, its lease not run out, and
        (with job records) start.lua turned its record into the running one. A delivery
        that may not start is let go, acknowledged as cancelled, or waits (Redis busy)."""
        host = self.host
        if d.dropped:
            host.forget(d)
            return False
        if d.state != State.QUEUED:  # decided meanwhile (cancelled before it started)
            return False
        if host.lease.expired(d, time.monotonic()):
            host.lose(d, "its lease ran out before the handler started")
            host.forget(d)
            return False
        starter = host.starter
        if starter is None:
            return True
        try:
            code = await starter.start(d)
        except asyncio.CancelledError:
            host.forget(d)
            raise
        except Exception as exc:
            if classify(exc) is Fault.FATAL:
                raise
            log.warning("could not start the job (%s); it waits", exc, extra=fields(
                stream=host.cfg.stream, group=host.cfg.group, key=d.msg.key))
            host.requeue_later(d, START_RETRY)  # held meanwhile; uses no attempt
            return False
        dropped = _dropped(d)  # it may have been dropped while start.lua ran
        if code == Start.GO and not dropped:
            return True
        if dropped:
            host.forget(d)
        elif code == Start.CANCELLED:
            host.cancelled_unstarted(d)
        elif code == Start.VANISHED:
            host.vanish(d)
            host.forget(d, "vanished")
        else:
            host.lose(d, "another worker took the job before its handler started")
            host.forget(d)
        return False

    async def _within_limits(self, limits: Limits, d: Delivery) -> bool | None:
        """Whether ``d`` may start now under the group's limits (a key cap and a rate);
        a transient Redis error means not yet. None: the job failed (the user's
        ``concurrency_key`` raised; its failure is recorded like a handler's)."""
        try:
            if not await limits.take_key(d):
                return False
            await limits.take_rate()
            return True
        except asyncio.CancelledError:
            raise
        except KeyFailed as failed:
            d.started = asyncio.get_running_loop().time()
            self._failed(d, failed.error)
            return None
        except Exception as exc:
            if classify(exc) is Fault.FATAL:
                raise
            log.warning("limits unavailable (%s); the job waits", exc, extra=fields(
                stream=self.host.cfg.stream, group=self.host.cfg.group, key=d.msg.key))
            return False

    async def _give_back(self, limits: Limits, d: Delivery) -> None:
        try:
            await limits.give_back(d)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the hold lapses on its own after visibility_timeout
            if classify(exc) is Fault.FATAL:
                raise

    async def _call_sync(self, msg: Message) -> Any:
        """Run a plain ``def`` handler on a pool thread (an async one runs on the loop)."""
        assert self._pool is not None
        if self.host.tracing:
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
        took = asyncio.get_running_loop().time() - d.started
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
        """Decide a failed job's fate (retry, dead letter, cancelled) and hand it to the
        flusher, which logs the one line of the failure once Redis has its outcome; a retry
        in place (ordered) is decided here, so it is logged here."""
        if d.dropped:
            self.host.forget(d)
            return
        cfg, msg = self.host.cfg, d.msg
        etype = type(exc).__name__
        tb = traceback_text(exc, TRACEBACK_LIMIT)
        detail = f"{error_message(exc, None)}\n{tb}"
        if msg.cancelled:  # whatever it raised: the job was cancelled, not retried
            action, reason, delay = "c", "cancelled", 0.0
        elif isinstance(exc, DeadLetter):
            action, reason, delay = "d", f"dead_letter: {text(exc.reason)}", 0.0
        elif msg.attempt >= cfg.max_deliveries:
            action, reason, delay = "d", "timeout" if d.timed_out else "max_deliveries", 0.0
        else:
            action = "r"
            reason = "timeout" if d.timed_out else "retry"
            explicit = exc.delay if isinstance(exc, Retry) else None
            delay = retry_delay_for(msg.attempt, cfg.retry_delay, cfg.retry_max_delay,
                                    explicit=explicit)
        took_ms = round((asyncio.get_running_loop().time() - d.started) * 1000, 1)
        if action == "r" and cfg.ordered:
            log.warning("job failed: retrying in place in %s s (ordered): %s",
                        seconds(delay), describe(exc), extra=fields(
                            stream=cfg.stream, group=cfg.group, consumer=self.host.name,
                            key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                            duration_ms=took_ms, error_type=etype, error=error_message(exc),
                            reason=reason, delay_ms=round(delay * 1000)))
            self.host.retry_in_place(d, delay)
            return
        self.host.outcomes.add_failure(Failure(
            d, d.entry_id, d.src, action, round(delay * 1000), msg.attempt, reason, etype, detail,
            msg.key, d.body, exc, took_ms=took_ms, traceback=tb))


class _Watch:
    """The time limit of one runner's jobs: one timer per runner, not one per job. It stays
    armed across jobs and, when it fires before the running job's limit, re-arms for that
    limit; so a job past its limit is stopped at its limit, as with a timer of its own.
    The runner sets ``d`` and ``due`` for each job with a limit (``d`` None after it) and
    calls ``arm`` when no timer is armed or it would fire after ``due``."""

    __slots__ = ("d", "due", "loop", "runner", "task", "timer", "when")

    def __init__(self, runner: Runner, task: asyncio.Task[None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.runner = runner
        self.task = task
        self.loop = loop
        self.d: Delivery | None = None  # the running delivery, if it has a time limit
        self.due = 0.0  # its limit, loop time
        self.timer: asyncio.TimerHandle | None = None
        self.when = 0.0  # when the timer fires, loop time

    def arm(self, due: float) -> None:
        """(Re)arm the timer for ``due``: none is armed, or it would fire later."""
        if self.timer is not None:
            self.timer.cancel()
        self.when = due
        self.timer = self.loop.call_at(due, self._fire)

    def _fire(self) -> None:
        self.timer = None
        d = self.d
        if d is None:
            return
        if self.due <= self.when:
            self.runner._time_out(d, self.task)
        else:
            self.when = self.due
            self.timer = self.loop.call_at(self.due, self._fire)

    def close(self) -> None:
        self.d = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _dropped(d: Delivery) -> bool:
    """``d.dropped`` read anew (after an await; a type checker keeps an earlier check's
    answer)."""
    return d.dropped


def _uncancel(task: asyncio.Task[None]) -> None:
    """Withdraw a cancellation this worker made itself (a time limit), on Pythons that
    count them (3.11+), so later timeouts inside handlers are not confused."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()
