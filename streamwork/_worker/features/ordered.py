"""Ordered mode's gate: the jobs of one order key run one after another, in admission order.

Each order key's deliveries wait in a line; only its head may run, the others are leased
and wait in ``gated`` for their turn. A failed job is retried in place, still at the head
(through the retry stream, the jobs behind it would overtake it). A consumer that stops or
loses its partition lets what has not started go, for the next owner to take over in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from streamwork._redis.replies import Start
from streamwork._wire.message import Message
from streamwork._worker.core.delivery import MAIN, Admit, Delivery, State
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.loops.reclaim import reclaim
from streamwork._worker.core.start import Starter


class OrderedGate:
    """The lines of one consumer's order keys."""

    def __init__(self, holdings: Holdings, starter: Starter | None) -> None:
        self.holdings = holdings
        self.starter = starter
        self.lines: dict[str, deque[Delivery]] = {}
        self.gated: set[bytes] = set()
        holdings.on_leave = self.leave

    def join(self, fresh: list[Delivery]) -> None:
        """Newly admitted deliveries take their places at the end of their keys' lines."""
        for d in fresh:
            self.lines.setdefault(d.msg.order_key, deque()).append(d)

    def enqueue(self, ds: list[Delivery]) -> None:
        """Queue those of ``ds`` at the head of their line; the others wait their turn."""
        run = []
        for d in ds:
            line = self.lines.get(d.msg.order_key)
            if line and line[0] is d:
                run.append(d)
            else:
                self.gated.add(d.ref)
        if run:
            self.holdings.queue.put_many(run)

    def leave(self, d: Delivery) -> None:
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

    def retry_in_place(self, d: Delivery, delay: float) -> None:
        """A failed job is retried here, after ``delay``, still at the head of its line.
        It stays pending and heartbeated meanwhile."""
        h = self.holdings
        h.ctx.count("retried", 1, "timeout" if d.timed_out else "error")
        m = d.msg
        d.msg = Message(m.id, m.stream, m.key, m.payload, m.attempt + 1, m.enqueued_at,
                        m.headers, m.fencing_token, m.group, m.consumer, m.options,
                        _sender=m._sender)
        d.timed_out = False
        d.result = None
        if self.starter is not None:  # the record says it waits (and a cancel is seen now)
            self.starter.hold(d, delay).add_done_callback(lambda fut: self._held(d, fut))
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
