"""Background loops that keep deliveries safe: heartbeat, reclaim, promote, upkeep.

* heartbeat - every visibility_timeout/3, one heartbeat.lua call resets the idle time of
  every delivery this process holds (XCLAIM ... JUSTID) and extends its lease; a delivery
  whose lease could not be confirmed before its deadline is marked lost.
* reclaim   - XAUTOCLAIM (cursor kept between calls) takes deliveries idle longer than the
  visibility timeout from crashed or stalled consumers; entries deleted while pending are
  recorded as dead letters ``deleted_while_pending`` and counted.
* promote   - moves due retries and delayed jobs from ``{S}:delayed`` onto the stream.
* upkeep    - trims acknowledged entries older than ``retention`` (never a pending or
  unread one) and removes idle consumers that own nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Final

from . import telemetry
from .logs import fields
from .retry import TRANSIENT

if TYPE_CHECKING:
    from .consumer import Consumer, Entry

log = logging.getLogger(__name__)

PROMOTE_INTERVAL: Final = 0.1  #: s between delayed-ZSET sweeps when nothing is due sooner
UPKEEP_INTERVAL: Final = 30.0  #: s between trim/reap rounds (jittered)
GAUGE_INTERVAL: Final = 5.0  #: s between reads of lag/pending/delayed/dead for the gauges


def _jitter(seconds: float) -> float:
    return seconds * random.uniform(0.8, 1.2)


async def heartbeat_loop(c: Consumer) -> None:
    """Keep held deliveries from being reclaimed while they are alive."""
    cfg = c.cfg
    margin = cfg.visibility_timeout * 0.01 + 0.002
    while True:
        await asyncio.sleep(cfg.heartbeat_interval)
        now = time.monotonic()
        held = []
        for d in list(c.inflight.values()):
            if d.msg.lock_lost:
                continue
            if now >= d.deadline and not d.finishing:
                c.lose(d, "no heartbeat was confirmed before the lease deadline")
            else:
                held.append(d)
        if not held:
            continue
        lease_here = cfg.dedup and c.redlock is None
        keys = [c.keys.stream]
        args: list[Any] = [cfg.group, c.name, cfg.visibility_ms, "1" if lease_here else "0",
                           *(d.entry_id for d in held)]
        if lease_here:
            keys += [c.keys.lock(d.msg.key) for d in held]
            args += [d.lease for d in held]
        sent = time.monotonic()
        try:
            res = await c.scripts.heartbeat(keys=keys, args=args)
        except TRANSIENT as exc:
            log.warning("heartbeat failed: %s", exc, extra=fields(stream=cfg.stream))
            continue
        extended = await _extend_redlock(c, held) if c.redlock else {}
        for d, ok in zip(held, res, strict=True):
            if ok == 1 and d.held is None:
                d.deadline = sent + cfg.visibility_timeout - margin
            elif ok == 1 and extended.get(id(d)):
                d.deadline = sent + extended[id(d)]
            elif not d.finishing and c.inflight.get(d.entry_id) is d:
                c.lose(d, "another worker took the delivery or its lease")


async def _extend_redlock(c: Consumer, held: list[Any]) -> dict[int, float]:
    """Extend the Redlock leases of held deliveries; returns their new validity by id()."""
    ds = [d for d in held if d.held is not None]
    results = await asyncio.gather(*(c.bounded(d.held.extend()) for d in ds),
                                   return_exceptions=True)
    return {id(d): r for d, r in zip(ds, results, strict=True) if isinstance(r, float) and r > 0}


async def reclaim_loop(c: Consumer) -> None:
    """XAUTOCLAIM deliveries idle past the visibility timeout and process them here."""
    cfg = c.cfg
    cursor: Any = b"0-0"
    await asyncio.sleep(random.uniform(0, min(cfg.reclaim_every, 0.5)))
    while True:
        room = c.capacity - len(c.inflight)
        if room > 0:
            try:
                cursor = await reclaim_once(c, cursor, room)
            except TRANSIENT as exc:
                await c.transport_failed(exc)
                continue
        if cursor in (b"0-0", "0-0") or room <= 0:
            await asyncio.sleep(_jitter(cfg.reclaim_every))


async def reclaim_once(c: Consumer, cursor: Any, room: int) -> Any:
    """One reclaim.lua call (XAUTOCLAIM + dead letters for deleted entries + delivery
    counts, atomically); admits what it claimed; returns the next cursor."""
    cfg = c.cfg
    sent = time.monotonic()
    nxt, raw, deleted, counts = await c.scripts.reclaim(
        keys=[c.keys.stream, c.keys.dead],
        args=[cfg.group, c.name, cfg.visibility_ms, cursor, min(room, cfg.batch_size),
              c.worker.worker_name])
    if deleted:
        c.count("deleted_while_pending", len(deleted))
        log.warning("%d pending entries were deleted from the stream by someone else; "
                    "recorded as dead letters", len(deleted),
                    extra=fields(stream=cfg.stream, group=cfg.group))
    claimed: list[Entry] = []
    claimed_counts: list[int] = []
    for (eid, flat), n in zip(raw, counts, strict=True):
        if eid in c.inflight:
            continue
        claimed.append((eid, dict(zip(flat[::2], flat[1::2], strict=True))))
        claimed_counts.append(int(n))
    if claimed:
        c.count("reclaimed", len(claimed))
        log.warning("reclaimed %d deliveries idle over %.1fs", len(claimed),
                    cfg.visibility_timeout, extra=fields(stream=cfg.stream, group=cfg.group,
                                                         consumer=c.name))
        await c.admit(claimed, claimed_counts, sent)
    return nxt


async def promote_loop(c: Consumer) -> None:
    """Move due jobs from the delayed ZSET onto the stream."""
    cfg = c.cfg
    while True:
        try:
            moved, wait_ms = await c.scripts.promote(
                keys=[c.keys.delayed, c.keys.stream], args=[cfg.batch_size])
        except TRANSIENT as exc:
            await c.transport_failed(exc)
            continue
        if moved:
            c.count("promoted", moved)
        if moved >= cfg.batch_size:
            continue
        pause = PROMOTE_INTERVAL if wait_ms < 0 else min(wait_ms / 1000, PROMOTE_INTERVAL)
        await asyncio.sleep(max(pause, 0.005) * random.uniform(0.9, 1.1))


async def gauge_loop(c: Consumer) -> None:
    """Refresh the stream gauges (lag, pending, delayed, dead) every few seconds."""
    while True:
        c.refresh_telemetry()
        if c.metering:
            with contextlib.suppress(*TRANSIENT):
                await read_gauges(c)
        await asyncio.sleep(_jitter(GAUGE_INTERVAL))


async def read_gauges(c: Consumer) -> None:
    """One pipelined read of the figures behind the gauges."""
    pipe = c.redis.pipeline(transaction=False)
    pipe.xinfo_groups(c.cfg.stream)
    pipe.zcard(c.keys.delayed)
    pipe.xlen(c.keys.dead)
    groups, delayed, dead = await pipe.execute(raise_on_error=False)
    if isinstance(groups, Exception):
        return
    for g in groups:
        name = g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
        telemetry.set_gauges(c.cfg.stream, name, g.get("lag"), int(g["pending"]),
                             int(delayed), int(dead))


async def upkeep_loop(c: Consumer) -> None:
    """Periodically trim (when retention is set) and reap idle consumers."""
    while True:
        await asyncio.sleep(_jitter(UPKEEP_INTERVAL))
        try:
            await upkeep_once(c)
        except TRANSIENT as exc:
            log.warning("upkeep skipped: %s", exc, extra=fields(stream=c.cfg.stream))


async def upkeep_once(c: Consumer) -> tuple[int, int]:
    """One trim + reap round; returns (entries trimmed, consumers removed)."""
    cfg = c.cfg
    trimmed = 0
    if cfg.retention is not None:
        cutoff = int((time.time() - cfg.retention) * 1000)
        trimmed = await c.scripts.trim(keys=[c.keys.stream], args=[max(cutoff, 0)])
    reaped = await c.scripts.reap(
        keys=[c.keys.stream],
        args=[cfg.group, round(cfg.consumer_idle_timeout * 1000), c.name])
    if trimmed or reaped:
        log.info("upkeep: trimmed %d entries, removed %d idle consumers", trimmed, reaped,
                 extra=fields(stream=cfg.stream, group=cfg.group))
    return int(trimmed), int(reaped)
