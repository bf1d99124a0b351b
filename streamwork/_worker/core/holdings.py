"""What one consumer holds: the deliveries in flight (waiting for a lease, queued, running,
finishing), the entries whose outcome waits without a delivery, the outcomes on their way
to Redis, and the events the reader and the drain wait on.

Every change of what is held goes through here, so the counts the reader's room and the
drain rely on stay right whoever (a runner, the flusher, the heartbeat) makes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from streamwork._redis.replies import FailAction, Start
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER, describe, error_fields
from streamwork._wire.message import revoke
from streamwork._worker.core.arrival import Unfit
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State, ref
from streamwork._worker.core.failure import CANCELLED_QUEUED, Failure
from streamwork._worker.core.letgo import LetGo
from streamwork._worker.core.outage import Fold
from streamwork._worker.core.outbox import Outbox
from streamwork._worker.core.runqueue import RunQueue

log = logging.getLogger(WORKER_LOGGER)


class Holdings:
    """The deliveries and entries one consumer holds (the PEL entries it owns)."""

    def __init__(self, ctx: Context, queue: RunQueue) -> None:
        self.ctx = ctx
        self.queue = queue
        self.outbox = Outbox()
        self.inflight: dict[bytes, Delivery] = {}
        #: entries whose outcome waits without a Delivery: ref -> (entry id, src)
        self.loose: dict[bytes, tuple[bytes, int]] = {}
        self.waiting: dict[bytes, Delivery] = {}  # need a lease before they can run
        #: held deliveries whose outcome is decided (state FINISHING), written or not yet;
        #: the reader does not count them as work to come (it reads while acks are sent)
        self.finishing = 0
        self.isolating = False  # a reclaimed suspect runs alone: no reading meanwhile
        self.let_go = LetGo(max(10_000, 4 * (ctx.cfg.concurrency + ctx.cfg.batch_size)),
                            ctx.cfg.max_deliveries)
        self.room = asyncio.Event()  # set: a reader waiting for room (or isolation) looks again
        self.empty = asyncio.Event()  # set when nothing is held any more
        #: told of every delivery that leaves (the features' ``on_leave`` hooks)
        self.on_leave: tuple[Callable[[Delivery], None], ...] = ()
        #: deliveries given up in a Redis outage, logged as one (``redis_down`` set later)
        self.fold = Fold(lambda: self.let_go.redis_down())

    def held(self) -> int:
        """Deliveries this process holds (the PEL entries it owns)."""
        return len(self.inflight) + len(self.loose)

    def remember_done(self, key: str) -> None:
        if self.ctx.cache is not None:
            self.ctx.cache.add(key)

    # ---- outcomes decided ------------------------------------------------------------

    def succeeded(self, d: Delivery) -> None:
        if d.dropped:  # its lease was lost while it ran
            self.forget(d)
            return
        d.state = State.FINISHING
        self.finishing += 1
        self.outbox.add_done(d)

    def failed(self, f: Failure) -> None:
        if f.delivery is not None:
            f.delivery.state = State.FINISHING
            self.finishing += 1
        self.outbox.add_failure(f)

    def refail(self, f: Failure) -> None:
        """A success on its way to Redis fails after all (a feature refused it): its
        failure goes out instead (it stays counted as finishing)."""
        self.outbox.add_failure(f)

    def ack_known(self, entry_id: bytes, src: int) -> None:
        """An entry whose job the done-cache knows is done: acknowledged, never run."""
        self.loose[ref(src, entry_id)] = (entry_id, src)
        self.outbox.add_ack(entry_id, src)

    def reject(self, entry_id: bytes, src: int, unfit: Unfit) -> None:
        """A delivery that will never run: straight to the dead letters (via the flusher)."""
        self.loose[ref(src, entry_id)] = (entry_id, src)
        self.outbox.add_failure(Failure(
            None, entry_id, src, FailAction.DEAD, 0, unfit.attempts, unfit.reason,
            unfit.error_type, unfit.detail, unfit.job_key, unfit.body))

    def cancelled_unstarted(self, d: Delivery) -> None:
        """start.lua or the heartbeat found the job cancelled before its handler started:
        acknowledge the delivery without running it (the record already says cancelled).
        Once only: the heartbeat and a runner's start may both find it."""
        if d.state not in (State.QUEUED, State.WAITING) or d.dropped:
            return
        if d.state == State.WAITING:
            self.waiting.pop(d.ref, None)
        d.lease_id = ""  # the record is the cancel's now: fail.lua only acknowledges
        m = d.msg
        self.failed(Failure(
            d, d.entry_id, d.src, FailAction.CANCEL, 0, m.attempt, CANCELLED_QUEUED,
            "JobCancelled", "the job was cancelled before its handler started", m.key, d.body))

    def drop(self, d: Delivery, state: str, reason: str) -> None:
        """End ``d``'s job without running it (a feature's `seam.Drop`): acknowledged, its
        record (with job records) says ``state`` and ``reason``; counted as ``state``."""
        if d.state != State.QUEUED or d.dropped:
            return
        m = d.msg
        self.failed(Failure(
            d, d.entry_id, d.src, FailAction.DROP, 0, m.attempt, state, "", reason, m.key,
            d.body))

    def cancel_running(self, d: Delivery) -> None:
        """The heartbeat found the job of a held delivery cancelled: tell its handler
        (``msg.cancelled``) and, with ``cancel_running``, cancel an async one."""
        if d.msg._cancelled:
            return
        d.msg._cancelled = True
        self.ctx.count("cancel_seen", 1)
        if d.task is not None and d.state == State.RUNNING and not d.cancelling:
            d.cancelling = True
            d.task.cancel()

    def requeue_later(self, d: Delivery, delay: float) -> None:
        """Queue ``d`` again after ``delay`` (over a limit, or its start could not be
        recorded, or an in-place retry: it waits, held)."""
        d.state = State.QUEUED
        asyncio.get_running_loop().call_later(delay, self._due, d)

    def _due(self, d: Delivery) -> None:
        # one dropped meanwhile (its lease lost) is queued too: the runner that takes it
        # forgets it and gives back its key hold (left here, it filled the capacity for good)
        if self.inflight.get(d.ref) is d and d.state == State.QUEUED:
            self.queue.put_many([d])

    # ---- leaving ---------------------------------------------------------------------

    def release_loose(self, ref: bytes) -> None:
        self.loose.pop(ref, None)
        self._released()

    def forget(self, d: Delivery, outcome: str = "lost") -> None:
        """Drop a delivery from what this process holds, without touching Redis."""
        self.forget_all([d], outcome)

    def forget_all(self, ds: list[Delivery], outcome: str) -> None:
        """`forget` for a batch (the hot path: outcomes Redis now has), in one pass;
        ``outcome`` ends their spans."""
        inflight, finishing, leave = self.inflight, 0, self.on_leave
        for d in ds:
            for told in leave:
                told(d)
            if d.span is not None:
                telemetry.end_span(d.span, outcome)
                d.span = None
            if inflight.get(d.ref) is d:
                del inflight[d.ref]
                if d.state == State.FINISHING:
                    finishing += 1
        self.finishing -= finishing
        self._released()

    def _released(self) -> None:
        self.room.set()
        if not self.inflight and not self.loose:
            self.empty.set()

    def lose(self, d: Delivery, why: str, error: BaseException | None = None, *,
             leave: bool = False) -> None:
        """Mark a delivery's lease lost: its outcome will never be written by us. ``error``:
        the handler's exception, when the lease was found lost recording its failure;
        ``leave``: it leaves now (else when its runner is done with it)."""
        if self._drop(d, "lost"):
            self._report(d, "lock_lost", f"lease lost: {why}; the job will be completed "
                         "elsewhere", error)
        if leave:
            self.forget(d, "lost")

    def vanish(self, d: Delivery, error: BaseException | None = None, *,
               leave: bool = False) -> None:
        """The server no longer knows a delivery we hold (it came back empty, or the group
        was deleted): say so loudly; its outcome cannot be recorded. ``error`` and
        ``leave``: as for `lose`."""
        if self._drop(d, "vanished"):
            self._report(d, "vanished", "job vanished from Redis while held (the server "
                         "lost its data?); its outcome cannot be recorded", error)
        if leave:
            self.forget(d, "vanished")

    def not_started(self, d: Delivery, code: int, why: str, *, leave: bool = False) -> None:
        """start.lua did not let ``d`` start (``code``, a `Start` other than GO): its job
        was cancelled (acknowledged without running), it vanished, or another worker took
        it (``why``)."""
        if code == Start.CANCELLED:
            self.cancelled_unstarted(d)
        elif code == Start.VANISHED:
            self.vanish(d, leave=leave)
        else:
            self.lose(d, why, leave=leave)

    def _drop(self, d: Delivery, outcome: str) -> bool:
        """Give up a delivery's outcome for good (its handler, if running, is told through
        ``msg.lock_lost``); one that waits or whose outcome waits leaves at once. Returns
        False if it was already dropped."""
        if d.dropped:
            return False
        d.dropped = True
        revoke(d.msg)
        self.let_go.remember(d)
        if d.state == State.WAITING:
            self.waiting.pop(d.ref, None)
            self.forget(d, outcome)
        elif d.state == State.FINISHING and self.outbox.discard(d):
            self.forget(d, outcome)
        return True

    def _report(self, d: Delivery, counter: str, what: str,
                error: BaseException | None) -> None:
        """Count and log a delivery given up (its lease lost, or vanished): one ERROR, or,
        in a Redis outage, folded into the outage's lines (`outage.Fold`)."""
        self.ctx.count(counter, 1)
        failed = "" if error is None else f"; its handler had failed: {describe(error)}"
        extra = self.ctx.fields(key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt,
                                **error_fields(error))
        if not self.fold.add(counter, f"{what}{failed}", extra, d.deadline):
            log.error("%s%s", what, failed, extra=extra)

    def outage_report(self) -> None:
        """Redis has been back a while: one line for what an outage cost (`outage.Fold`)."""
        self.fold.report(self.ctx.fields)
