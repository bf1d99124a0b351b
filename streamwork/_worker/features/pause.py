"""Pausing a consumer group: while its pause hash (``GroupKeys.paused``) is in Redis, the
group's workers start no job.

Each consumer reads the hash as it starts serving (it starts paused: nothing runs before
that read), then once every `POLL_INTERVAL`: one HGETALL a second, whatever the job rate
(the fast path only looks at the start gate, gate.py, which a pause closes). While paused,
the reader reads nothing new and the runners start nothing; what is held stays held:
queued and read-ahead deliveries keep their leases and heartbeats, so no other worker
reclaims them and no delivery or attempt is counted. A job whose start was committed
before the pause was seen runs (its handler is called at once); a handler running when
the pause is seen runs to its end; their outcomes are written as usual. Resumed, the
runners take the queue where they left it.

A worker stopped while paused lets go at once of what it has not started: it stays pending
in the group and is taken over by a worker of the group after ``visibility_timeout``,
without counting as a delivery (`hand_back`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.pausing import PauseState, parse_pause
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State
from streamwork._worker.core.gate import Gate
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.seam import Feature, Parts, Step

log = logging.getLogger(WORKER_LOGGER)

POLL_INTERVAL: Final = 1.0  #: s between two reads of the pause hash by one consumer
HOLDER: Final = "pause"  #: what the start gate says closed it


class Pausing(Feature):
    """Whether this consumer's group is paused, as last read from Redis: while it is, the
    start gate (gate.py) is closed. A consumer starts with the gate closed, until its
    first read of the pause hash."""

    def __init__(self, ctx: Context, holdings: Holdings, gate: Gate) -> None:
        self.ctx = ctx
        self.holdings = holdings
        self.gate = gate
        self.state_read: PauseState | None = None
        gate.close(HOLDER)  # nothing starts before the pause hash was first read

    @classmethod
    def build(cls, parts: Parts) -> Pausing:
        return cls(parts.ctx, parts.holdings, parts.gate)

    @property
    def on(self) -> bool:
        return self.gate.closed_by(HOLDER)

    def state(self) -> PauseState | None:
        """Why and since when the group is paused (None: it runs)."""
        return self.state_read

    def loops(self) -> list[tuple[str, Step]]:
        return [("pause", self.watch_step)]

    def update(self, state: PauseState | None) -> bool:
        """Take the state just read; returns whether it changed paused/running."""
        self.state_read = state
        paused = state is not None
        if paused == self.on:
            return False
        if paused:
            self.gate.close(HOLDER)
        else:
            self.gate.release(HOLDER)
        return True

    async def read_pause(self) -> None:
        """Read the group's pause hash (one HGETALL), logging a change and setting the
        ``streamwork.stream.paused`` gauge."""
        ctx = self.ctx
        state = parse_pause(await ctx.redis.hgetall(ctx.gkeys.paused))
        first = self.on and self.state_read is None  # the gate is still closed from build
        if self.update(state) and not (first and state is None):
            if state is not None:
                log.warning("group paused: no job starts until it is resumed%s",
                            f" ({state.reason})" if state.reason else "",
                            extra=ctx.fields(reason=state.reason or None))
            else:
                log.info("group resumed: jobs start again", extra=ctx.fields())
        if ctx.tally.metering:
            telemetry.set_paused(ctx.cfg.stream, ctx.cfg.group, self.on)

    async def watch_step(self) -> bool:
        """Read the pause hash, then wait `POLL_INTERVAL` (one turn of the pause loop; the
        first read comes as the consumer starts serving, and nothing starts before it)."""
        await self.read_pause()
        await asyncio.sleep(POLL_INTERVAL)
        return True

    async def on_stop(self) -> None:
        """Stopping while paused: what has not started would only wait out the drain, so
        it is handed back at once (`hand_back`)."""
        if self.on:
            await hand_back(self.ctx, self.holdings)


def let_go_unstarted(h: Holdings) -> list[Delivery]:
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


async def hand_back(ctx: Context, h: Holdings) -> int:
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
        for src, stream in ctx.sources.read_now():  # the stream, retries, joined sources
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
