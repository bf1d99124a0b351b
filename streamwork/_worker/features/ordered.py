"""Ordered mode's gate: the jobs of one order key run one after another, in admission order.

Each order key's deliveries wait in a line; only its head may run, the others are leased
and wait in ``gated`` for their turn. A failed job is retried in place, still at the head
(through the retry stream, the jobs behind it would overtake it). A consumer that stops or
loses its partition lets what has not started go, for the next owner to take over in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, cast

from streamwork._redis.replies import FailAction, Start
from streamwork._telemetry.logs import WORKER_LOGGER, describe, error_message, seconds
from streamwork._wire.message import Message
from streamwork._wire.priorities import DEFAULT_WEIGHTS
from streamwork._worker.core.delivery import MAIN, Admit, Delivery, State
from streamwork._worker.core.failure import Verdict as Fate
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.loops.reclaim import reclaim
from streamwork._worker.core.options import CoreConfig, check_flag
from streamwork._worker.core.seam import Feature, Holder, Parts
from streamwork.errors import ConfigError

log = logging.getLogger(WORKER_LOGGER)


class OrderedOptions:
    """The worker option of ordered mode."""

    ordered: bool = False


class _Config(CoreConfig, OrderedOptions):
    """The options `OrderedGate` reads."""


class OrderedGate(Feature):
    """The lines of one consumer's order keys."""

    options = OrderedOptions
    help = {"ordered": "one job in flight per order key, in enqueue order (a lease per "
                       "partition)"}

    @classmethod
    def check(cls, cfg: Any) -> None:
        check_flag(cfg, "ordered")
        if cfg.ordered and (cfg.priority_order != "strict"
                            or cfg.priority_weights != DEFAULT_WEIGHTS):
            raise ConfigError("priority_order", "ordered mode reads the stream alone, in "
                                                "order: job priorities are not supported with "
                                                "ordered=True; drop the priority options")

    @classmethod
    def check_handler(cls, cfg: Any, batch: bool, name: str) -> None:
        if batch and cfg.ordered:
            raise ConfigError("ordered", (
                f"cannot be used with a batch handler ({name}.handle_batch): ordered mode "
                "runs one job per order key at a time, in order, and a batch call runs "
                "several. Define handle() for an ordered worker, or leave ordered off"))

    @classmethod
    def build(cls, parts: Parts) -> OrderedGate | None:
        if not cast(_Config, parts.ctx.cfg).ordered:
            return None
        return cls(parts.holdings, parts.starts, parts.admit)

    def __init__(self, holdings: Holdings, starts: Holder | None, admit: Admit) -> None:
        self.holdings = holdings
        self.starts = starts
        self._admit = admit
        self.lines: dict[str, deque[Delivery]] = {}
        self.gated: set[bytes] = set()
        self._taken_over = False

    async def on_join(self) -> None:
        """The partition is ours now: its pending jobs first (once, as the consumer starts)."""
        if not self._taken_over:
            await self.take_over(self._admit)
            self._taken_over = True

    def on_admit(self, fresh: list[Delivery]) -> None:
        """Newly admitted deliveries take their places at the end of their keys' lines."""
        for d in fresh:
            self.lines.setdefault(d.msg.order_key, deque()).append(d)

    def route(self, ds: list[Delivery]) -> list[Delivery]:
        """Those of ``ds`` at the head of their line may be queued; the others wait their
        turn."""
        run = []
        for d in ds:
            line = self.lines.get(d.msg.order_key)
            if line and line[0] is d:
                run.append(d)
            else:
                self.gated.add(d.ref)
        return run

    def on_leave(self, d: Delivery) -> None:
        """``d`` leaves (its outcome is written, or it was let go): the next delivery of
        its order key may run, once leased."""
        order_key = d.msg.order_key
        line = self.lines.get(order_key)
        if not line:
            return
        if line[0] is d:
            line.popleft()
            if line and line[0].ref in self.gated:
                self.gated.discard(line[0].ref)
                self.holdings.queue.put_many([line[0]])
        elif d in line:
            line.remove(d)
        self.gated.discard(d.ref)
        if not line:
            del self.lines[order_key]

    def on_failure(self, d: Delivery, fate: Fate, error: Exception) -> bool:
        """A job to be retried is retried here, in place (the jobs behind it would
        overtake it through the retry stream); logged here, as the flusher will not."""
        if fate.action is not FailAction.RETRY:
            return False
        h, msg = self.holdings, d.msg
        took_ms = round((asyncio.get_running_loop().time() - d.started) * 1000, 1)
        log.warning("job failed: retrying in place in %s s (ordered): %s",
                    seconds(fate.delay), describe(error), extra=h.ctx.fields(
                        key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                        duration_ms=took_ms, error_type=type(error).__name__,
                        error=error_message(error), reason=fate.reason,
                        delay_ms=round(fate.delay * 1000)))
        self.retry_in_place(d, fate.delay)
        return True

    def retry_in_place(self, d: Delivery, delay: float) -> None:
        """A failed job is retried here, after ``delay``, still at the head of its line.
        It stays pending and heartbeated meanwhile."""
        h = self.holdings
        h.ctx.count("retried", 1, "timeout" if d.timed_out else "error")
        m = d.msg
        d.msg = Message(m.id, m.stream, m.key, m.payload, m.attempt + 1, m.enqueued_at,
                        m.headers, m.fencing_token, m.group, m.consumer, m.options,
                        _sender=m._sender, _lease=m._lease)
        d.timed_out = False
        d.result = None
        if self.starts is not None and h.ctx.leases.claims:  # the record says it waits
            self.starts.hold(d, delay).add_done_callback(lambda fut: self._held(d, fut))
        h.requeue_later(d, delay)

    def _held(self, d: Delivery, fut: asyncio.Future[int]) -> None:
        """The answer of start.lua's hold for an in-place retry."""
        if fut.cancelled() or fut.exception() is not None:
            return  # the record still says running; the retry's start checks it again
        h = self.holdings
        if d.dropped or h.inflight.get(d.ref) is not d or d.state != State.QUEUED:
            return
        code = fut.result()
        if code != Start.GO:
            h.not_started(d, code, "another worker took the job while it waited for its retry")

    async def on_stop(self) -> None:
        self.let_go_unstarted()

    def let_go_unstarted(self) -> None:
        """Stopping or no longer the owner: deliveries that have not started (queued,
        gated, waiting, retrying later) are let go without touching Redis; they stay
        pending and the partition's next owner takes them over, in order."""
        h = self.holdings
        for d in list(h.inflight.values()):
            if d.state in (State.QUEUED, State.WAITING):
                d.dropped = True
                h.waiting.pop(d.ref, None)
                h.forget(d, "released")

    async def take_over(self, admit: Admit) -> None:
        """On becoming the partition's owner: claim every delivery still pending in the
        group on the stream (previous owners', whatever their idle time), in entry order,
        and ``admit`` them before new ones are read; so no job overtakes an older one of
        its key."""
        ctx = self.holdings.ctx
        cursor: Any = b"0-0"
        while True:
            got = await reclaim(ctx, ctx.cfg.stream, 0, cursor, ctx.cfg.batch_size)
            if got.entries:
                ctx.count("taken_over", len(got.entries))
                await admit(got.claimed(), MAIN, [int(n) for n in got.counts])
            if got.done:
                return
            cursor = got.cursor
