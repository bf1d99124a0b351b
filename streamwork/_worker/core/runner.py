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

from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.message import Message, revoke
from streamwork._worker.core import looplag
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State
from streamwork._worker.core.failure import JobCancelled, decide, failure, overran
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.pool import Calls
from streamwork._worker.core.seam import GO, Fail, Go, Hooks
from streamwork._worker.core.start import Starts
from streamwork._worker.core.timelimit import TimeLimit, uncancel

log = logging.getLogger(WORKER_LOGGER)

Handler = Callable[[Message], Any]  #: ``async def handle(msg)`` or a plain ``def``


class Runner:
    """The handler (or a `BatchRunner`'s handle_batch) and how to run it; ``loop()`` is one
    runner task."""

    def __init__(self, ctx: Context, holdings: Holdings, handle: Callable[[Any], Any],
                 starts: Starts, hooks: Hooks, slots: asyncio.Semaphore | None = None) -> None:
        self.ctx = ctx
        self.holdings = holdings
        self._starts = starts
        self._hooks = hooks
        self._slots = slots  # handler slots shared with other consumers of the worker
        self.calls = Calls(handle, ctx.cfg.concurrency, f"sw-{ctx.cfg.stream}",
                           lambda: ctx.tally.tracing)
        #: ``await call(msg)``: the handler, wrapped by the features that wrap it
        self.call = hooks.wrap(self.calls.call)
        self.name = getattr(handle, "__qualname__", None) or type(handle).__name__

    async def loop(self) -> None:
        """One runner: take queued deliveries and run their handlers, one at a time."""
        loop = asyncio.get_running_loop()
        runner = asyncio.current_task()
        assert runner is not None
        ctx, h = self.ctx, self.holdings
        cfg, tally, queue = ctx.cfg, ctx.tally, h.queue
        ready, gate, starts = queue.ready, queue.gate, self._starts
        debug = log.isEnabledFor(logging.DEBUG)
        limit: TimeLimit[Delivery] = TimeLimit(loop, lambda d: self._time_out(d, runner))
        call = self.call
        clock = loop.time  # the loop's clock: what its timers (the time limit) run on
        running, queued = State.RUNNING, State.QUEUED
        finish = h.succeeded
        slots, ahead = self._slots, starts.ahead
        # with no start to commit and no feature checking starts, a delivery runs at once;
        # with only synchronous checks and nothing to commit, it is checked without a wait
        checked = starts.commits or bool(self._hooks.check or self._hooks.before)
        waits = starts.commits or bool(self._hooks.before)
        check = self._hooks.start_check()
        after = bool(self._hooks.after)
        cancellable = cfg.cancel_running and self.calls.is_async
        busy = looplag.runs(runner, self.name, cfg.stream, self.calls.is_async)
        try:
            while True:
                # take a ready delivery without a round trip through the loop
                if ready:
                    d = ready.popleft()
                    if ready:
                        queue.kick()  # more ready: a parked runner may take the next
                else:
                    d = await queue.get()
                if ahead and starts.taken(d):
                    pass  # committed ahead: its handler is called now
                elif ahead and d.start_code is not None:
                    starts.settle(d)  # its commit ahead was refused, or failed
                    continue
                else:
                    if slots is not None:
                        try:
                            await slots.acquire()
                        except asyncio.CancelledError:
                            h.forget(d)
                            raise
                    if not gate.open:  # closed (now, or while it waited for a slot)
                        queue.park([d])
                        if slots is not None:
                            slots.release()
                        continue
                    verdict: Go | Fail | None = GO
                    if not waits and check is not None and not d.dropped and d.state == queued:
                        seen = check(d)  # the hot path without job records
                        if seen is not GO:
                            verdict = starts.refused(d, seen)
                    elif checked or d.dropped or d.state != queued:
                        verdict = await starts.start(d) if waits else starts.decide_now(d)
                    if verdict is not GO:
                        if slots is not None:
                            slots.release()
                        if isinstance(verdict, Fail):  # a feature's check failed the job
                            d.started = clock()
                            self._failed(d, verdict.error)
                        continue
                msg = d.msg
                d.state = running
                d.started = now = clock()
                if msg._cancelled:  # learned before the call: it ends cancelled unrun
                    self._failed(d, JobCancelled("the job was cancelled before its handler "
                                                 "was called"))
                    if slots is not None:
                        slots.release()
                    if after:
                        await starts.release(d)
                    continue
                if cancellable:
                    d.task = runner
                if d.limit is not None:
                    limit.start(d, now + d.limit)
                if tally.tracing:
                    d.span = telemetry.consumer_span(
                        cfg.stream, cfg.group, msg.id, msg.attempt, msg.key, msg.headers,
                        msg.options)
                if debug:
                    log.debug("job started", extra=ctx.fields(
                        key=msg.key, entry_id=msg.id, attempt=msg.attempt))
                busy[runner] = d
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
                    busy.pop(runner, None)
                    if d.limit is not None:
                        limit.stop()
                    d.task = None
                    if ahead:
                        starts.ran(clock() - now)
                    if slots is not None:
                        slots.release()
                    if after:
                        await starts.release(d)
        finally:
            limit.close()
            looplag.ran(runner)

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
        flusher, which logs the one line of the failure once Redis has its outcome; a
        feature may take the failure over (``on_failure``: it logs it then)."""
        if d.dropped:
            self.holdings.forget(d)
            return
        msg = d.msg
        verdict = decide(exc, msg, d.timed_out, self.ctx.cfg)
        for taken_over in self._hooks.failure:
            if taken_over(d, verdict, exc):
                return
        took_ms = round((asyncio.get_running_loop().time() - d.started) * 1000, 1)
        self.holdings.failed(failure(d, exc, verdict, took_ms))
