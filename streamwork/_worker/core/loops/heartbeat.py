"""The heartbeat: keeps the deliveries a worker holds from being reclaimed while alive.

Every visibility_timeout/3 one heartbeat.lua call resets the idle time of every held
delivery (XCLAIM ... JUSTID, which does not count a delivery) and extends its lease. A
delivery whose lease could not be confirmed before its deadline is marked lost; one whose
entry was deleted meanwhile is adopted (adopt.lua) so its outcome still lands; one the
server no longer knows at all (it came back empty) is reported as vanished.
"""

from __future__ import annotations

import asyncio
import logging
import time

from streamwork._redis import scripts
from streamwork._redis.replies import Beat
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._worker.core.batches import beat_columns, progress_written
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, State
from streamwork._worker.core.holdings import Holdings

log = logging.getLogger(WORKER_LOGGER)


async def beat_once(ctx: Context, h: Holdings) -> bool:
    """Sleep one heartbeat interval, then beat (one turn of the heartbeat loop); returns
    whether Redis was asked."""
    await asyncio.sleep(ctx.cfg.heartbeat_interval)
    return await beat(ctx, h)


async def beat(ctx: Context, h: Holdings) -> bool:
    """One heartbeat over everything ``h`` holds; False when it holds nothing (Redis is
    not asked)."""
    lease = ctx.leases
    h.outage_report()  # what an outage cost, summed up once Redis has been back a while
    now = time.monotonic()
    alive: list[Delivery] = []
    for d in list(h.inflight.values()):
        if d.dropped:
            continue
        if d.state in (State.QUEUED, State.RUNNING) and lease.expired(d, now):
            h.lose(d, "no heartbeat was confirmed before the lease deadline")
        else:
            alive.append(d)
    loose = list(h.loose.values())
    if not alive and not loose:
        return False
    # a claim under way for a waiting delivery may acknowledge it (a duplicate) before this
    # beat runs in Redis: that claim, not the beat, says what became of it
    claiming = [d.leasing for d in alive]
    reported = [d.msg._progress for d in alive]  # what this beat writes (msg.progress)
    sent = time.monotonic()
    res = await ctx.scripts.run(scripts.heartbeat(ctx.gkeys, ctx.name, ctx.cfg.visibility_ms,
                                                  beat_columns(alive, loose, lease)))
    still = set(h.inflight.values())
    kept, deleted = [], []
    for d, was_claiming, written, code in zip(alive, claiming, reported, res, strict=False):
        if d.dropped or d not in still:  # let go meanwhile: its outcome is settled
            continue
        if code in (Beat.KEPT, Beat.CANCELLED):
            kept.append(d)
            progress_written(d, written)
            if code == Beat.CANCELLED:
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
        await adopt_deleted(ctx, deleted)
    return True


async def adopt_deleted(ctx: Context, ds: list[Delivery]) -> None:
    """Take over deliveries whose stream entry was deleted while we held them (adopt.lua):
    their body goes to the delayed ZSET as a safety net and their outcome still lands."""
    members = [f"{d.msg.attempt}:{d.src}{d.msg.id}:".encode() + d.body for d in ds]
    res = await ctx.scripts.run(scripts.adopt(ctx.gkeys, ctx.name, ctx.cfg.visibility_ms, [
        [d.entry_id for d in ds], [d.src for d in ds], members]))
    for d, member, ok in zip(ds, members, res, strict=True):
        if ok:
            d.member = member
            ctx.count("deleted_while_pending", 1)
            log.warning("the entry of a running job was deleted from the stream; the job "
                        "is kept and its outcome will still be recorded",
                        extra=ctx.fields(key=d.msg.key, entry_id=d.msg.id))
