"""Pausing a consumer group: while its pause hash (``GroupKeys.paused``) is in Redis, the
group's workers start no job.

Each consumer reads the hash as it starts serving (it starts paused: nothing runs before
that read), then once every `POLL_INTERVAL`: one HGETALL a second, whatever the job rate
(the fast path only looks at ``Pause.on``). While paused, the reader reads nothing new and
the runners take nothing from the run queue; what is held stays held: queued and
read-ahead deliveries keep their leases and heartbeats, so no other worker reclaims them
and no delivery or attempt is counted. A handler running when the pause is seen runs to
its end; its outcome is written as usual. Resumed, the runners take the queue where they
left it.

A worker stopped while paused lets go at once of what it has not started: it stays pending
in the group and is taken over by a worker of the group after ``visibility_timeout``,
without counting as a delivery (`hand_back`).
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
from streamwork._worker.core.delivery import State

if TYPE_CHECKING:
    from streamwork._worker.core.context import Context
    from streamwork._worker.core.delivery import Delivery

log = logging.getLogger(WORKER_LOGGER)

POLL_INTERVAL: Final = 1.0  #: s between two reads of the pause hash by one consumer


class Pause:
    """Whether this consumer's group is paused, as last read from Redis; a runner looks at
    ``on`` once per delivery it takes (and gives it back, `hold_back`, while it is set),
    the reader before each read."""

    __slots__ = ("_resumed", "on", "on_resume", "state")

    def __init__(self, on: bool = False) -> None:
        self.on = on  # a consumer's starts paused until its first read of the hash
        self.state: PauseState | None = None
        self._resumed = asyncio.Event()
        if not on:
            self._resumed.set()
        #: told when the pause ends (the run queue wakes its parked runners)
        self.on_resume: Callable[[], None] | None = None

    async def resumed(self) -> bool:
        """Return once the group is not paused (at once if it is not); False, so a loop's
        step that waited here says it did not ask Redis."""
        await self._resumed.wait()
        return False

    async def hold_back(self, ready: deque[Delivery], d: Delivery,
                        slot: asyncio.Semaphore | None = None) -> None:
        """A runner took ``d`` (and a ``slot``) while paused: ``d`` goes back to the front
        of the queue, untouched, to be the first taken, the slot is given back, and the
        runner waits for the resume."""
        if slot is not None:
            slot.release()
        ready.appendleft(d)
        await self._resumed.wait()

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
            log.info("group resumed: jobs start again", extra=ctx.fields())
    if ctx.tally.metering:
        telemetry.set_paused(ctx.cfg.stream, ctx.cfg.group, pause.on)


async def watch_step(ctx: Context, pause: Pause) -> bool:
    """Read the pause hash, then wait `POLL_INTERVAL` (one turn of the pause loop; the
    first read comes as the consumer starts serving, and nothing starts before it)."""
    await read(ctx, pause)
    await asyncio.sleep(POLL_INTERVAL)
    return True


class _Held(Protocol):
    inflight: dict[bytes, Delivery]
    waiting: dict[bytes, Delivery]

    def forget(self, d: Delivery, outcome: str = ...) -> None: ...


def let_go_unstarted(h: _Held) -> list[Delivery]:
    """Deliveries not started (queued, waiting) let go without touching Redis: they stay
    pending in the group. Returns them."""
    gone = []
    for d in list(h.inflight.values()):
        if d.state in (State.QUEUED, State.WAITING):
            d.dropped = True
            h.waiting.pop(d.ref, None)
            h.forget(d, "released")
            gone.append(d)
    return gone


async def hand_back(ctx: Context, h: _Held) -> int:
    """Stopping while paused: let go at once of what has not started (it would only wait
    out the drain), and take one off each one's delivery count (``XCLAIM ... RETRYCOUNT``,
    to this consumer still), so that the worker taking it over after ``visibility_timeout``
    counts the delivery it never ran as none: restarts during a pause use up no attempt.
    Best effort (Redis may be down): it is pending either way. Returns how many."""
    gone = let_go_unstarted(h)
    if not gone:
        return 0
    group, name = ctx.cfg.group, ctx.name
    try:
        for src, stream in ctx.levels.sources():  # the stream, retries, priority levels
            ids = sorted((d.entry_id for d in gone if d.src == src), key=_id_order)
            if not ids:
                continue
            rows = await ctx.redis.xpending_range(stream, group, min=ids[0], max=ids[-1],
                                                  count=len(ids) + 10_000, consumername=name)
            counts = {row["message_id"]: int(row["times_delivered"]) for row in rows}
            pipe = ctx.redis.pipeline(transaction=False)
            for entry_id in ids:
                if counts.get(entry_id, 0) > 0:
                    pipe.xclaim(stream, group, name, 0, [entry_id], justid=True,
                                retrycount=counts[entry_id] - 1)
            await pipe.execute()
    except Exception as exc:  # stopping anyway: they are pending, counted once more
        log.warning("paused and stopping: could not hand back the jobs not started (%s); "
                    "they stay pending", exc, extra=ctx.fields())
    log.info("paused and stopping: %d jobs not started left pending for the group",
             len(gone), extra=ctx.fields())
    return len(gone)


def _id_order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)
