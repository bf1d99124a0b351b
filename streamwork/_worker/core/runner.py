"""Running handlers: ``concurrency`` long-lived runner tasks (no task per message), each
job bounded by its time limit (``timeout``, the seed's watchdog).

An ``async def`` handler runs on the loop and is cancelled when its limit passes; a plain
``def`` runs on a daemon thread pool, and since a thread cannot be stopped, a job past its
limit is let go (its lease released with the failure) and whatever it returns later is
dropped. Either way the job fails with reason ``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from streamwork._redis.replies import FailAction
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER, describe, error_message, seconds
from streamwork._wire.message import Message, revoke
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State
from streamwork._worker.core.failure import JobCancelled, decide, failure, overran
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.pool import Calls
from streamwork._worker.core.start import Starter, may_start
from streamwork._worker.core.timelimit import TimeLimit, uncancel
from streamwork._worker.features.limits import Limits, retry_key_after
from streamwork._worker.features.ordered import OrderedGate

log = logging.getLogger(WORKER_LOGGER)

Handler = Callable[[Message], Any]  #: ``async def handle(msg)`` or a plain ``def``


class Runner:
    """The handler (or a `BatchRunner`'s handle_batch) and how to run it; ``loop()`` is one
    runner task."""

    def __init__(self, ctx: Context, holdings: Holdings, handle: Callable[[Any], Any], *,
                 starter: Starter | None = None, limits: Limits | None = None,
                 slots: asyncio.Semaphore | None = None, gate: OrderedGate | None = None) -> None:
        self.ctx = ctx
        self.holdings = holdings
        self._starter = starter  # with job records: start.lua checks each start
        self._limits = limits if limits is not None and limits.on else None
        self._slots = slots  # shared by the consumers of a partitioned worker
        self._gate = gate  # ordered mode: failed jobs retry in place
        self.calls = Calls(handle, ctx.cfg.concurrency, f"sw-{ctx.cfg.stream}",
                           lambda: ctx.tally.tracing)

    async def loop(self) -> None:
        """One runner: take queued deliveries and run their handlers, one at a time."""
        loop = asyncio.get_running_loop()
        runner = asyncio.current_task()
        assert runner is not None
        ctx, h = self.ctx, self.holdings
        cfg, tally, queue = ctx.cfg, ctx.tally, h.queue
        ready = queue.ready
        debug = log.isEnabledFor(logging.DEBUG)
        watch: TimeLimit[Delivery] = TimeLimit(loop, lambda d: self._time_out(d, runner))
        call = self.calls.call
        clock = loop.time  # the loop's clock: what its timers (the time limit) run on
        running = State.RUNNING
        finish = h.succeeded
        slots, limits = self._slots, self._limits
        checked = limits is not None or self._starter is not None  # else no lease to check
        cancellable = cfg.cancel_running and self.calls.is_async
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
                        h.forget(d)
                        raise
                if queue.pause.on:  # paused (now, or while it waited for d, a slot): pause.py
                    await queue.pause.hold_back(ready, d, slots)
                    continue
                if (checked or d.dropped or d.state != State.QUEUED) and not await (
                        self._ready(d) if limits is not None
                        else may_start(d, h, ctx.leases, self._starter)):
                    if slots is not None:
                        slots.release()
                    continue
                msg = d.msg
                d.state = running
                if cancellable:
                    d.task = runner
                d.started = now = clock()
                if d.limit is not None:
                    watch.start(d, now + d.limit)
                if tally.tracing:
                    d.span = telemetry.consumer_span(
                        cfg.stream, cfg.group, msg.id, msg.attempt, msg.key, msg.headers,
                        msg.options)
                if debug:
                    log.debug("job started", extra=ctx.fields(
                        key=msg.key, entry_id=msg.id, attempt=msg.attempt))
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
                        uncancel(runner)
                        self._finished(d, "cancelled", debug)
                        self._failed(d, JobCancelled("the job was cancelled while it ran"))
                        continue
                    if not d.timed_out:
                        telemetry.end_span(d.span, "cancelled")
                        h.forget(d)
                        raise
                    uncancel(runner)
                    self._timed_out(d, debug)
                except Exception as exc:
                    if d.timed_out:
                        uncancel(runner)
                        self._timed_out(d, debug)
                    else:
                        self._finished(d, "failed", debug)
                        self._failed(d, exc)
                else:
                    if d.timed_out:  # the handler swallowed its cancellation
                        uncancel(runner)
                        self._timed_out(d, debug)
                    else:
                        if tally.metering or debug:
                            self._finished(d, "ok", debug)
                        finish(d)
                finally:
                    if d.limit is not None:
                        watch.stop()
                    d.task = None
                    if slots is not None:
                        slots.release()
                    if limits is not None:
                        await limits.release(d)
        finally:
            watch.close()

    async def _ready(self, d: Delivery) -> bool:
        """Whether ``d`` may run now, after every wait (a slot, its turn): `_allowed`, then
        allowed to start (`start.may_start`, which the runner awaits directly without
        limits)."""
        if await self._allowed(d) and await may_start(d, self.holdings, self.ctx.leases,
                                                      self._starter):
            return True
        if self._limits is not None:
            await self._limits.release(d)
        return False

    async def _allowed(self, d: Delivery) -> bool:
        """Whether ``d``, not dropped meanwhile, is within the group's limits (else it
        waits, using no attempt, or fails if the user's concurrency_key raised)."""
        h, limits = self.holdings, self._limits
        if d.dropped:
            h.forget(d)
            return False
        if limits is None or (allowed := await limits.allow(d)) is True:
            return True
        if isinstance(allowed, Exception):  # the user's concurrency_key raised
            d.started = asyncio.get_running_loop().time()
            self._failed(d, allowed)
        else:
            h.requeue_later(d, retry_key_after())
        return False

    def _time_out(self, d: Delivery, runner: asyncio.Task[None]) -> None:
        """The job's time limit passed: cancel its handler (an async one stops at its next
        await; a sync one's thread cannot be stopped, so its delivery is let go)."""
        if d.state == State.RUNNING and not d.timed_out:
            d.timed_out = True
            revoke(d.msg)  # msg.check() now raises: the job is someone else's again
            runner.cancel()

    def _timed_out(self, d: Delivery, debug: bool, abandon: bool = True) -> None:
        if abandon:  # a batch's jobs share one call
            self.calls.abandon()
        self._finished(d, "timeout", debug)
        self.ctx.count("timed_out", 1)
        self._failed(d, overran(d.limit, self.calls.is_async))

    def _finished(self, d: Delivery, result: str, debug: bool) -> None:
        metering = self.ctx.tally.metering
        if not (metering or debug):
            return
        took = asyncio.get_running_loop().time() - d.started
        if metering:
            telemetry.record_duration(took, self.ctx.cfg.stream, self.ctx.cfg.group, result)
        if debug:
            log.debug("job finished", extra=self.ctx.fields(
                key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt,
                duration_ms=round(took * 1000, 2), outcome=result))

    def _failed(self, d: Delivery, exc: Exception) -> None:
        """Decide a failed job's fate (retry, dead letter, cancelled) and hand it to the
        flusher, which logs the one line of the failure once Redis has its outcome; a retry
        in place (ordered) is decided here, so it is logged here."""
        if d.dropped:
            self.holdings.forget(d)
            return
        msg = d.msg
        verdict = decide(exc, msg, d.timed_out, self.ctx.cfg)
        took_ms = round((asyncio.get_running_loop().time() - d.started) * 1000, 1)
        if verdict.action is FailAction.RETRY and self._gate is not None:
            log.warning("job failed: retrying in place in %s s (ordered): %s",
                        seconds(verdict.delay), describe(exc), extra=self.ctx.fields(
                            key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                            duration_ms=took_ms, error_type=type(exc).__name__,
                            error=error_message(exc), reason=verdict.reason,
                            delay_ms=round(verdict.delay * 1000)))
            self._gate.retry_in_place(d, verdict.delay)
            return
        self.holdings.failed(failure(d, exc, verdict, took_ms))
