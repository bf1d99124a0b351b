"""Housekeeping loops of a worker: promote due retries, trim and reap (the gauges have
their own module, gauges.py).

* promote - moves due retries and delayed jobs from ``{S}:delayed`` onto the stream;
* upkeep  - trims acknowledged entries older than ``retention`` in bounded calls (never a
  pending or unread one) and removes idle consumers that own nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Final

from streamwork._redis import scripts
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import RETRY
from streamwork._worker.core.loops.reclaim import jitter
from streamwork._worker.core.loops.trimming import trim_stream

log = logging.getLogger(WORKER_LOGGER)

PROMOTE_INTERVAL: Final = 0.1  #: s between delayed-ZSET sweeps when nothing is due sooner
UPKEEP_INTERVAL: Final = 30.0  #: s between trim/reap rounds (jittered)


async def promote_once(ctx: Context) -> bool:
    """Move due delayed sends onto the stream (every group gets them) and this group's due
    retries onto its retry stream (only this group gets them); pause until the next is due.
    Returns True: Redis answered (a supervised loop step)."""
    batch = ctx.cfg.batch_size
    moved, wait_ms, retried, retry_wait = await ctx.scripts.run(scripts.promote(
        [(ctx.keys.delayed, ctx.keys.stream), (ctx.gkeys.retries, ctx.gkeys.retry)], batch))
    if moved or retried:
        ctx.count("promoted", moved + retried)
    if moved >= batch or retried >= batch:
        return True
    waits = [w for w in (wait_ms, retry_wait) if w >= 0]
    wait = min([w / 1000 for w in waits] + [PROMOTE_INTERVAL])
    await asyncio.sleep(max(wait, 0.005) * random.uniform(0.9, 1.1))
    return True


async def upkeep_step(ctx: Context) -> bool:
    """Wait a jittered interval, then one trim + reap round (Redis answered: True)."""
    await asyncio.sleep(jitter(UPKEEP_INTERVAL))
    await upkeep_once(ctx)
    return True


async def upkeep_once(ctx: Context) -> tuple[int, int]:
    """One trim + reap round; returns (entries trimmed, consumers removed)."""
    cfg = ctx.cfg
    trimmed = reaped = 0
    for src, stream in ctx.sources.read_now():  # the stream, retries, joined sources
        if cfg.retention is not None:
            # a source a feature added is read by every group of the stream: trimmed only
            # once all of them have joined it (what one has not read stays for it)
            trimmed += await trim_stream(ctx.scripts, stream,
                                         int((time.time() - cfg.retention) * 1000),
                                         shared_with=cfg.stream if src > RETRY else None)
        reaped += await ctx.scripts.run(scripts.reap(
            stream, cfg.group, round(cfg.consumer_idle_timeout * 1000), ctx.name))
    if trimmed or reaped:
        log.info("upkeep: trimmed %d entries, removed %d idle consumers", trimmed, reaped,
                 extra=ctx.fields(consumer=None))
    return int(trimmed), int(reaped)
