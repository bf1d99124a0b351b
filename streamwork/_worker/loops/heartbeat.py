"""The heartbeat: keeps the deliveries a worker holds from being reclaimed while alive.

Every visibility_timeout/3 one heartbeat.lua call resets the idle time of every held
delivery (XCLAIM ... JUSTID, which does not count a delivery) and extends its lease. A
delivery whose lease could not be confirmed before its deadline is marked lost; one whose
entry was deleted meanwhile is adopted (adopt.lua) so its outcome still lands; one the
server no longer knows at all (it came back empty) is reported as vanished.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import Any

from streamwork._redis import scripts
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._worker.delivery import Delivery, Holder, State

log = logging.getLogger(WORKER_LOGGER)


class Beat(enum.IntEnum):
    """heartbeat.lua's answer per delivery."""

    LOST = 0  #: another consumer owns it, or its lease is gone
    KEPT = 1
    DELETED = 2  #: ours, but its stream entry was deleted: adopt it
    VANISHED = 3  #: neither the stream nor the group knows it any more
    CANCELLED = 5  #: kept, and its job was cancelled meanwhile (producer.cancel)
    CANCELLED_RECORD = 6  #: the record says cancelled (before its handler started)


async def beat_once(h: Holder) -> bool:
    """Sleep one heartbeat interval, then beat (one turn of the heartbeat loop); returns
    whether Redis was asked."""
    await asyncio.sleep(h.cfg.heartbeat_interval)
    return await beat(h)


async def beat(h: Holder) -> bool:
    """One heartbeat over everything ``h`` holds; False when it holds nothing (Redis is
    not asked)."""
    cfg, lease = h.cfg, h.lease
    now = time.monotonic()
    held: list[Delivery] = []
    for d in list(h.held_deliveries()):
        if d.dropped:
            continue
        if d.state in (State.QUEUED, State.RUNNING) and lease.expired(d, now):
            h.lose(d, "no heartbeat was confirmed before the lease deadline")
        else:
            held.append(d)
    loose = list(h.loose_ids())
    if not held and not loose:
        return False
    batch: list[list[Any]] = [[d.entry_id for d in held] + [e for e, _ in loose],
                              [d.src for d in held] + [s for _, s in loose],
                              [d.msg.key for d in held] + [""] * len(loose),
                              [lease.value(d) for d in held] + [""] * len(loose),
                              [d.member for d in held] + [b""] * len(loose),
                              [lease.marked(d) for d in held] + [""] * len(loose)]
    # a claim under way for a waiting delivery may acknowledge it (a duplicate) before this
    # beat runs in Redis: that claim, not the beat, says what became of it
    claiming = [d.leasing for d in held]
    sent = time.monotonic()
    res = await h.scripts.run(scripts.heartbeat(h.gkeys, h.name, cfg.visibility_ms, batch))
    still = set(h.held_deliveries())
    kept, deleted = [], []
    for d, was_claiming, code in zip(held, claiming, res, strict=False):
        if d.dropped or d not in still:  # let go meanwhile: its outcome is settled
            continue
        if code == Beat.KEPT:
            kept.append(d)
        elif code == Beat.CANCELLED:
            kept.append(d)
            h.cancel_running(d)
        elif code == Beat.CANCELLED_RECORD:
            if d.state == State.RUNNING:  # a Redlock lease: the record lapsed while it ran
                kept.append(d)
                h.cancel_running(d)
            else:
                h.cancelled_unstarted(d)
        elif code == Beat.DELETED:
            deleted.append(d)
        elif code == Beat.VANISHED:
            h.vanish(d)
        elif d.state == State.WAITING and (was_claiming or d.leasing):
            continue  # its claim decides (and a later beat looks again)
        elif d.state != State.FINISHING:
            h.lose(d, "another worker took the delivery or its lease")
    await lease.extended(kept, sent)
    if deleted:
        await adopt_deleted(h, deleted)
    return True


async def adopt_deleted(h: Holder, ds: list[Delivery]) -> None:
    """Take over deliveries whose stream entry was deleted while we held them (adopt.lua):
    their body goes to the delayed ZSET as a safety net and their outcome still lands."""
    cfg = h.cfg
    members = [f"{d.msg.attempt}:{d.src}{d.msg.id}:".encode() + d.body for d in ds]
    res = await h.scripts.run(scripts.adopt(h.gkeys, h.name, cfg.visibility_ms, [
        [d.entry_id for d in ds], [d.src for d in ds], members]))
    for d, member, ok in zip(ds, members, res, strict=True):
        if ok:
            d.member = member
            h.count("deleted_while_pending", 1)
            log.warning("the entry of a running job was deleted from the stream; the job "
                        "is kept and its outcome will still be recorded", extra=fields(
                            stream=cfg.stream, group=cfg.group, consumer=h.name,
                            key=d.msg.key, entry_id=d.msg.id))
