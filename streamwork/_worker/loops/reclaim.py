"""Reclaiming deliveries from crashed or stalled consumers, one suspect at a time.

Deliveries idle longer than the visibility timeout belong to consumers that died or froze;
one of them may be what killed its process. So they are taken over one at a time and each
runs alone: reading pauses, what this process holds finishes, XAUTOCLAIM ... COUNT 1
claims one, and the next comes only after it is done. A job that kills its process thus
costs only itself, never the jobs read beside it.
"""

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
from streamwork._worker.context import Context
from streamwork._worker.delivery import MAIN, RETRY, Admit, Entry, State, ref
from streamwork._worker.holdings import Holdings

log = logging.getLogger(WORKER_LOGGER)

ALONE_POLL: Final = 0.02  #: s between looks while waiting for held deliveries to finish


def jitter(seconds: float) -> float:
    """``seconds`` give or take 20 %, so many workers do not act in step."""
    return seconds * random.uniform(0.8, 1.2)


async def reclaim_once(ctx: Context, h: Holdings, admit: Admit,
                       stopping: Callable[[], bool]) -> bool:
    """One reclaim sweep: if deliveries of other consumers sit idle past the visibility
    timeout, take them over one at a time (``admit`` them), each running alone. Returns
    whether Redis was asked (not when ``stopping()``)."""
    cfg = ctx.cfg
    await asyncio.sleep(jitter(cfg.reclaim_every))
    reached = False
    for src, stream in ((MAIN, cfg.stream), (RETRY, ctx.gkeys.retry)):
        if stopping():
            continue
        # any delivery of the group on it idle past the visibility timeout?
        idle = await ctx.redis.xpending_range(
            stream, cfg.group, min="-", max="+", count=1, idle=cfg.visibility_ms)
        reached = True
        if not idle:
            continue
        h.isolating = True
        try:
            cursor: Any = b"0-0"
            while not stopping():
                if not await wait_alone(h, cfg.visibility_timeout):
                    return reached  # held deliveries wait on leases elsewhere: next sweep
                cursor, claimed = await _reclaim_one(ctx, h, admit, stream, src, cursor)
                if not claimed and cursor in (b"0-0", "0-0"):
                    break
        finally:
            h.isolating = False
            h.room.set()  # the reader may read again
    return reached


async def reclaim(ctx: Context, stream: str, idle_ms: int, cursor: Any,
                  count: int) -> Reclaimed:
    """reclaim.lua: claim up to ``count`` deliveries of the group on ``stream`` idle over
    ``idle_ms``, from ``cursor`` on; those whose entry was deleted are dead-lettered (and
    counted here)."""
    got = Reclaimed(*await ctx.scripts.run(scripts.reclaim(
        stream, ctx.keys.dead, ctx.cfg.group, ctx.name, idle_ms, cursor, count,
        ctx.worker_name)))
    if got.deleted:
        ctx.count("deleted_while_pending", len(got.deleted))
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


async def _reclaim_one(ctx: Context, h: Holdings, admit: Admit, stream: str, src: int,
                       cursor: Any) -> tuple[Any, bool]:
    """One reclaim.lua call claiming at most one delivery (XAUTOCLAIM ... COUNT 1, dead
    letters for deleted entries, delivery counts, atomically); admits what it claimed."""
    cfg = ctx.cfg
    got = await reclaim(ctx, stream, cfg.visibility_ms, cursor, 1)
    if got.deleted:
        log.warning("%d pending entries were deleted from the stream by someone else; "
                    "recorded as dead letters", len(got.deleted),
                    extra=ctx.fields(consumer=None))
    claimed: list[Entry] = []
    claimed_counts: list[int] = []
    for entry, n in zip(got.claimed(), got.counts, strict=True):
        if ref(src, entry[0]) not in h.inflight:
            claimed.append(entry)
            claimed_counts.append(int(n))
    if claimed:
        ctx.count("reclaimed", len(claimed))
        log.warning("reclaimed a delivery idle over %.1fs; it runs alone", cfg.visibility_timeout,
                    extra=ctx.fields(entry_id=claimed[0][0].decode(), attempt=claimed_counts[0]))
        await admit(claimed, src, claimed_counts)
    return got.cursor, bool(claimed)
