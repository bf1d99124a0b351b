"""The run queue: deliveries that may run, handed to the runner tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, overload

from streamwork._worker.core.gate import Gate

if TYPE_CHECKING:
    from streamwork._worker.core.delivery import Delivery


class RunQueue:
    """The deliveries that may run, first in first out, for the runners: an unbounded
    ``asyncio.Queue`` without its per-item bookkeeping. A runner takes from ``ready``
    directly while it holds something and awaits ``get()`` only when it is empty.

    Wake-ups are chained: at most one parked runner is woken and not yet running at any
    time; when it takes a delivery and more are ready, it wakes the next. Handlers that
    suspend (I/O) so still get one runner each, while a batch of handlers that finish
    without suspending is run back to back by one runner, with no wake-up per job.
    Eager (with job records, where every start waits for Redis anyway), one parked runner
    is woken per ready delivery at once.

    Deferred, a runner is woken per ready delivery at the end of the loop's turn, for what
    is still ready then: a runner whose handlers finish without suspending takes them all
    first, with no wake-up; one whose handler suspends leaves the rest to as many runners
    at once.

    With ``feed`` set (start.py: starts committed ahead), what is put goes to ``feed``
    first, which starts deliveries for the runners that are idle and puts them in
    ``ready`` once committed; ``on_idle`` is told when a runner parks.

    While the ``gate`` is closed (gate.py) runners start nothing that was not committed."""

    __slots__ = ("_due", "_getters", "_parked", "deferred", "eager", "feed", "gate", "on_idle",
                 "ready", "waking")

    def __init__(self, gate: Gate, eager: bool = False) -> None:
        self.ready: deque[Delivery] = deque()
        self._getters: deque[asyncio.Future[bool]] = deque()
        self.waking = 0  # runners woken that have not taken a delivery yet
        #: wake a parked runner per ready delivery at once, not one after another: when
        #: every start waits for Redis (start.lua), the runners' starts then share a call
        self.eager = eager
        self.deferred = False  # wake runners for what is still ready at the turn's end
        self._due = False  # a deferred wake-up is scheduled
        self.feed: Callable[[list[Delivery]], None] | None = None
        self.on_idle: Callable[[], None] | None = None
        self.gate = gate
        gate.on_open = self._resume
        self._parked: list[Delivery] = []  # taken while the gate was closed, not started

    def put_many(self, ds: list[Delivery]) -> None:
        """Queue ``ds``, in order, and wake a runner for them if none is on its way."""
        if self.feed is not None:
            self.feed(ds)
            return
        self.ready.extend(ds)
        self.kick()

    def idle(self) -> int:
        """Runners parked or woken that no ready delivery is waiting for yet (none while
        the gate is closed: nothing is started for them then)."""
        if not self.gate.open:
            return 0
        return len(self._getters) + self.waking - len(self.ready)

    def park(self, ds: list[Delivery]) -> None:
        """A runner took ``ds`` while the gate was closed, not started: they go back to the
        front of the queue, in order, once it opens (the runner goes on with what was
        committed already)."""
        self._parked.extend(ds)

    def _resume(self) -> None:
        """The gate opened: what was parked goes first, parked runners wake for what is
        ready, and the start path commits deliveries for the idle ones."""
        if self._parked:
            self.ready.extendleft(reversed(self._parked))
            self._parked = []
        self._wake_all()
        if self.on_idle is not None:
            self.on_idle()

    def kick(self) -> None:
        """Wake one parked runner if deliveries are ready and none is on its way (eager:
        as many as there are ready deliveries; deferred: that, at the end of the turn)."""
        if not (self.ready and self._getters):
            return
        if self.deferred:
            if not self._due:
                self._due = True
                asyncio.get_running_loop().call_soon(self._wake_all)
        elif not self.eager:
            if not self.waking:
                self._wake_next()
        else:
            self._wake_all()

    def _wake_all(self) -> None:
        self._due = False
        while self._getters and self.waking < len(self.ready):
            self._wake_next()

    @overload
    async def get(self) -> Delivery: ...

    @overload
    async def get(self, until: float) -> Delivery | None: ...

    async def get(self, until: float | None = None) -> Delivery | None:
        """The next ready delivery, waiting for one; with ``until`` (the loop's time) None
        once that passes first: a batch runner filling its batch, woken before the parked
        runners that have nothing yet (so trickling jobs fill one batch, not several)."""
        ready = self.ready
        loop = asyncio.get_running_loop()
        while not ready:
            getter: asyncio.Future[bool] = loop.create_future()
            if until is None:
                self._getters.append(getter)
                timer = None
            else:
                self._getters.appendleft(getter)
                timer = loop.call_at(until, _give_up, getter)
            if self.on_idle is not None:
                self.on_idle()
            try:
                woken = await getter
            except BaseException:
                if getter.done() and not getter.cancelled() and getter.result():
                    self.waking -= 1  # woken, then cancelled before it could run
                getter.cancel()
                with contextlib.suppress(ValueError):
                    self._getters.remove(getter)
                self.kick()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if not woken:  # its time is up (not woken: ``waking`` does not count it)
                with contextlib.suppress(ValueError):
                    self._getters.remove(getter)
                return None
            self.waking -= 1
        d = ready.popleft()
        if ready:
            self.kick()
        return d

    def _wake_next(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(True)
                self.waking += 1
                break


def _give_up(getter: asyncio.Future[bool]) -> None:
    """A parked getter's time is up: it returns empty-handed (if not woken first)."""
    if not getter.done():
        getter.set_result(False)
