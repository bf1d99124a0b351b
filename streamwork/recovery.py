"""Background steps that keep deliveries safe: heartbeat, reclaim, promote, upkeep.

Each ``*_once`` / ``*_step`` function is one turn of a loop that the consumer runs under
supervision (errors are classified and ridden out there, see consumer.py).

* heartbeat - every visibility_timeout/3, one heartbeat.lua call resets the idle time of
  every delivery this process holds (XCLAIM ... JUSTID) and extends its lease; a delivery
  whose lease could not be confirmed before its deadline is marked lost; one whose entry
  was deleted meanwhile is adopted (adopt.lua) so its outcome still lands; one the server
  no longer knows at all (it came back empty) is reported as vanished.
* reclaim   - deliveries idle longer than the visibility timeout belong to crashed or
  stalled consumers. They are suspects (one of them may have killed its process), so they
  are taken over one at a time and run alone: reading pauses, what this process holds
  finishes, then XAUTOCLAIM ... COUNT 1 claims one, and the next only after it is done. A
  job that kills its process thus costs only itself, never the jobs read beside it.
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

import redis.exceptions

from . import telemetry
from .logs import fields

if TYPE_CHECKING:
    from .consumer import Consumer, Delivery, Entry

log = logging.getLogger(__name__)

PROMOTE_INTERVAL: Final = 0.1  #: s between delayed-ZSET sweeps when nothing is due sooner
UPKEEP_INTERVAL: Final = 30.0  #: s between trim/reap rounds (jittered)
GAUGE_INTERVAL: Final = 5.0  #: s between reads of lag/pending/delayed/dead for the gauges
ALONE_POLL: Final = 0.02  #: s between looks while waiting for held deliveries to finish

# results of heartbeat.lua
_KEPT, _DELETED, _VANISHED = 1, 2, 3


def _jitter(seconds: float) -> float:
    return seconds * random.uniform(0.8, 1.2)


async def heartbeat_once(c: Consumer) -> None:
    """Keep held deliveries from being reclaimed while they are alive (one beat)."""
    from .consumer import FINISHING, QUEUED, RUNNING, lease_deadline

    cfg, keys = c.cfg, c.keys
    await asyncio.sleep(cfg.heartbeat_interval)
    now = time.monotonic()
    beat: list[Delivery] = []
    for d in list(c.inflight.values()):
        if d.dropped:
            continue
        if cfg.dedup and d.state in (QUEUED, RUNNING) and now >= d.deadline:
            c.lose(d, "no heartbeat was confirmed before the lease deadline")
        else:
            beat.append(d)
    loose = list(c.loose)
    if not beat and not loose:
        return
    leases = [d.lease if c.redlock is None else "" for d in beat]
    batch = [[d.entry_id for d in beat] + loose,
             [d.msg.key for d in beat] + [""] * len(loose),
             leases + [""] * len(loose),
             [d.member for d in beat] + [b""] * len(loose)]
    sent = time.monotonic()
    res = await c.scripts.heartbeat(keys=[keys.stream, keys.delayed], args=[
        cfg.group, c.name, cfg.visibility_ms, keys.lock_prefix, _pack(batch)])
    extended = await _extend_redlock(c, beat) if c.redlock else {}
    deleted = []
    for d, code in zip(beat, res, strict=False):
        if d.dropped:
            continue
        if code == _KEPT:
            if d.held is None:
                d.deadline = lease_deadline(sent, cfg.visibility_timeout)
            elif id(d) in extended:
                d.deadline = sent + extended[id(d)]
        elif code == _DELETED:
            deleted.append(d)
        elif code == _VANISHED:
            c.vanish(d)
        elif d.state != FINISHING:
            c.lose(d, "another worker took the delivery or its lease")
    if deleted:
        await adopt_deleted(c, deleted)


async def _extend_redlock(c: Consumer, held: list[Delivery]) -> dict[int, float]:
    """Extend the Redlock leases of held deliveries; returns their new validity by id()."""
    ds = [d for d in held if d.held is not None]
    results = await asyncio.gather(*(c.bounded(d.held.extend()) for d in ds if d.held),
                                   return_exceptions=True)
    return {id(d): r for d, r in zip(ds, results, strict=True) if isinstance(r, float) and r > 0}


async def adopt_deleted(c: Consumer, ds: list[Delivery]) -> None:
    """Take over deliveries whose stream entry was deleted while we held them (adopt.lua):
    their body goes to the delayed ZSET as a safety net and their outcome still lands."""
    cfg, keys = c.cfg, c.keys
    members = [f"{d.msg.attempt}:{d.msg.id}:".encode() + d.body for d in ds]
    res = await c.scripts.adopt(keys=[keys.stream, keys.delayed], args=[
        cfg.group, c.name, cfg.visibility_ms, _pack([[d.entry_id for d in ds], members])])
    for d, member, ok in zip(ds, members, res, strict=True):
        if ok:
            d.member = member
            c.count("deleted_while_pending", 1)
            log.warning("the entry of a running job was deleted from the stream; the job "
                        "is kept and its outcome will still be recorded", extra=fields(
                            stream=cfg.stream, group=cfg.group, consumer=c.name,
                            key=d.msg.key, entry_id=d.msg.id))


async def reclaim_once(c: Consumer) -> None:
    """One reclaim sweep: if deliveries of other consumers sit idle past the visibility
    timeout, take them over one at a time, each running alone (see the module docstring)."""
    cfg = c.cfg
    await asyncio.sleep(_jitter(cfg.reclaim_every))
    if c.stopping or not await _anything_idle(c):
        return
    c.isolating = True
    try:
        cursor: Any = b"0-0"
        while not c.stopping:
            if not await wait_alone(c, cfg.visibility_timeout):
                return  # held deliveries wait on leases elsewhere: try again next sweep
            cursor, claimed = await _reclaim_one(c, cursor)
            if not claimed and cursor in (b"0-0", "0-0"):
                return
    finally:
        c.isolating = False
        c.wake_reader()


async def _anything_idle(c: Consumer) -> bool:
    """Whether any delivery of the group sits idle past the visibility timeout."""
    rows = await c.redis.xpending_range(
        c.cfg.stream, c.cfg.group, min="-", max="+", count=1, idle=c.cfg.visibility_ms)
    return bool(rows)


async def wait_alone(c: Consumer, patience: float) -> bool:
    """Wait until this process holds nothing. Deliveries that only wait for a lease held
    elsewhere are waited for ``patience`` seconds at most; returns whether it got there."""
    from .consumer import WAITING

    since = time.monotonic()
    while c.held():
        if any(d.state != WAITING for d in c.inflight.values()) or c.loose:
            since = time.monotonic()
        elif time.monotonic() - since > patience:
            return False
        await asyncio.sleep(ALONE_POLL)
    return True


async def _reclaim_one(c: Consumer, cursor: Any) -> tuple[Any, bool]:
    """One reclaim.lua call claiming at most one delivery (XAUTOCLAIM ... COUNT 1, dead
    letters for deleted entries, delivery counts, atomically); admits what it claimed."""
    cfg = c.cfg
    nxt, raw, deleted, counts = await c.scripts.reclaim(
        keys=[c.keys.stream, c.keys.dead],
        args=[cfg.group, c.name, cfg.visibility_ms, cursor, 1, c.worker.worker_name])
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
        claimed.append((eid, dict(zip(flat[::2], flat[1::2], strict=True)) if flat else None))
        claimed_counts.append(int(n))
    if claimed:
        c.count("reclaimed", len(claimed))
        log.warning("reclaimed a delivery idle over %.1fs; it runs alone", cfg.visibility_timeout,
                    extra=fields(stream=cfg.stream, group=cfg.group, consumer=c.name,
                                 entry_id=claimed[0][0].decode(), attempt=claimed_counts[0]))
        await c.admit(claimed, claimed_counts)
    return nxt, bool(claimed)


async def promote_once(c: Consumer) -> None:
    """Move due jobs from the delayed ZSET onto the stream; pause until the next is due."""
    cfg = c.cfg
    moved, wait_ms = await c.scripts.promote(
        keys=[c.keys.delayed, c.keys.stream], args=[cfg.batch_size])
    if moved:
        c.count("promoted", moved)
    if moved >= cfg.batch_size:
        return
    pause = PROMOTE_INTERVAL if wait_ms < 0 else min(wait_ms / 1000, PROMOTE_INTERVAL)
    await asyncio.sleep(max(pause, 0.005) * random.uniform(0.9, 1.1))


async def gauges_step(c: Consumer) -> None:
    """Refresh the stream gauges (lag, pending, delayed, dead) every few seconds."""
    c.refresh_telemetry()
    if c.metering:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
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


async def upkeep_step(c: Consumer) -> None:
    """Wait a jittered interval, then one trim + reap round."""
    await asyncio.sleep(_jitter(UPKEEP_INTERVAL))
    await upkeep_once(c)


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


def _pack(value: Any) -> bytes:
    from .consumer import _pack as pack

    return pack(value)
