"""A lock-quorum outage: a worker taking job leases from a Redlock (``lock_urls``) that
cannot reach a quorum of its masters cannot lock anything, while a worker that can might
run the jobs. So it does not hoard them: for as long as the quorum is unreachable it

* reads nothing new and starts nothing (it holds the start gate, gate.py, closed);
* hands every job it could not lock back to the group at once (`hand_back`): dropped here
  unrun, its delivery made idle for the visibility timeout (``XCLAIM ... IDLE``) so the
  next reclaim sweep of a worker that reaches the quorum takes it, without counting the
  delivery it never ran (``RETRYCOUNT``);
* takes nothing back (the reclaimer skips its sweeps);
* stopping, hands back at once what it has not started, rather than letting the drain
  wait for jobs that cannot start;
* is not ready (``/readyz`` 503), and says so in one WARNING (`supervisor.QuorumLink`);
  the leases it loses meanwhile are folded into that outage's lines (outage.py), not
  logged one ERROR each.

Jobs locked before the outage cannot have their leases extended: the first extension that
fails gives a lease up (a lost Redlock is never revived) and the next heartbeat drops the
job; its handler sees ``msg.lock_lost`` then, at the latest at the lease's deadline.

`Quorum.step` pings the masters with the backoff of a Redis outage; once a quorum answers
(or a lease is granted or refused by one), one INFO line, and the gate opens. The outage
is found by the leases the worker takes, and by its heartbeats: when none of their
extensions goes through and a quorum does not answer a PING either (a worker that reads
nothing new still learns it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State
from streamwork._worker.core.gate import Gate
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.redlock_lease import RedlockLease
from streamwork._worker.core.supervisor import Supervisor

log = logging.getLogger(WORKER_LOGGER)

HOLDER: Final = "lock quorum"  #: who holds the start gate closed in such an outage
WATCH_EVERY: Final = 0.1  #: s between two turns of the watch (no I/O unless there is news)


class Quorum:
    """One consumer's watch over the lock quorum its lease strategy uses, if it uses one
    (else it watches nothing, and the quorum is always up). Built once the consumer's
    `LetGo` knows of Redis outages: deliveries let go in a quorum outage count as let go
    innocent too, and leases lost in one are folded into it (outage.py)."""

    def __init__(self, ctx: Context, h: Holdings, gate: Gate, sup: Supervisor) -> None:
        self.ctx = ctx
        self.h = h
        self.gate = gate
        self.sup = sup  # a stop asked in an outage lets go of what has not started
        lease = ctx.leases
        self.lease = lease if isinstance(lease, RedlockLease) else None
        self._probe_at = 0.0  # monotonic time of the next PING round, in an outage
        if self.lease is not None:
            redis_down, within = h.let_go.redis_down, ctx.cfg.visibility_timeout
            h.let_go.redis_down = lambda: redis_down() or self.down_lately(within)

    @property
    def up(self) -> bool:
        """Whether the quorum is reachable (no outage under way, or no quorum to reach)."""
        return self.lease is None or self.lease.outage.up

    def down_lately(self, within: float) -> bool:
        """Whether the quorum is unreachable now, or was less than ``within`` s ago."""
        return self.lease is not None and self.lease.outage.down_lately(within)

    def loops(self, sup: Supervisor) -> list[asyncio.Task[None]]:
        """Its loop, started under ``sup``, when there is a quorum to watch."""
        return [] if self.lease is None else [sup.loop("quorum", self.step)]

    async def step(self) -> bool:
        """One turn of the watch, every `WATCH_EVERY`: hand back the deliveries the
        consumer let go for want of the quorum; in an outage (found by a lease or by a
        heartbeat's extensions) hold the gate closed and ping the masters with the backoff;
        open the gate once a quorum answers. Never asks the stream's Redis (returns False:
        it proves nothing about it)."""
        lease = self.lease
        assert lease is not None
        await self._give_back(lease)
        link = lease.outage
        if link.up:
            self.gate.release(HOLDER)
        else:
            self.gate.close(HOLDER)
            if self.sup.stopping:  # nothing held unstarted could start: hand it back now
                await self._unstarted()
            if time.monotonic() >= self._probe_at:
                since = time.monotonic()
                if await lease.reached():
                    link.answered(since)  # asked after the outage began: it ends it
                    self.gate.release(HOLDER)
                else:
                    link.failed(ConnectionError("too few masters answer a PING"), since)
                    self._probe_at = time.monotonic() + link.delay()
        await asyncio.sleep(WATCH_EVERY)
        return False

    async def _give_back(self, lease: RedlockLease) -> None:
        """Hand back the deliveries let go for want of the quorum, once the consumer no
        longer holds them (a heartbeat after the hand-back would make them busy again)."""
        inflight = self.h.inflight
        gone = [d for d in lease.unreached if inflight.get(d.ref) is not d]
        if gone:
            lease.unreached = [d for d in lease.unreached if inflight.get(d.ref) is d]
            await hand_back(self.ctx, gone)

    async def _unstarted(self) -> None:
        """Stopping in an outage: let go of what has not started (queued behind the closed
        gate, or waiting), give back its leases (best effort: the masters may not answer;
        unreleased, they expire) and hand it back, so the drain does not wait for it."""
        h = self.h
        gone = [d for d in h.inflight.values()
                if d.state in (State.QUEUED, State.WAITING) and not d.dropped]
        for d in gone:
            d.dropped = True
            h.waiting.pop(d.ref, None)
            h.forget(d, "released")
        if gone:
            await self.ctx.leases.release(gone)
            await hand_back(self.ctx, gone)


async def hand_back(ctx: Context, ds: list[Delivery]) -> None:
    """Make the pending deliveries ``ds`` (let go here unrun) idle for the visibility
    timeout, so the next reclaim sweep of any worker takes them, and take back the
    delivery each never ran from its count. Only those still this consumer's
    (``XPENDING``) are touched. Best effort: one left as it is comes back a visibility
    timeout later (it is no longer heartbeated)."""
    cfg, name = ctx.cfg, ctx.name
    try:
        for src, stream in ctx.sources.read_now():
            ids = sorted((d.entry_id for d in ds if d.src == src), key=_id_order)
            if not ids:
                continue
            rows = await ctx.redis.xpending_range(stream, cfg.group, min=ids[0], max=ids[-1],
                                                  count=len(ids) + 10_000, consumername=name)
            counts = {row["message_id"]: int(row["times_delivered"]) for row in rows}
            pipe = ctx.redis.pipeline(transaction=False)
            for entry_id in ids:
                if entry_id in counts:
                    pipe.xclaim(stream, cfg.group, name, 0, [entry_id], justid=True,
                                idle=cfg.visibility_ms,
                                retrycount=max(counts[entry_id] - 1, 0))
            await pipe.execute()
    except Exception as exc:  # Redis trouble too: they come back once their idle time is up
        log.debug("could not hand back jobs for want of the lock quorum: %s", exc,
                  extra=ctx.fields())


def _id_order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)
