"""Batch handlers: ``handle_batch(msgs)`` runs up to ``batch_max`` jobs in one call, for
work that is cheaper in bulk (one INSERT of many rows, one bulk API call).

A batch runner takes a ready delivery, then what else is ready, waiting up to
``batch_wait`` for more until it has ``batch_max``; starts them together (the features'
checks one by one, start.lua once for all), calls the handler once, and turns its answer
into one
outcome per job, each written as a ``handle``'s would be: a job fails, is retried and
dead-lettered on its own. ``concurrency`` is the number of calls in flight; the jobs of
one call share a time limit (jobs sent with another ``timeout`` get calls of their own).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.message import Message, revoke
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.options import CoreConfig, CoreOptions
from streamwork._worker.core.runner import Handler, Runner
from streamwork._worker.core.timelimit import TimeLimit, uncancel
from streamwork.errors import ConfigError

log = logging.getLogger(WORKER_LOGGER)

BatchFn = Callable[[list[Message]], Any]  #: ``async def handle_batch(msgs)`` or a plain def


@dataclass(frozen=True, slots=True)
class BatchHandler:
    """A worker's ``handle_batch``: what the consumer runs in batch runners."""

    fn: BatchFn


AnyHandler = Handler | BatchHandler  #: what a consumer runs: ``handle`` or ``handle_batch``


def make_runner(ctx: Context, holdings: Holdings, handle: AnyHandler,
                **options: Any) -> Runner:
    """The runner of ``handle``: a `BatchRunner` for a `BatchHandler`, else a `Runner`."""
    if isinstance(handle, BatchHandler):
        return BatchRunner(ctx, holdings, handle.fn, **options)
    return Runner(ctx, holdings, handle, **options)


def per_call(handle: AnyHandler, batch_max: int) -> int:
    """Most jobs one handler call runs: ``batch_max`` for a batch handler, else 1."""
    return batch_max if isinstance(handle, BatchHandler) else 1


def check_batch(cfg: CoreConfig, batch: bool, name: str) -> None:
    """Refuse options that do not go with the worker's kind of handler: ``batch_max`` and
    ``batch_wait`` without ``handle_batch``; ``ordered`` and ``cancel_running`` with it
    (both act on one job's handler, and a batch call runs several jobs)."""
    if not batch:
        for option in ("batch_max", "batch_wait"):
            if getattr(cfg, option) != getattr(CoreOptions, option):
                raise ConfigError(option, (
                    f"is an option of batch handlers, but {name} defines handle(), not "
                    f"handle_batch(): define `async def handle_batch(self, msgs)` instead, "
                    f"or leave {option} unset"))
        return
    if cfg.cancel_running:
        raise ConfigError("cancel_running", (
            f"cannot be used with a batch handler ({name}.handle_batch): it would cancel "
            "the whole call, every job of it, for one cancelled job. Leave it off and look "
            "at msg.cancelled instead: whatever the call returns for a cancelled job, it "
            "ends cancelled (its staged writes dropped)"))


def per_message(answer: Any, n: int) -> list[Any]:
    """``handle_batch``'s ``answer`` for ``n`` messages as one outcome per message: a
    result, or an exception (that message fails). A wrong answer fails them all, with an
    error saying what to return (nothing is lost: each is retried)."""
    if answer is None:
        return [None] * n
    if isinstance(answer, (list, tuple)) and len(answer) == n:
        return list(answer)
    kind = type(answer).__name__
    got = f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"
    if isinstance(answer, Sequence) and not isinstance(answer, (str, bytes)):
        got += f" of {len(answer)} item{'s' * (len(answer) != 1)}"
    error = TypeError(
        f"handle_batch returned {got} for {n} message{'s' * (n != 1)}: return None (every "
        f"message succeeded) or a list of {n}, one item per message in the order of msgs: "
        "its result, or an exception instance if that message failed")
    return [error] * n


