"""Outcomes on their way to Redis: successes (complete.lua, with the writes handlers staged),
failures (fail.lua: retry or dead letter) and acks of known duplicates, in batches.

The flusher sends whatever finished as soon as the previous flush returned, so latency
stays low under load and batches grow by themselves. An outcome that could not be written
(Redis down, out of memory, failing over) is put back and sent again after the caller's
backoff: a finished job is never dropped because a write failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from streamwork._redis import scripts
from streamwork._redis.connection import reconnect_delay
from streamwork._redis.faults import Fault, classify
from streamwork._redis.replies import Done, Failed
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._wire.extensions import Codec, packer
from streamwork._worker.core.batches import done_columns, staged_ops
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery, ref
from streamwork._worker.core.ends import with_reports, with_row_reports
from streamwork._worker.core.failure import Failure, decide, fail_row, failure, report
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.supervisor import uninterrupted

log = logging.getLogger(WORKER_LOGGER)

FLUSH_CHUNK: Final = 500  #: outcomes per script call (keeps one call around a millisecond)
FLUSH_WINDOW: Final = 0.002  #: s a flush waits for handlers still running to finish too
ACKED: Final = int(Done.ACKED)
#: what a failure's fail.lua answer means for its span and its delivery's leaving
OUTCOME: Final = {Failed.RETRIED: "retried", Failed.DEAD: "dead_lettered",
                  Failed.CANCELLED: "cancelled", Failed.VANISHED: "vanished",
                  Failed.DROPPED: "dropped"}


class Outcomes:
    """The flusher: sends the outcomes waiting in the holdings' outbox, in batches."""

    def __init__(self, ctx: Context, holdings: Holdings, codec: Codec | None = None,
                 on_done: tuple[Callable[[Delivery], None], ...] = (),
                 before_done: tuple[Any, ...] = ()) -> None:
        self.ctx = ctx
        self.holdings = holdings
        self._on_done = on_done  # the features told of each success Redis recorded
        self._before_done = before_done  # the features that finish successes first
        self.outbox = holdings.outbox
        self._pack = packer(codec).pack  # the flusher's, for records (results: codec's types)

    async def step(self) -> bool:
        """Wait for something to flush, then flush it (one turn of the flusher loop). A stop
        lets a flush under way finish: its scripts already ran. Returns whether Redis was asked."""
        box, h = self.outbox, self.holdings
        await box.needed.wait()
        if box.size() < self.ctx.cfg.batch_size and h.held() > h.finishing:
            # handlers are still running: give them FLUSH_WINDOW to finish too, so one
            # script call carries a batch of outcomes rather than one or two (outcomes
            # wait at most this long; a job's start is not delayed)
            await asyncio.sleep(FLUSH_WINDOW)
        box.needed.clear()
        return await uninterrupted(self.flush())

    async def flush(self) -> bool:
        """Send what finished so far; on an error put back what was not written (for the
        next try, after the caller's backoff) and raise. Returns whether Redis was asked
        (not when there was nothing to send)."""
        acks, done, failed = self.outbox.take()
        reached = False
        try:
            while acks:
                await self._send_acks(acks[:FLUSH_CHUNK])
                reached = True
                del acks[:FLUSH_CHUNK]
            while done:
                reached = await self._send_done(done[:FLUSH_CHUNK]) or reached
                del done[:FLUSH_CHUNK]
            while failed:
                await self._send_failures(failed[:FLUSH_CHUNK])
                reached = True
                del failed[:FLUSH_CHUNK]
        except BaseException:
            self.outbox.put_back(acks, done, failed)
            raise
        return reached

    async def final_flush(self, within: float) -> None:
        """Send the outcomes a stopping worker's drain produced, riding out transient
        errors for ``within`` seconds."""
        deadline = time.monotonic() + within
        while self.outbox.pending() and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self.flush(), max(deadline - time.monotonic(), 0.01))
            except asyncio.TimeoutError:
                return
            except Exception as exc:
                if classify(exc) is Fault.FATAL:
                    return
                await asyncio.sleep(min(reconnect_delay(1), max(deadline - time.monotonic(), 0)))

    async def _send_acks(self, acks: list[tuple[bytes, int]]) -> None:
        ctx = self.ctx
        res = await ctx.scripts.run(scripts.complete(
            ctx.gkeys, ctx.name, 0, 0, b"", [], [[e for e, _ in acks], [s for _, s in acks]],
            oom_ok=True))
        for entry_id, src in acks:
            self.holdings.release_loose(ref(src, entry_id))
        ctx.count("deduplicated", sum(1 for r in res if r == Done.ACKED), "duplicate")

    async def _send_done(self, done: list[Delivery]) -> bool:
        """complete.lua over the live ones of ``done``; False if none was (not sent)."""
        ctx, h = self.ctx, self.holdings
        lease = ctx.leases
        live, spent = lease.sort_spent(done)  # its lease ran out: another may run it
        for d in spent:
            h.lose(d, "the lease ran out before its completion was written", leave=True)
        await lease.release(spent)
        for finish in self._before_done:  # a feature may finish what a handler staged
            refused = await finish(live)
            if refused:
                live = self._refuse(live, refused)
        if not live:
            return False
        cfg = ctx.cfg
        staged_keys: list[str | bytes] = []
        staged = staged_ops(live, staged_keys, first_key=4)
        columns = done_columns(live, cfg, lease, self._pack)
        reported = with_reports(columns, live, staged_keys, 4, 6, self._pack)
        res = await ctx.scripts.run(scripts.complete(
            ctx.gkeys, ctx.name, lease.mode, round(cfg.dedup_window * 1000), staged,
            staged_keys, columns, oom_ok=not cfg.dedup and not staged and not reported,
            lease_ttl_ms=cfg.visibility_ms))
        acked, cache, told = 0, ctx.cache, self._on_done
        finished: list[Delivery] = []
        for d, code in zip(live, res, strict=True):
            if code == ACKED:
                acked += 1
                finished.append(d)
                for on_done in told:
                    on_done(d)
                if cache is not None:
                    cache.add(d.msg.key)
            elif code in (Done.STAGED_REJECTED, Done.DUPLICATE):
                acked += 1
                h.remember_done(d.msg.key)
                if code == Done.DUPLICATE:
                    ctx.count("deduplicated", 1, "duplicate")
                elif code == Done.STAGED_REJECTED:
                    ctx.count("staged_rejected", 1)
                    log.error("a staged write was rejected by Redis; the others applied",
                              extra=ctx.fields(key=d.msg.key, entry_id=d.msg.id))
                h.forget(d, "acked")
            elif code == Done.VANISHED:
                h.vanish(d, leave=True)
            elif code == Done.CANCELLED:
                ctx.count("cancelled", 1, "running")
                log.warning("job cancelled while it ran: its handler returned, the job ends "
                            "cancelled (staged writes dropped)", extra=ctx.fields(
                                key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt))
                h.forget(d, "cancelled")
            else:
                h.lose(d, "not the owner at completion (its lease lapsed, or another worker "
                       "reclaimed it)", leave=True)
        h.forget_all(finished, "acked")
        ctx.count("acked", acked, "success")
        await lease.release(live)
        return True

    def _refuse(self, live: list[Delivery], refused: list[tuple[Delivery, Exception]]
                ) -> list[Delivery]:
        """Successes a feature refused fail instead, with its error (as their handlers'
        would: retried, then dead-lettered); the rest of ``live`` is written as usual."""
        gone = {id(d) for d, _ in refused}
        for d, exc in refused:
            verdict = decide(exc, d.msg, False, self.ctx.cfg)
            self.holdings.refail(failure(d, exc, verdict, None))
        return [d for d in live if id(d) not in gone]

    async def _send_failures(self, failed: list[Failure]) -> None:
        ctx = self.ctx
        rows = [fail_row(f) for f in failed]
        report_keys: list[str | bytes] = []  # KEYS[5..]: after the dead-letter stream
        with_row_reports(rows, [f.delivery or f for f in failed], report_keys, 5)
        res = await ctx.scripts.run(scripts.fail(
            ctx.gkeys, ctx.name, ctx.worker_name, ctx.leases.mode,
            round(ctx.cfg.dedup_window * 1000), rows, report_keys)) if failed else []
        for f, code in zip(failed, res, strict=True):
            self._failed(f, code)
        await ctx.leases.release([f.delivery for f in failed if f.delivery is not None])

    def _failed(self, f: Failure, code: int) -> None:
        """fail.lua answered for ``f``: report it (a lost or vanished one is reported by
        the holdings, which give it up) and let it go, now that the outcome is known."""
        h, d = self.holdings, f.delivery
        report(self.ctx, f, code)
        if d is not None and code == Failed.VANISHED:
            h.vanish(d, f.error)
        elif d is not None and code == Failed.LOST:
            h.lose(d, "not the owner when recording a failure", f.error)
        if d is None:
            h.release_loose(ref(f.src, f.entry_id))
            return
        outcome = OUTCOME.get(Failed(code), "lost")
        if d.span is not None and f.error is not None:
            telemetry.end_span(d.span, outcome, f.error)
            d.span = None
        h.forget(d, outcome)
