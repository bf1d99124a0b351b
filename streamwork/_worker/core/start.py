"""Starting a job: the last check before its handler runs.

A delivery is held (its job record says "queued") from admission until a runner is free and
the group's limits let it go; only then does start.lua turn the record into the running one,
in the same step that checks the job was not cancelled meanwhile and the lease and the
delivery are still this worker's. So a cancel that reaches Redis before the start wins
(the job never starts), and one that comes after finds it running. Runners that start jobs
in the same turn of the event loop share one script call.

Without limits (no rate, no concurrency key, no shared slots, not ordered), jobs are
started before a runner takes them (`Starter.prestart`): as many at once as runners are
idle, so each started job has a runner free for it at once, and a runner that finds its
job's start answered goes on without a turn of the event loop per job.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from streamwork._redis import scripts
from streamwork._redis.faults import Fault, classify
from streamwork._redis.replies import LeaseMode, Start
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._worker.core.delivery import State

if TYPE_CHECKING:
    from streamwork._redis.scripts import AsyncScripts
    from streamwork._wire.keys import GroupKeys
    from streamwork._worker.core.delivery import Delivery
    from streamwork._worker.core.holdings import Holdings
    from streamwork._worker.core.leases import LeaseStrategy
    from streamwork._worker.core.runqueue import RunQueue

log = logging.getLogger(WORKER_LOGGER)

MAX_SPINS: Final = 64  #: loop turns a start batch waits at most for runners still waking
START_RETRY: Final = 0.2  #: s before a job whose start Redis could not record tries again


class Starter:
    """Batches start.lua calls of one consumer's runners."""

    def __init__(self, run: AsyncScripts, gkeys: GroupKeys, consumer: str,
                 leases: LeaseStrategy, ttl_ms: int, queue: RunQueue) -> None:
        self._run = run
        self._gkeys = gkeys
        self._consumer = consumer
        self._leases = leases
        self._mode = leases.mode
        self._ttl_ms = ttl_ms
        self._queue = queue
        self._batch: list[tuple[Delivery, str, int, asyncio.Future[int]]] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._held: deque[Delivery] = deque()  # queued, not started yet (prestart)
        self._starting = 0  # deliveries whose start (prestart) is under way
        self._pumping = False  # a pump is due in this turn of the loop
        self._answers: dict[int, asyncio.Future[int]] = {}  # a done future per code
        self._prestart = False

    def prestart(self) -> None:
        """Start queued deliveries before a runner takes them, as many at once as runners
        are idle (each then has a runner free for it), so runners need no turn of the loop
        per job. Only without limits: a started job must not wait for a slot or a token."""
        q = self._queue
        q.eager, q.deferred, q.feed, q.on_idle = False, True, self._feed, self._soon
        self._prestart = True

    async def take(self, batch: Sequence[Delivery]) -> list[int]:
        """Take the leases of ``batch`` (the strategy's `take`). With prestart, a lease in
        the stream's Redis, and runners idle that no delivery waits for, the first as many
        are started with their lease: claim.lua takes their records as the running ones,
        as start.lua would right after, so they need no start.lua call."""
        k = 0
        if self._prestart and self._leases.mode == LeaseMode.REDIS:
            k = max(0, min(len(batch), self._queue.idle() - self._starting - len(self._held)))
        self._starting += k  # those runners are spoken for until the claim answers
        try:
            res = await self._leases.take(batch, k)
        finally:
            self._starting -= k
            if k:
                self._soon()
        for d, token in zip(batch[:k], res, strict=False):
            if token > 0:
                d.start_code = Start.GO  # its record is the running one already
        return res

    def start(self, d: Delivery) -> asyncio.Future[int]:
        """Ask to start ``d``'s handler; the future gives a ``replies.Start`` code (or
        the error). One started already (prestart) gets its answer, done."""
        got = d.start_code
        if got is None:
            return self._add(d, "s", 0)
        d.start_code = None
        if isinstance(got, BaseException) or got not in self._answers:
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            if isinstance(got, BaseException):
                fut.set_exception(got)
                return fut
            fut.set_result(got)
            self._answers[got] = fut
        return self._answers[got]

    def _feed(self, ds: list[Delivery]) -> None:
        """Deliveries that may run: started with their lease already (``start_code`` set)
        go to the runners, the others wait for a start."""
        for d in ds:
            (self._queue.ready if d.start_code is not None else self._held).append(d)
        self._queue.kick()
        self._soon()

    def _soon(self) -> None:
        """Pump at the end of this turn of the loop: runners that park together and
        deliveries queued together share one start.lua call."""
        if not self._pumping:
            self._pumping = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Start as many held deliveries as runners are idle (not counting those whose
        start is under way). One that may not start (dropped, decided, lease run out)
        goes to a runner as it is: the runner's checks deal with it."""
        self._pumping = False
        q, held = self._queue, self._held
        room = q.idle() - self._starting
        if room <= 0 or not held:
            return
        now, expired, queued = time.monotonic(), self._leases.expired, State.QUEUED
        batch: list[Delivery] = []
        while held and room > 0:
            d = held.popleft()
            room -= 1
            if d.dropped or d.state != queued or expired(d, now):
                q.ready.append(d)
            else:
                batch.append(d)
        if batch:
            self._starting += len(batch)
            task = asyncio.get_running_loop().create_task(self._prestarted(batch),
                                                          name="streamwork-start")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        q.kick()

    async def _prestarted(self, batch: list[Delivery]) -> None:
        """One start.lua call for ``batch``; each delivery keeps its answer (or the error)
        and goes to the runners."""
        got: Any
        try:
            got = await self._run.run(scripts.start(
                self._gkeys, self._consumer, self._mode, self._ttl_ms,
                [[d.entry_id for d in batch], [d.src for d in batch],
                 [d.msg.key for d in batch], [d.lease_id for d in batch],
                 [d.member for d in batch], ["s"] * len(batch),
                 [d.msg.attempt for d in batch], [0] * len(batch)]))
        except asyncio.CancelledError:
            got = None  # stopping: the runners start them one by one, if they still run
            raise
        except Exception as exc:  # the runners deal with it as with their own start's
            got = [exc] * len(batch)
        finally:
            self._starting -= len(batch)
            for d, code in zip(batch, got or [None] * len(batch), strict=True):
                d.start_code = code if isinstance(code, Exception) else (
                    None if code is None else int(code))
            self._queue.ready.extend(batch)
            self._queue.kick()
            self._soon()

    def unanswered(self, d: Delivery, exc: Exception) -> None:
        """``d``'s `start` failed with ``exc``: raised again when fatal, else logged (the
        job waits and asks again). A function the runner calls from its own ``except``,
        so the hot path awaits the start future with no coroutine layer in between."""
        fault = classify(exc)
        if fault is Fault.FATAL:
            raise exc
        # an outage is reported once by the worker, not once per job it holds
        log.log(logging.DEBUG if fault is Fault.TRANSIENT else logging.WARNING,
                "could not start the job (%s); it waits", exc, extra=fields(
                    stream=d.msg.stream, group=self._gkeys.name, key=d.msg.key))

    def hold(self, d: Delivery, due: float) -> asyncio.Future[int]:
        """Mark ``d`` held again, waiting for its in-place retry due in ``due`` s."""
        return self._add(d, "h", int((time.time() + due) * 1000))

    def _add(self, d: Delivery, op: str, due_ms: int) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        if not self._batch:
            task = loop.create_task(self._send(), name="streamwork-start")
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        self._batch.append((d, op, due_ms, fut))
        return fut

    async def _send(self) -> None:
        # runners woken for ready deliveries join this batch before it is sent
        queue = self._queue
        for _ in range(MAX_SPINS):
            await asyncio.sleep(0)
            if not (queue.waking and queue.ready):
                break
        batch, self._batch = self._batch, []
        try:
            res: Any = await self._run.run(scripts.start(
                self._gkeys, self._consumer, self._mode, self._ttl_ms,
                [[d.entry_id for d, _, _, _ in batch], [d.src for d, _, _, _ in batch],
                 [d.msg.key for d, _, _, _ in batch], [d.lease_id for d, _, _, _ in batch],
                 [d.member for d, _, _, _ in batch], [op for _, op, _, _ in batch],
                 [d.msg.attempt for d, _, _, _ in batch], [due for _, _, due, _ in batch]]))
        except BaseException as exc:
            for _, _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception)
                                      else asyncio.CancelledError())
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, _, fut), code in zip(batch, res, strict=True):
            if not fut.done():
                fut.set_result(int(code))

    async def close(self) -> None:
        """Wait for start calls under way (their answers may matter to a draining worker)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)


def startable(d: Delivery, h: Holdings, leases: LeaseStrategy) -> bool:
    """The checks before start.lua: ``d`` not dropped, not decided meanwhile (cancelled
    before it started) and its lease not run out; one that fails them is let go."""
    if d.dropped:
        h.forget(d)
        return False
    if d.state != State.QUEUED:
        return False
    if leases.expired(d, time.monotonic()):
        h.lose(d, "its lease ran out before the handler started", leave=True)
        return False
    return True


def started(d: Delivery, h: Holdings, starter: Starter, answer: int | Exception) -> bool:
    """Whether start.lua's ``answer`` lets ``d``'s handler start. A delivery that may not
    start is let go, acknowledged as cancelled, or waits (Redis could not answer)."""
    if isinstance(answer, Exception):
        starter.unanswered(d, answer)
        h.requeue_later(d, START_RETRY)  # held meanwhile; uses no attempt
        return False
    dropped = d.dropped  # it may have been dropped while start.lua ran
    if answer == Start.GO and not dropped:
        return True
    if dropped:
        h.forget(d)
    else:
        h.not_started(d, answer, "another worker took the job before its handler started",
                      leave=True)
    return False


async def may_start(d: Delivery, h: Holdings, leases: LeaseStrategy,
                    starter: Starter | None) -> bool:
    """Whether ``d``'s handler may start now: `startable`, and (with job records) start.lua
    turned its record into the running one (`started`)."""
    if not startable(d, h, leases):
        return False
    if starter is None:
        return True
    try:
        code: int | Exception = await starter.start(d)
    except asyncio.CancelledError:
        h.forget(d)
        raise
    except Exception as exc:  # Redis could not answer
        code = exc
    return started(d, h, starter, code)


async def may_start_all(ds: list[Delivery], h: Holdings, leases: LeaseStrategy,
                        starter: Starter | None) -> list[Delivery]:
    """`may_start` for a batch handler's deliveries, their starts in one start.lua call:
    those that may start."""
    ds = [d for d in ds if startable(d, h, leases)]
    if starter is None or not ds:
        return ds
    asked = [starter.start(d) for d in ds]  # one batch: sent once the loop turns
    try:
        answers = await asyncio.gather(*asked, return_exceptions=True)
        if any(not isinstance(a, (int, Exception)) for a in answers):
            raise asyncio.CancelledError  # the start call was cancelled (the worker stops)
    except asyncio.CancelledError:
        h.forget_all(ds, "lost")
        raise
    return [d for d, answer in zip(ds, answers, strict=True)
            if started(d, h, starter, answer)]  # type: ignore[arg-type]
