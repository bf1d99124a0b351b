"""Pausing a consumer group: while its pause hash (``GroupKeys.paused``) is in Redis, the
group's workers start no job.

Each consumer reads the hash when it starts (before anything can run) and then once every
`POLL_INTERVAL` (one HGETALL a second, whatever the job rate: the fast path only looks at
``Pause.on``). While paused, the reader reads nothing new and the runners take nothing from
the run queue; what is held stays held: queued and read-ahead deliveries keep their leases
and heartbeats, so no other worker reclaims them and no delivery or attempt is counted.
A handler running when the pause is seen runs to its end; its outcome is written as usual.
Resumed, the runners take the queue where they left it.

A worker stopped while paused lets go at once of what it has not started (it stays pending
in the group and is taken over by a worker of the group after ``visibility_timeout``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.pausing import PauseState, parse_pause
from streamwork._worker.delivery import State

if TYPE_CHECKING:
    from streamwork._worker.context import Context
    from streamwork._worker.delivery import Delivery

log = logging.getLogger(WORKER_LOGGER)

POLL_INTERVAL: Final = 1.0  #: s between two reads of the pause hash by one consumer


class Pause:
    """Whether this consumer's group is paused, as last read from Redis; runners look at
    ``on`` before taking a delivery and wait on `resumed` while it is set."""

    __slots__ = ("_resumed", "on", "on_resume", "state")

    def __init__(self) -> None:
        self.on = False
        self.state: PauseState | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()
        #: told when the pause ends (the run queue wakes its parked runners)
        self.on_resume: Callable[[], None] | None = None

    async def resumed(self) -> None:
        """Return once the group is not paused (at once if it is not)."""
        await self._resumed.wait()

    def hold_back(self, ready: deque[Delivery], d: Delivery) -> None:
        """A runner took ``d`` as the pause came: it goes back to the front of the queue,
        untouched, to be the first taken when the group resumes."""
        ready.appendleft(d)

    def update(self, state: PauseState | None) -> bool:
        """Take the state just read; returns whether it changed paused/running."""
        self.state = state
        paused = state is not None
        if paused == self.on:
            return False
        self.on = paused
        if paused:
            self._resumed.clear()
        else:
            self._resumed.set()
            if self.on_resume is not None:
                self.on_resume()
        return True


async def read(ctx: Context, pause: Pause) -> None:
    """Read the group's pause hash (one HGETALL) into ``pause``, logging a change and
    setting the ``streamwork.stream.paused`` gauge."""
    state = parse_pause(await ctx.redis.hgetall(ctx.gkeys.paused))
    if pause.update(state):
        if state is not None:
            log.warning("group paused: no job starts until it is resumed%s",
                        f" ({state.reason})" if state.reason else "",
                        extra=ctx.fields(reason=state.reason or None))
        else:
            log.warning("group resumed: jobs start again", extra=ctx.fields())
    if ctx.tally.metering:
        telemetry.set_paused(ctx.cfg.stream, ctx.cfg.group, pause.on)


async def watch_step(ctx: Context, pause: Pause) -> bool:
    """Wait `POLL_INTERVAL`, then read the pause hash (one turn of the pause loop)."""
    await asyncio.sleep(POLL_INTERVAL)
    await read(ctx, pause)
    return True


class _Held(Protocol):
    inflight: dict[bytes, Delivery]
    waiting: dict[bytes, Delivery]

    def forget(self, d: Delivery, outcome: str = ...) -> None: ...


def let_go_unstarted(h: _Held) -> int:
    """Stopping while paused: deliveries not started (queued, waiting) are let go without
    touching Redis, rather than held for the whole drain; they stay pending in the group.
    Returns how many."""
    gone = 0
    for d in list(h.inflight.values()):
        if d.state in (State.QUEUED, State.WAITING):
            d.dropped = True
            h.waiting.pop(d.ref, None)
            h.forget(d, "released")
            gone += 1
    return gone
