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

A pause is state that survives Redis losing its data: a worker that had seen the pause
and finds the hash gone while the server is another one (restarted without persistence,
failed over to a replica that lacked it) or the group gone from the stream (FLUSHALL)
writes the pause back and logs a WARNING, rather than taking it for a resume. A resume
deletes the hash on the same server, with the group still there.

A worker stopped while paused lets go at once of what it has not started: it stays pending
in the group and is taken over by a worker of the group after ``visibility_timeout``,
without counting as a delivery (`hand_back`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import redis.exceptions

from streamwork._redis.faults import denial
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.pausing import PauseState, parse_pause
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State
from streamwork._worker.core.gate import Gate
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.seam import Feature, Parts, Step
from streamwork._worker.core.supervisor import Link

log = logging.getLogger(WORKER_LOGGER)

POLL_INTERVAL: Final = 1.0  #: s between two reads of the pause hash by one consumer
HOLDER: Final = "pause"  #: what the start gate says closed it


class Pausing(Feature):
    """Whether this consumer's group is paused, as last read from Redis: while it is, the
    start gate (gate.py) is closed. A consumer starts with the gate closed, until its
    first read of the pause hash."""

    def __init__(self, ctx: Context, holdings: Holdings, gate: Gate,
                 link: Link | None = None) -> None:
        self.ctx = ctx
        self.holdings = holdings
        self.gate = gate
        self._link = link or Link()
        self._seen_up = self._link.up_since  # when Redis last came back, at the last look
        self.state_read: PauseState | None = None
        self._server: str | None = None  # the run_id of the server the pause was seen on
        self._joined = False  # the group was joined once (a later join: Redis lost it)
        gate.close(HOLDER)  # nothing starts before the pause hash was first read

    @classmethod
    def build(cls, parts: Parts) -> Pausing:
        return cls(parts.ctx, parts.holdings, parts.gate, parts.link)

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
            self._server = None
        return True

    async def on_join(self) -> None:
        """The group was joined again after it vanished (Redis came back empty): if this
        worker had seen a pause, the pause went with the data; write it back now, before
        anything is read (the pause loop may not have looked yet)."""
        if not self._joined:
            self._joined = True
            return
        ctx = self.ctx
        if self.state_read is not None and not await ctx.redis.exists(ctx.gkeys.paused):
            await self._restore()

    async def _restore(self) -> PauseState:
        """Write the pause this worker saw back into Redis, and say so."""
        ctx, state = self.ctx, self.state_read
        assert state is not None
        await ctx.redis.hset(ctx.gkeys.paused, mapping={
            "reason": state.reason, "since": round(state.since * 1000)})
        self._server = await _run_id(ctx.redis)  # the pause lives on this server now
        log.warning("the group's pause was lost with Redis's data (a restart without "
                    "persistence, a FLUSHALL, a failover to a replica that lacked it): "
                    "written back, its jobs still do not start; resume the group "
                    "(`streamwork resume %s --group %s`) when the pause is over",
                    ctx.cfg.stream, ctx.cfg.group, extra=ctx.fields(
                        reason=state.reason or None))
        ctx.count("pause_restored", 1)
        return state

    async def _lost(self) -> bool:
        """The pause hash is gone: whether Redis lost it with its data rather than an
        operator resuming the group. Lost when the server is another one than when the
        pause was seen (restarted, failed over: a restart that kept its data would have
        kept the hash) or the group is gone from the stream (emptied, FLUSHALL)."""
        ctx = self.ctx
        if self._server is not None and await _run_id(ctx.redis) != self._server:
            return True
        try:
            groups = await ctx.redis.xinfo_groups(ctx.cfg.stream)
        except redis.exceptions.ResponseError as exc:  # no such stream
            if denial(exc) is not None:  # not an answer: the user may not ask
                raise
            return True
        names = {g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
                 for g in groups}
        return ctx.cfg.group not in names

    async def read_pause(self) -> None:
        """Read the group's pause hash (one HGETALL), logging a change and setting the
        ``streamwork.stream.paused`` gauge. A pause that vanished with Redis's data is
        written back (`_lost`), not taken for a resume."""
        ctx = self.ctx
        state = parse_pause(await ctx.redis.hgetall(ctx.gkeys.paused))
        if state is not None and (self._server is None
                                  or self._link.up_since != self._seen_up):
            # first seen, or seen again after an outage: the server it lives on now
            self._server = await _run_id(ctx.redis)
            self._seen_up = self._link.up_since
        elif state is None and self.state_read is not None and await self._lost():
            state = await self._restore()
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


async def _run_id(client: object) -> str | None:
    """The server's ``run_id`` (new at every start of a server process), or None when it
    does not say (a proxy): then only a vanished group tells a loss."""
    info = await client.info("server")  # type: ignore[attr-defined]
    run_id = info.get("run_id")
    return None if run_id is None else str(run_id)