class BatchRunner(Runner):
    """Runs a batch handler: ``loop()`` is one batch runner task."""

    async def loop(self) -> None:
        """One batch runner: gather ready deliveries, start them, call the handler once."""
        loop = asyncio.get_running_loop()
        runner = asyncio.current_task()
        assert runner is not None
        h, slots, starts = self.holdings, self._slots, self._starts
        gate = h.queue.gate
        watch: TimeLimit[list[Delivery]] = TimeLimit(
            loop, lambda batch: self._time_out_all(batch, runner))
        try:
            while True:
                batch = await self._gather(loop)
                if not gate.open:  # closed while it gathered: the batch waits at the front
                    h.queue.park(batch)
                    await gate.opened()
                    continue
                if slots is not None:
                    try:
                        await slots.acquire()
                    except asyncio.CancelledError:
                        h.forget_all(batch, "lost")
                        raise
                started: list[Delivery] = []
                try:
                    started, failed = await starts.start_all(batch)
                    for d, fail in failed:  # a feature's check failed the job
                        d.started = loop.time()
                        self._failed(d, fail.error)
                    if started:
                        await self._run(started, watch, runner)
                finally:
                    if slots is not None:
                        slots.release()
                    for d in started:
                        await starts.release(d)
        finally:
            watch.close()

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> list[Delivery]:
        """A ready delivery, then what else is ready with the same time limit, waiting up
        to ``batch_wait`` (from the first) for more until there are ``batch_max``. Jobs
        with another time limit wait for a call of their own (put back at the front, in
        order): a call's time limit is its jobs', and one job's short limit must not time
        out mates that were given longer."""
        cfg, h = self.ctx.cfg, self.holdings
        queue, most = h.queue, cfg.batch_max
        ready = queue.ready
        if not queue.gate.open:  # closed: take nothing until it opens
            await queue.gate.opened()
        batch = [ready.popleft() if ready else await queue.get()]
        limit = batch[0].limit
        other: list[Delivery] = []  # another limit: back to the front afterwards
        until = loop.time() + cfg.batch_wait
        try:
            while len(batch) < most:
                while ready and len(batch) < most:
                    d = ready.popleft()
                    (batch if d.limit == limit else other).append(d)
                if len(batch) >= most or loop.time() >= until:
                    break
                got = await queue.get(until)
                if got is None:
                    break
                (batch if got.limit == limit else other).append(got)
        except asyncio.CancelledError:
            h.forget_all(batch + other, "lost")
            raise
        if other:
            ready.extendleft(reversed(other))
        if ready:
            queue.kick()  # more ready: a parked runner may take them
        return batch

    async def _run(self, batch: list[Delivery], watch: TimeLimit[list[Delivery]],
                   runner: asyncio.Task[None]) -> None:
        """Call the handler on ``batch`` and hand each job's outcome on."""
        ctx, h = self.ctx, self.holdings
        cfg, tally = ctx.cfg, ctx.tally
        debug = log.isEnabledFor(logging.DEBUG)
        now = asyncio.get_running_loop().time()
        limit = min((d.limit for d in batch if d.limit is not None), default=None)
        for d in batch:
            msg = d.msg
            d.state = State.RUNNING
            d.started = now
            d.limit = limit  # the call's: its jobs' failure says which limit stopped them
            if tally.tracing:
                d.span = telemetry.consumer_span(
                    cfg.stream, cfg.group, msg.id, msg.attempt, msg.key, msg.headers,
                    msg.options)
            if debug:
                log.debug("job started", extra=ctx.fields(
                    key=msg.key, entry_id=msg.id, attempt=msg.attempt, batch=len(batch)))
        if limit is not None:
            watch.start(batch, now + limit)
        try:
            answer = await self.call([d.msg for d in batch])
        except asyncio.CancelledError:
            if not batch[0].timed_out:
                h.forget_all(batch, "cancelled")
                raise
            uncancel(runner)
            self._timed_out_all(batch, debug)
        except Exception as exc:
            if batch[0].timed_out:
                uncancel(runner)
                self._timed_out_all(batch, debug)
            else:
                for d in batch:
                    self._finished(d, "failed", debug)
                    self._failed(d, exc)
        else:
            if batch[0].timed_out:  # the handler swallowed its cancellation
                uncancel(runner)
                self._timed_out_all(batch, debug)
            else:
                self._sort(batch, answer, debug)
        finally:
            if limit is not None:
                watch.stop()

    def _sort(self, batch: list[Delivery], answer: Any, debug: bool) -> None:
        """Each job's outcome from the handler's answer: a result succeeds, an exception
        fails (that job alone)."""
        finish, metering = self.holdings.succeeded, self.ctx.tally.metering
        for d, outcome in zip(batch, per_message(answer, len(batch)), strict=True):
            if isinstance(outcome, Exception):
                self._finished(d, "failed", debug)
                self._failed(d, outcome)
            else:
                d.result = outcome
                if metering or debug:
                    self._finished(d, "ok", debug)
                finish(d)

    def _time_out_all(self, batch: list[Delivery], runner: asyncio.Task[None]) -> None:
        """The call's time limit passed: every job of it timed out (see `_time_out`)."""
        if batch[0].state == State.RUNNING and not batch[0].timed_out:
            for d in batch:
                d.timed_out = True
                revoke(d.msg)
            runner.cancel()

    def _timed_out_all(self, batch: list[Delivery], debug: bool) -> None:
        """Every job of a call past its time limit fails with reason ``timeout``; a sync
        handler's thread is given up once."""
        for i, d in enumerate(batch):
            self._timed_out(d, debug, abandon=i == 0)
