"""Reclaiming deliveries of crashed or stalled consumers: in batches, then suspects alone.

Deliveries made once are taken back as a batch (a crashed worker's read-ahead, nearly all
innocent): full speed again within about one visibility timeout; when some are this
consumer's own (their leases lapsed here, as in a Redis outage), once it holds nothing,
and so are those it let go itself again in a later outage (letgo.py).
Suspects (delivered twice or more: their batch died too) come one at a time, each running
alone while reading pauses. A job that kills its process costs one batch at most
(max_deliveries >= 3), then only itself."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Final

from streamwork._redis import scripts
from streamwork._redis.replies import Reclaimed
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Admit, State, ref
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.letgo import first_deliveries

log = logging.getLogger(WORKER_LOGGER)

ALONE_POLL: Final = 0.02  #: s between looks while waiting for held deliveries to finish


def jitter(seconds: float) -> float:
    """``seconds`` give or take 20 %, so many workers do not act in step."""
    return seconds * random.uniform(0.8, 1.2)


async def reclaim_once(ctx: Context, h: Holdings, admit: Admit,
                       stopping: Callable[[], bool]) -> bool:
    """One reclaim sweep over deliveries of other consumers idle past the visibility
    timeout (``admit`` what it takes). Returns whether Redis was asked."""
    cfg = ctx.cfg
    await asyncio.sleep(jitter(cfg.reclaim_every))
    reached = False
    for src, stream in ctx.sources.read_now():  # the stream, retries, joined sources
        if stopping():
            continue
        idle = await ctx.redis.xpending_range(
            stream, cfg.group, min="-", max="+", count=cfg.batch_size, idle=cfg.visibility_ms)
        reached = True
        if not idle:
            continue
        first, mine = first_deliveries(idle, cfg.max_deliveries, ctx.name, src, h.let_go)
        if first and not mine:  # a batch: the room left, and at least one batch_size (what
            # others left is older than anything new; the reader waits meanwhile)
            room = max(cfg.batch_size, cfg.concurrency + cfg.batch_size - h.held())
            await _take(ctx, h, admit, stream, src, first[:room])
            continue
        h.isolating = True
        try:
            if first:  # some are this consumer's own (dropped as their leases lapsed, as in
                # a Redis outage): one batch, once it holds nothing (none is finishing then)
                if not await wait_alone(h, cfg.visibility_timeout):
                    return reached
                await _take(ctx, h, admit, stream, src, first[:cfg.concurrency + cfg.batch_size])
                continue
            for p in idle:  # suspects, oldest first, each alone once nothing else runs
                if stopping():
                    break
                if not await wait_alone(h, cfg.visibility_timeout):
                    return reached  # held deliveries wait on leases elsewhere: next sweep
                await _take(ctx, h, admit, stream, src, [p["message_id"]], alone=True)
        finally:
            h.isolating = False
            h.room.set()  # the reader may read again
    return reached


async def reclaim(ctx: Context, stream: str, idle_ms: int, cursor: Any, count: int,
                  ids: list[Any] | None = None) -> Reclaimed:
    """reclaim.lua: claim up to ``count`` deliveries on ``stream`` idle over ``idle_ms``
    from ``cursor`` on, or the deliveries ``ids``; deleted entries are dead-lettered
    (counted and logged here)."""
    got = Reclaimed(*await ctx.scripts.run(scripts.reclaim(
        stream, ctx.keys.dead, ctx.cfg.group, ctx.name, idle_ms, cursor, count,
        ctx.worker_name, ids or ())))
    if got.deleted:
        ctx.count("deleted_while_pending", len(got.deleted))
        log.warning("%d pending entries were deleted from the stream by someone else; recorded "
                    "as dead letters", len(got.deleted), extra=ctx.fields(consumer=None))
    return got


async def wait_alone(h: Holdings, patience: float) -> bool:
    """Wait until ``h`` holds nothing. Deliveries that only wait for a lease held elsewhere
    are waited for ``patience`` seconds at most; returns whether it got there."""
    since = time.monotonic()
    while h.held():
        if any(d.state != State.WAITING for d in h.inflight.values()) or h.loose:
            since = time.monotonic()
        elif time.monotonic() - since > patience:
            return False
        await asyncio.sleep(ALONE_POLL)
    return True


async def _take(ctx: Context, h: Holdings, admit: Admit, stream: str, src: int,
                ids: list[Any], alone: bool = False) -> None:
    """Claim the idle deliveries ``ids`` (first deliveries: a batch; or one suspect,
    ``alone``) and admit those not held here; one of a batch that was delivered again
    meanwhile (its count says so) is left pending, to come back alone."""
    got = await reclaim(ctx, stream, ctx.cfg.visibility_ms, b"0-0", len(ids), ids)
    lg = h.let_go  # one of a batch let go here while innocent stays so (letgo.py)
    taken = [(e, int(n)) for e, n in zip(got.claimed(), got.counts, strict=True)
             if ref(src, e[0]) not in h.inflight
             and (alone or lg.taken_back(ref(src, e[0]), int(n)) or int(n) <= 2)]
    if taken:
        ctx.count("reclaimed", len(taken))
        how = "a suspect, it runs alone" if alone else "first deliveries, run as a batch"
        log.warning("reclaimed %d idle deliveries (%s)", len(taken), how,
                    extra=ctx.fields(entry_id=taken[0][0][0].decode(), attempt=taken[0][1]))
        await admit([e for e, _ in taken], src, [n for _, n in taken])
