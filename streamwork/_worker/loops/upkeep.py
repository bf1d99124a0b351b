"""Housekeeping loops of a worker: promote due retries, trim and reap, refresh gauges.

* promote - moves due retries and delayed jobs from ``{S}:delayed`` onto the stream;
* upkeep  - trims acknowledged entries older than ``retention`` (never a pending or
  unread one) and removes idle consumers that own nothing;
* gauges  - reads lag, pending, delayed and dead for the OpenTelemetry gauges; lag and
  pending of a group include its retry stream and its due retries, as ``streamwork
  inspect`` counts them (:mod:`streamwork._ops.stats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any, Final

import redis.exceptions

from streamwork._ops.stats import RetrySide, retry_side
from streamwork._redis import scripts
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._wire.keys import StreamKeys
from streamwork._worker.delivery import Holder
from streamwork._worker.loops.reclaim import jitter
from streamwork.errors import ConfigError

log = logging.getLogger(WORKER_LOGGER)

PROMOTE_INTERVAL: Final = 0.1  #: s between delayed-ZSET sweeps when nothing is due sooner
UPKEEP_INTERVAL: Final = 30.0  #: s between trim/reap rounds (jittered)
GAUGE_INTERVAL: Final = 5.0  #: s between reads of lag/pending/delayed/dead for the gauges


async def promote_once(h: Holder) -> bool:
    """Move due delayed sends onto the stream (every group gets them) and this group's due
    retries onto its retry stream (only this group gets them); pause until the next is due.
    Returns True: Redis answered (a supervised loop step)."""
    batch = h.cfg.batch_size
    moved, wait_ms = await h.scripts.run(scripts.promote(h.keys.delayed, h.keys.stream, batch))
    retried, retry_wait = await h.scripts.run(
        scripts.promote(h.gkeys.retries, h.gkeys.retry, batch))
    if moved or retried:
        h.count("promoted", moved + retried)
    if moved >= batch or retried >= batch:
        return True
    waits = [w for w in (wait_ms, retry_wait) if w >= 0]
    pause = min([w / 1000 for w in waits] + [PROMOTE_INTERVAL])
    await asyncio.sleep(max(pause, 0.005) * random.uniform(0.9, 1.1))
    return True


async def upkeep_step(h: Holder) -> bool:
    """Wait a jittered interval, then one trim + reap round (Redis answered: True)."""
    await asyncio.sleep(jitter(UPKEEP_INTERVAL))
    await upkeep_once(h)
    return True


async def upkeep_once(h: Holder) -> tuple[int, int]:
    """One trim + reap round; returns (entries trimmed, consumers removed)."""
    cfg = h.cfg
    trimmed = reaped = 0
    for stream in (h.keys.stream, h.gkeys.retry):
        if cfg.retention is not None:
            cutoff = int((time.time() - cfg.retention) * 1000)
            trimmed += await h.scripts.run(scripts.trim(stream, max(cutoff, 0)))
        reaped += await h.scripts.run(scripts.reap(
            stream, cfg.group, round(cfg.consumer_idle_timeout * 1000), h.name))
    if trimmed or reaped:
        log.info("upkeep: trimmed %d entries, removed %d idle consumers", trimmed, reaped,
                 extra=fields(stream=cfg.stream, group=cfg.group))
    return int(trimmed), int(reaped)


async def gauges_step(h: Holder, metering: bool) -> bool:
    """Refresh the stream gauges (lag, pending, delayed, dead), then wait a few seconds.
    Returns whether Redis answered: gauges are best effort, so an error is swallowed here,
    and a step that swallowed one (or did not ask) must not count as Redis answering."""
    reached = False
    if metering:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            await read_gauges(h)
            reached = True
    await asyncio.sleep(jitter(GAUGE_INTERVAL))
    return reached


async def _retry_sides(client: Any, keys: StreamKeys, names: list[str],
                       now_ms: int) -> dict[str, RetrySide]:
    """Each group's retry stream and retry ZSET figures, in one pipelined round trip (four
    commands per group); a group whose name streamwork would not accept has none."""
    pipe = client.pipeline(transaction=False)
    asked: list[str] = []
    for name in names:
        try:
            gkeys = keys.group(name)
        except ConfigError:
            continue
        pipe.xinfo_groups(gkeys.retry)
        pipe.xlen(gkeys.retry)
        pipe.zcard(gkeys.retries)
        pipe.zcount(gkeys.retries, "-inf", now_ms)
        asked.append(name)
    if not asked:
        return {}
    replies = await pipe.execute(raise_on_error=False)
    sides: dict[str, RetrySide] = {}
    for i, name in enumerate(asked):
        groups, length, waiting, due = replies[4 * i: 4 * i + 4]
        if not isinstance(waiting, Exception) and not isinstance(due, Exception):
            sides[name] = retry_side(name, groups, length, waiting, due)
    return sides


async def read_gauges(h: Holder) -> None:
    """Two pipelined reads (plus the server's clock) of the figures behind the gauges."""
    pipe = h.redis.pipeline(transaction=False)
    pipe.xinfo_groups(h.cfg.stream)
    pipe.zcard(h.keys.delayed)
    pipe.xlen(h.keys.dead)
    groups, delayed, dead = await pipe.execute(raise_on_error=False)
    if isinstance(groups, Exception):
        return
    secs, micros = await h.redis.time()
    named = [(g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"]), g)
             for g in groups]
    sides = await _retry_sides(h.redis, h.keys, [name for name, _ in named],
                               int(secs) * 1000 + int(micros) // 1000)
    # delayed, as inspect counts it: delayed sends and every group's retries waiting
    waiting = int(delayed) + sum(side.waiting for side in sides.values())
    oldest: list[tuple[str, Any]] = []
    for name, g in named:
        side = sides.get(name)
        # without its retry figures (a read error) the lag is not known: report none
        lag = None if side is None else side.total_lag(g.get("lag"))
        pending = int(g["pending"]) + (0 if side is None else side.pending)
        telemetry.set_gauges(h.cfg.stream, name, lag, pending, waiting, int(dead))
        if int(g["pending"]):
            oldest.append((name, g))
        else:
            telemetry.set_oldest_pending_idle(h.cfg.stream, name, 0.0)
    if oldest:  # the idle time of each group's oldest pending delivery
        pipe = h.redis.pipeline(transaction=False)
        for name, _ in oldest:
            pipe.xpending_range(h.cfg.stream, name, min="-", max="+", count=1)
        for (name, _), rows in zip(oldest, await pipe.execute(raise_on_error=False),
                                   strict=True):
            if isinstance(rows, list):
                idle_ms = int(rows[0]["time_since_delivered"]) if rows else 0
                telemetry.set_oldest_pending_idle(h.cfg.stream, name, idle_ms / 1000)
