"""Starting a job: every start, whoever makes it (the claim, a runner, a batch runner, an
in-place retry), goes through `Starts`, with one check and one commit.

A start is decided first: the delivery is still held and its lease good (`startable`),
the features' checks say go (seam.py: ``check_start``, then ``before_start``, which may
wait on Redis), and the start gate is open. Only then is it committed: with job records
the record becomes the running one (``R``), in the step that checks the job was not
cancelled meanwhile and the lease and the delivery are still this worker's, so a cancel
that reaches Redis first wins (the job never starts) and one that comes after finds it
running. Nothing can make a committed job wait: its handler is called at once.

Commits go in batches. Without a feature that makes starts wait for a runner
(``before_start``, ``route``), starts are committed ahead (`Starts.take`): in the claim
itself (claim.lua takes the record as the running one, one command a job), for as many
deliveries as the runners will take within `HORIZON` at their measured pace (at least the
idle ones), and the rest by start.lua once runners come free (`_pump`). Otherwise a
runner decides its delivery's start and the starts of the runners of one turn of the loop
share one start.lua call.
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
from streamwork._worker.core.seam import GO, Drop, Fail, Go, Hooks, Verdict, Wait

if TYPE_CHECKING:
    from streamwork._worker.core.context import Context
    from streamwork._worker.core.delivery import Delivery
    from streamwork._worker.core.holdings import Holdings
    from streamwork._worker.core.runqueue import RunQueue

log = logging.getLogger(WORKER_LOGGER)

MAX_SPINS: Final = 64  #: loop turns a start batch waits at most for runners still waking
START_RETRY: Final = 0.2  #: s before a job whose start Redis could not record tries again
#: s within which a job committed ahead has its handler called, at the runners' measured
#: pace: what "starts at once" allows a committed job to wait for a runner
HORIZON: Final = 0.002
DECAY: Final = 0.05  #: how fast the measured handler time comes down (it goes up at once)


class Starts:
    """The start path of one consumer."""

    def __init__(self, ctx: Context, holdings: Holdings, queue: RunQueue, hooks: Hooks,
                 ahead: bool = True) -> None:
        self._ctx = ctx
        self._h = holdings
        self._queue = queue
        self._hooks = hooks
        self._leases = leases = ctx.leases
        self._gate = queue.gate
        #: with job records, a start is committed in Redis (start.lua, or in the claim)
        self.commits = leases.claims
        #: starts committed before a runner takes them (in the claim, or for idle runners):
        #: only where the lease is the job record and no feature makes a start wait
        self.ahead = (ahead and leases.mode == LeaseMode.REDIS
                      and not hooks.before and not hooks.routes)
        self._runners = ctx.cfg.concurrency
        self._batch: list[tuple[Delivery, str, int, asyncio.Future[int]]] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._held: deque[Delivery] = deque()  # leased, not committed yet (ahead)
        self._starting = 0  # deliveries whose commit (ahead) is under way
        self.committed = 0  # committed ahead, queued, not taken by a runner yet
        self._pumping = False  # a pump is due in this turn of the loop
        self._pace = 0.0  # s a handler call takes (the recent maximum, decaying); 0: unknown
        if self.ahead:
            queue.eager, queue.deferred = False, True
            queue.feed, queue.on_idle = self._feed, self._soon
        else:
            queue.eager = self.commits

    # ---- committed ahead ---------------------------------------------------------------

    def ran(self, took: float) -> None:
        """A handler call took ``took`` s: the pace committing ahead goes by."""
        pace = self._pace
        self._pace = took if took > pace else pace + (took - pace) * DECAY

    def read_ahead(self, most: int) -> int:
        """How many more deliveries than its base capacity the reader may hold (at most
        ``most``): what the runners will take within `HORIZON` at their pace, when starts
        are committed ahead (so the reader keeps Redis busy while the runners work)."""
        if not self.ahead or self._pace <= 0:
            return 0
        return min(most, int(self._runners * HORIZON / self._pace))

    def _room(self) -> int:
        """How many more starts may be committed now: one per idle runner, plus what the
        runners will take within `HORIZON` at their pace, less what is committed and not
        taken yet, or being committed."""
        q = self._queue
        room = q.idle()
        if room < 0 or not self._gate.open:
            return 0
        if self._pace > 0:
            room += int(self._runners * HORIZON / self._pace)
        return room - self.committed - self._starting - len(self._held)

    async def take(self, batch: Sequence[Delivery]) -> list[int]:
        """Take the leases of ``batch`` (the lease strategy's `take`); ahead, those the
        runners will take at once are started with their lease: claim.lua takes their
        records as the running ones (one command each, no start.lua call)."""
        flags: list[int] = []
        if self.ahead:
            room = max(0, self._room())
            check = self._hooks.check_start
            for d in batch:
                go = room > 0 and check(d) is GO
                flags.append(1 if go else 0)
                room -= go
        k = sum(flags)
        self._starting += k  # those runners are spoken for until the claim answers
        try:
            res = await self._leases.take(batch, flags if k else None)
        finally:
            self._starting -= k
            if k:
                self._soon()
        if k:
            for d, token, flag in zip(batch, res, flags, strict=True):
                if flag and token > 0:
                    d.start_code = Start.GO  # its record is the running one already
        return res

    def _feed(self, ds: list[Delivery]) -> None:
        """Deliveries that may run: committed ones go to the runners, the others wait for
        a commit (`_pump`)."""
        ready = self._queue.ready
        for d in ds:
            if d.start_code is not None:
                ready.append(d)
                self.committed += d.start_code == Start.GO
            else:
                self._held.append(d)
        self._queue.kick()
        self._soon()

    def _soon(self) -> None:
        """Pump at the end of this turn of the loop: runners that park together and
        deliveries queued together share one start.lua call."""
        if not self._pumping:
            self._pumping = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Commit as many held deliveries as there is `_room` for. One that may not be
        committed now (dropped, decided, its lease run out, a check not go) goes to a
        runner as it is: the runner's start deals with it."""
        self._pumping = False
        held = self._held
        if not held or not self._gate.open:
            return
        room = self._room() + len(held)
        if room <= 0:
            return
        q, check = self._queue, self._hooks.check_start
        batch: list[Delivery] = []
        while held and room > 0:
            d = held.popleft()
            room -= 1
            if self._fit(d) and check(d) is GO:
                batch.append(d)
            else:
                q.ready.append(d)
        if batch:
            self._starting += len(batch)
            self._spawn(self._commit_ahead(batch))
        q.kick()

    async def _commit_ahead(self, batch: list[Delivery]) -> None:
        """One start.lua call for ``batch``; each delivery keeps its answer (or the error)
        and goes to the runners."""
        got: Any
        try:
            got = await self._run(batch, ["s"] * len(batch), [0] * len(batch))
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
                self.committed += d.start_code == Start.GO
            self._queue.ready.extend(batch)
            self._queue.kick()
            self._soon()

    def taken(self, d: Delivery) -> bool:
        """A runner took ``d``: whether its start was committed ahead (it runs now)."""
        if d.start_code == Start.GO:
            d.start_code = None
            self.committed -= 1
            return not d.dropped and d.state == State.QUEUED
        return False

    # ---- decided by a runner ----------------------------------------------------------

    def _fit(self, d: Delivery) -> bool:
        """Whether ``d`` is still held, undecided and its lease good (no side effects)."""
        return (not d.dropped and d.state == State.QUEUED
                and not self._leases.expired(d, time.monotonic()))

    def startable(self, d: Delivery) -> bool:
        """The checks before any start: ``d`` not dropped, not decided meanwhile (cancelled
        before it started) and its lease not run out; one that fails them is let go."""
        h = self._h
        if d.dropped:
            h.forget(d)
            return False
        if d.state != State.QUEUED:
            return False
        if self.commits and self._leases.expired(d, time.monotonic()):
            h.lose(d, "its lease ran out before the handler started", leave=True)
            return False
        return True

    def decide_now(self, d: Delivery) -> Go | Fail | None:
        """`decide` without waiting, for a consumer whose features check starts only
        synchronously and whose starts commit nothing (dedup off): the runner's hot path
        awaits no coroutine for it."""
        if not self.startable(d):
            return None
        return self.refused(d, self._hooks.check_start(d))

    def refused(self, d: Delivery, verdict: Verdict) -> Go | Fail | None:
        """What a synchronous check's ``verdict`` means for ``d`` (nothing to undo: no
        ``before_start`` ran): go, fail it, or None (it waits, or was dropped: done here)."""
        if isinstance(verdict, (Go, Fail)):
            return verdict
        if isinstance(verdict, Wait):
            self._h.requeue_later(d, verdict.delay)
        elif isinstance(verdict, Drop):
            self._h.drop(d, verdict.state, verdict.reason)
        return None

    async def decide(self, d: Delivery) -> Go | Fail | None:
        """Whether ``d`` may start, as far as it and the features go: GO (commit it now),
        a `Fail` for the runner to fail it with, or None (it waits, was dropped or let go:
        dealt with here)."""
        if not self.startable(d):
            return None
        hooks = self._hooks
        verdict: Verdict = hooks.check_start(d)
        if verdict is GO and hooks.before:
            for before in hooks.before:
                verdict = await before(d)
                if verdict is not GO:
                    break
            d.admitted = True
            if verdict is GO and not self._gate.open:  # closed while the checks waited
                await self.release(d)
                self._queue.park([d])  # first again once the gate opens
                return None
            if verdict is GO and not self.startable(d):  # dropped while they waited
                await self.release(d)
                return None
        if isinstance(verdict, Go):
            return verdict
        await self.release(d)
        if isinstance(verdict, Fail):
            return verdict
        if isinstance(verdict, Wait):
            self._h.requeue_later(d, verdict.delay)
        elif isinstance(verdict, Drop):
            self._h.drop(d, verdict.state, verdict.reason)
        return None

    async def release(self, d: Delivery) -> None:
        """``d``'s job ended or will not start: the features whose ``before_start`` let it
        go are told (``after_run``), once."""
        if d.admitted:
            d.admitted = False
            for after in self._hooks.after:
                await after(d)

    async def start(self, d: Delivery) -> Go | Fail | None:
        """A runner's start of ``d`` (not committed ahead): `decide`, then commit it.
        GO: its handler may be called now; a `Fail`: fail it; None: it does not start."""
        verdict = await self.decide(d)
        if verdict is not GO or not self.commits:
            return verdict
        try:
            code: int | Exception = await self._add(d, "s", 0)
        except asyncio.CancelledError:
            await self.release(d)
            self._h.forget(d)
            raise
        except Exception as exc:  # Redis could not answer
            code = exc
        if self.started(d, code):
            return GO
        await self.release(d)
        return None

    async def start_all(self, ds: list[Delivery]
                        ) -> tuple[list[Delivery], list[tuple[Delivery, Fail]]]:
        """`start` for a batch handler's deliveries, their commits in one start.lua call:
        those that may start, and those a check failed, with their `Fail`."""
        ok: list[Delivery] = []
        failed: list[tuple[Delivery, Fail]] = []
        for i, d in enumerate(ds):
            if not self._gate.open:  # closed while earlier ones' checks waited
                self._queue.park(ds[i:])
                break
            verdict = await self.decide(d)
            if verdict is GO:
                ok.append(d)
            elif isinstance(verdict, Fail):
                failed.append((d, verdict))
        if ok and not self._gate.open:  # decided before the gate closed, not committed
            for d in ok:
                await self.release(d)
            self._queue.park(ok)
            return [], failed
        if not self.commits or not ok:
            return ok, failed
        asked = [self._add(d, "s", 0) for d in ok]  # one batch: sent once the loop turns
        try:
            answers = await asyncio.gather(*asked, return_exceptions=True)
            if any(not isinstance(a, (int, Exception)) for a in answers):
                raise asyncio.CancelledError  # the start call was cancelled (stopping)
        except asyncio.CancelledError:
            for d in ok:
                await self.release(d)
            self._h.forget_all(ok, "lost")
            raise
        started = []
        for d, answer in zip(ok, answers, strict=True):
            if self.started(d, answer):  # type: ignore[arg-type]
                started.append(d)
            else:
                await self.release(d)
        return started, failed

    def started(self, d: Delivery, answer: int | Exception) -> bool:
        """Whether start.lua's ``answer`` lets ``d``'s handler start. A delivery that may
        not start is let go, acknowledged as cancelled, or waits (Redis could not answer)."""
        h = self._h
        if isinstance(answer, Exception):
            self._unanswered(d, answer)
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

    def settle(self, d: Delivery) -> None:
        """A runner took ``d`` whose commit ahead did not go through (``start_code`` is a
        refusal or an error): deal with it as `started` does."""
        code, d.start_code = d.start_code, None
        if code is not None:
            self.started(d, code)

    def _unanswered(self, d: Delivery, exc: Exception) -> None:
        """``d``'s commit failed with ``exc``: raised again when fatal, else logged (the
        job waits and asks again)."""
        fault = classify(exc)
        if fault is Fault.FATAL:
            raise exc
        # an outage is reported once by the worker, not once per job it holds
        log.log(logging.DEBUG if fault is Fault.TRANSIENT else logging.WARNING,
                "could not start the job (%s); it waits", exc, extra=fields(
                    stream=d.msg.stream, group=self._ctx.cfg.group, key=d.msg.key))

    # ---- in-place retries -------------------------------------------------------------

    def hold(self, d: Delivery, due: float) -> asyncio.Future[int]:
        """Mark ``d`` held again, waiting for its in-place retry due in ``due`` s."""
        return self._add(d, "h", int((time.time() + due) * 1000))

    # ---- start.lua ---------------------------------------------------------------------

    def _add(self, d: Delivery, op: str, due_ms: int) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        if not self._batch:
            self._spawn(self._send())
        self._batch.append((d, op, due_ms, fut))
        return fut

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro, name="streamwork-start")
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self) -> None:
        # runners woken for ready deliveries join this batch before it is sent
        queue = self._queue
        for _ in range(MAX_SPINS):
            await asyncio.sleep(0)
            if not (queue.waking and queue.ready):
                break
        batch, self._batch = self._batch, []
        try:
            res: Any = await self._run([d for d, _, _, _ in batch], [op for _, op, _, _ in batch],
                                       [due for _, _, due, _ in batch])
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

    async def _run(self, ds: list[Delivery], ops: list[str], dues: list[int]) -> Any:
        ctx = self._ctx
        return await ctx.scripts.run(scripts.start(
            ctx.gkeys, ctx.name, self._leases.mode, ctx.cfg.visibility_ms,
            [[d.entry_id for d in ds], [d.src for d in ds], [d.msg.key for d in ds],
             [d.lease_id for d in ds], [d.member for d in ds], ops,
             [d.msg.attempt for d in ds], dues]))

    async def close(self) -> None:
        """Wait for start calls under way (their answers may matter to a draining worker)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
