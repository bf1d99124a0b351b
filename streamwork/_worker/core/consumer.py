"""The delivery loop of one worker process: read -> admit -> start -> run -> hand outcomes on.

Tasks, all on one event loop, each supervised (supervisor.py):

* reader    - XREADGROUP ``>`` in batches, never more than concurrency + batch_size
              deliveries held (waiting, queued, running, or finished and not yet written);
* claimer   - with job records: leases what the reader admitted (claiming.py), committing
              ahead the starts the runners will take at once (start.py);
* leaser    - retries the lease of deliveries that wait (a live duplicate holds the job,
              the lock quorum is down, Redis refused; claiming.py): waiting never uses up
              an attempt;
* runners   - ``concurrency`` long-lived tasks that run handlers (runner.py; a batch of
              jobs per call: batch_runner.py), each bounded by the job's time limit;
* flusher   - writes outcomes in batches (outcomes.py);
* heartbeat - keeps held deliveries alive (heartbeat.py);
* reclaimer - takes over deliveries of dead consumers, one suspect at a time (reclaim.py);
* promoter, upkeep, gauges - housekeeping (upkeep.py, gauges.py);
* and the loops of its features (seam.py), which plug in through their hooks: the
  consumer names none of them.

What is held lives in `Holdings`; every start goes through `Starts`; the parts share one
frozen `Context`. Every state change of a delivery goes through a Lua script that first
checks this consumer (and its lease, leases.py) still owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from streamwork._redis import acl, connection, scripts
from streamwork._redis.replies import Claim
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._text import redact_url
from streamwork._wire.extensions import Codec
from streamwork._worker.core import context
from streamwork._worker.core.arrival import Arrival
from streamwork._worker.core.batch_runner import AnyHandler, make_runner, per_call
from streamwork._worker.core.delivery import Delivery, Entry, State, ref
from streamwork._worker.core.done_cache import KeyCache
from streamwork._worker.core.gate import Gate
from streamwork._worker.core.group import ensure_group
from streamwork._worker.core.holdings import Holdings
from streamwork._worker.core.loops import gauges, heartbeat, reclaim, upkeep
from streamwork._worker.core.loops.claiming import Claimer
from streamwork._worker.core.loops.filling import Fill
from streamwork._worker.core.options import CoreConfig
from streamwork._worker.core.outage import Fold
from streamwork._worker.core.outcomes import Outcomes
from streamwork._worker.core.quorum import Quorum
from streamwork._worker.core.runqueue import RunQueue
from streamwork._worker.core.seam import Feature, Hooks, Parts
from streamwork._worker.core.start import Starts
from streamwork._worker.core.supervisor import (
    Link,
    StoppedBeforeStart,
    Supervisor,
    cancel,
    uninterrupted,
)

log = logging.getLogger(WORKER_LOGGER)

FINAL_FLUSH: Final = 2.0  #: s a stopping worker keeps trying to write its last outcomes
#: batches a worker may read ahead beyond its capacity while its handlers are quick
READ_AHEAD: Final = 2
#: what claim.lua's refusals count (counter, outcome) and how the delivery leaves
GONE: Final[dict[int, tuple[str, str | None, str]]] = {
    Claim.DUPLICATE: ("deduplicated", "duplicate", "deduplicated"),
    Claim.CANCELLED: ("cancelled", "queued", "cancelled"),
    Claim.UNREACHABLE: ("lock_unreachable", None, "released")}  # handed back: quorum.py
#: the outcome counters the "worker stopped" line reports, each on its own
STOP_COUNTS: Final = ("acked", "retried", "dead_lettered", "deduplicated", "cancelled")


def max_held(concurrency: int, batch_size: int) -> int:
    """Most deliveries one worker process holds at once: concurrency + batch_size running,
    queued or waiting (plus `READ_AHEAD` batches while its handlers are quick), and as
    many again whose outcomes are being written."""
    return 2 * (concurrency + (1 + READ_AHEAD) * batch_size)


class Consumer:
    """Runs one handler against a stream's consumer group until stopped, with the
    ``features`` (classes, seam.py) the worker's options turn on."""

    def __init__(self, handle: AnyHandler, cfg: CoreConfig, url: str, name: str,
                 worker_name: str = "", cache: KeyCache | str | None = "built-in", *,
                 features: Sequence[type[Feature]] = (), client: Any = None,
                 slots: asyncio.Semaphore | None = None,
                 convert: Callable[[Any], Any] | None = None, link: Link | None = None,
                 codec: Codec | None = None, extras: Mapping[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.name = name
        # a partitioned worker's consumers share one client, one pool of handler slots and
        # one `Link` (what they know of Redis being up)
        self.own_client = client is None
        self.redis: Any = connection.async_client(url) if client is None else client
        self.server = redact_url(url)  #: the server, as "worker started" names it
        self.ctx = ctx = context.build(cfg, self.redis, name, worker_name or name, cache)
        self.scripts, self.leases, self.tally = ctx.scripts, ctx.leases, ctx.tally
        self.gate = Gate()
        queue = RunQueue(self.gate)
        self.holdings = h = Holdings(ctx, queue)
        self.sup = Supervisor(self._recreate_group, self._distrust_cache, link=link,
                              explain=acl.explainer(url, cfg.stream),
                              stream=cfg.stream, group=cfg.group, consumer=name)
        self.starts: Starts  # set below, once the features are built (they may hold it)
        parts = Parts(ctx, h, self.gate, self.admit, self._queue, self, self.sup.link,
                      dict(extras or {}), codec, url)
        built = [f for kind in features if (f := kind.build(parts)) is not None]
        self.hooks = hooks = Hooks(built)
        h.on_leave = hooks.leave
        # starts are committed ahead only where a committed job cannot wait: not for a
        # batch handler's calls, nor for handler slots shared with other consumers
        self.starts = Starts(ctx, h, queue, hooks,
                             ahead=per_call(handle, cfg.batch_max) == 1 and slots is None)
        # entries read are decoded (codec), converted (payload_type), skipped if known done
        self.arrival = Arrival(cfg, name, State.WAITING if self.leases.claims else State.QUEUED,
                               codec, convert, ctx.cache, hooks.sender(),
                               hooks.end_report_of())
        # work to come (max_held: all); a batch handler's call runs up to batch_max jobs
        self.capacity = cfg.concurrency * per_call(handle, cfg.batch_max) + cfg.batch_size
        self.outcomes = Outcomes(ctx, h, codec, hooks.done, hooks.before_done)
        h.let_go.redis_down = lambda: self.sup.link.down_lately(cfg.visibility_timeout)
        self.quorum = Quorum(ctx, h, self.gate, self.sup)  # its lock quorum's outages, if any
        h.fold = Fold(h.let_go.redis_down,
                      lambda deadline: self.sup.link.in_outage(deadline, cfg.visibility_timeout),
                      quiet=2 * cfg.visibility_timeout)
        self.joined = self.stopped = False
        self.tally.refresh()
        # one XREADGROUP reads the stream and the group's retry stream (both from ">")
        self._read_args = (cfg.stream, ctx.gkeys.retry, ">", ">")
        # its reply as Redis sent it: redis-py would build a dict per entry, not needed here
        self.redis.set_response_callback("XREADGROUP", lambda response, **options: response)
        self.claimer = Claimer(h.waiting, cfg.batch_size, self._lease)
        self.fill = Fill(h.room, min(cfg.batch_size, self.capacity) // 2)
        self.runner = make_runner(ctx, h, handle, starts=self.starts, hooks=hooks, slots=slots)

    def hold(self, d: Delivery, due: float) -> asyncio.Future[int]:
        """`seam.Holder`: put ``d`` back to wait for an in-place retry (`Starts.hold`)."""
        return self.starts.hold(d, due)

    def feature(self, kind: type[Feature]) -> Feature | None:
        """This consumer's feature of type ``kind``, if the options turned it on."""
        return self.hooks.find(kind)

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.sup.stopping

    @property
    def counts(self) -> Counter[str]:
        return self.tally.counts

    @property
    def link(self) -> Link:
        """What this consumer's loops know of Redis being up (shared when partitioned)."""
        return self.sup.link

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then drain and return; raise WorkerFailed if a
        loop met an error it cannot ride out (after draining)."""
        sup, ctx, h, hooks = self.sup, self.ctx, self.holdings, self.hooks
        sup.stop_event = stop
        try:
            flags = await sup.until_ok("start", lambda: scripts.supports_flags(self.redis))
            self.scripts.use_flags(flags)
            await sup.until_ok("start", self._join)
            self.joined = True
        except StoppedBeforeStart:
            await self._close()
            self.stopped = True
            log.info("worker stopped before it started (Redis did not answer)",
                     extra=ctx.fields())
            return
        except BaseException:
            await self._close()
            raise
        log.info("worker started", extra=ctx.fields(server=self.server))
        if self.tally.metering:
            telemetry.start_counting(self.cfg.stream, self.cfg.group)
        background = [
            sup.loop("reader", self._read_once),
            sup.loop("reclaimer", lambda: reclaim.reclaim_once(
                ctx, h, self.admit, lambda: sup.stopping or not self.quorum.up)),
            sup.loop("promoter", lambda: upkeep.promote_once(ctx)),
            sup.loop("upkeep", lambda: upkeep.upkeep_step(ctx)),
            sup.loop("gauges", lambda: gauges.gauges_step(ctx)),
            *(sup.loop(what, step) for f in hooks.features for what, step in f.loops()),
        ]
        runners = [sup.spawn("runner", self.runner.loop()) for _ in range(self.cfg.concurrency)]
        runners += [sup.loop("leaser", self.claimer.retry_once), *self.quorum.loops(sup)]
        if self.leases.claims:
            runners.append(sup.loop("claimer", self.claimer.claim_once))
        keepers = [sup.loop("flusher", self.outcomes.step),
                   *(sup.loop(what, step) for f in hooks.features for what, step in f.keepers())]
        if self.cfg.heartbeat:
            keepers.append(sup.loop("heartbeat", lambda: heartbeat.beat_once(ctx, h)))
        try:
            await stop.wait()
        finally:
            sup.stopping = True
            await cancel(background)
            left = await self._drain()
            await cancel(runners)
            await self.outcomes.final_flush(FINAL_FLUSH)
            await cancel(keepers)
            await self._close()
            self.stopped = True
            log.info("worker stopped", extra=ctx.fields(
                **{what: self.counts[what] for what in STOP_COUNTS}, left_pending=left))
        if sup.fatal is not None:
            raise sup.fatal

    async def _join(self) -> None:
        """Join the group (creating it where missing), then tell the features."""
        await ensure_group(self.ctx)
        for joined in self.hooks.join:
            await joined()

    async def _close(self) -> None:
        self.runner.calls.close()
        await self.starts.close()
        if self.own_client:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        with contextlib.suppress(Exception):
            await self.leases.close()

    def health(self) -> tuple[bool, bool]:
        """(alive, ready): alive = serving with every internal task running; ready = alive,
        the group joined, no Redis outage under way (from a failed call until a call made
        after it answers), and not draining."""
        alive = self.sup.alive() and not self.stopped
        return alive, alive and self.joined and not self.sup.failures and not self.stopping

    def _distrust_cache(self) -> None:
        """Redis failed or came back: completions we cached may not have survived it (a
        failover loses what the replica had not received; a restart without persistence
        loses everything), so forget them and let the job records decide again."""
        if self.ctx.cache is not None:
            self.ctx.cache.clear()

    async def _recreate_group(self) -> None:
        """The group or the stream is gone (the server came back empty, a FLUSHALL):
        create it again. Deliveries held meanwhile are reported by the heartbeat."""
        self._distrust_cache()
        self.tally.count("group_recreated")
        await self._join()

    async def _drain(self) -> int:
        """Let held deliveries finish within drain_timeout; return how many are left (the
        features first let go of what they would not start: ``on_stop``)."""
        h = self.holdings
        for stopping in self.hooks.stop:
            await stopping()
        deadline = time.monotonic() + self.cfg.drain_timeout
        while h.held() and time.monotonic() < deadline:
            h.empty.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(h.empty.wait(), deadline - time.monotonic())
        return h.held()

    # ---- reading and admission --------------------------------------------------------

    async def _read_once(self) -> bool:
        """Read the next batch and admit it; False (Redis not asked) when there is no room
        for more work, while the gate is closed, or while a reclaimed suspect runs alone."""
        cfg, h = self.cfg, self.holdings
        if not self.gate.open:  # no job may start: read nothing new (Redis not asked)
            return await self.gate.opened()
        held = h.held()
        # work to come (queued, running, waiting) is bounded by the capacity, and by what
        # the runners take at once when their handlers are quick (`Starts.read_ahead`);
        # outcomes being written are not work to come, so the next batch is read while
        # they are sent, but never more than twice the capacity in all
        capacity = self.capacity + self.starts.read_ahead(READ_AHEAD * cfg.batch_size)
        room = min(capacity - held + h.finishing, 2 * capacity - held)
        if room <= 0 or h.isolating:
            h.room.clear()
            await h.room.wait()
            return False
        if await self.fill.short(room):  # busy: let room for half a batch build up
            return False
        count = min(room, cfg.batch_size)
        reply: Any = None
        for read in self.hooks.reads:  # a feature reads several sources at once
            reply = await read(count)
            if reply is not None:
                break
        else:
            reply = await self.redis.execute_command(
                "XREADGROUP", "GROUP", cfg.group, self.name, "COUNT", count,
                "BLOCK", max(1, round(cfg.read_block * 1000)), "STREAMS", *self._read_args)
        # the reply as Redis sent it (see __init__): no dict per entry
        src_of = self.ctx.sources.src_of
        for stream, entries in (reply.items() if isinstance(reply, dict) else reply or ()):
            await uninterrupted(self.admit(entries, src_of(stream), None, defer=True))
        return True

    async def admit(self, entries: list[Entry], src: int,
                    deliveries: list[int] | None, *, defer: bool = False) -> None:
        """Decode, vet and lease a batch of deliveries from source ``src`` (the stream,
        the retry stream, or a feature's: sources.py), then queue what may run.
        ``deliveries``: each entry's delivery count (None: all first deliveries).
        ``defer`` (the reader): their leases are left to the claimer, so the next batch
        is read while claim.lua runs for this one."""
        h, vet, count = self.holdings, self.arrival.vet, self.tally.count
        inflight, loose = h.inflight, h.loose
        fresh: list[Delivery] = []
        for i, (entry_id, values) in enumerate(entries):
            key = ref(src, entry_id)
            if key in inflight or key in loose:
                continue
            got = vet(entry_id, values, src, 1 if deliveries is None else deliveries[i])
            if isinstance(got, Delivery):
                inflight[key] = got.msg._lease = got  # msg.lock_lost reads its deadline
                fresh.append(got)
            elif got is None:
                h.ack_known(entry_id, src)
            else:
                h.reject(entry_id, src, got)
                if got.counter:
                    count(got.counter, 1)
        if not fresh:
            return
        for admitted in self.hooks.admit:
            admitted(fresh)
        if not self.leases.claims:  # built QUEUED: they may run at once
            self._queue(fresh)
            count("consumed", len(fresh))
            return
        for d in fresh:
            h.waiting[d.ref] = d
        if defer:
            self.claimer.add(fresh)
        else:
            await self._lease(fresh)

    def _queue(self, ds: list[Delivery]) -> None:
        """Queue deliveries that may run, as the features route them."""
        for route in self.hooks.routes:
            ds = route(ds)
        if ds:
            self.holdings.queue.put_many(ds)

    async def _lease(self, batch: list[Delivery]) -> bool:
        """Take the leases of waiting deliveries and queue those that may run. Busy ones
        keep waiting (and being heartbeated): waiting behind a live duplicate or for a
        lock quorum is not a failed delivery. Returns whether Redis was asked."""
        batch = [d for d in batch if not d.leasing]  # admission and the leaser may overlap
        if not batch:
            return False
        for d in batch:
            d.leasing = True
        try:  # the start path takes them, committing some ahead (`Starts.take`)
            res = await self.starts.take(batch)
        finally:
            for d in batch:
                d.leasing = False
        now = time.monotonic()
        h, count = self.holdings, self.tally.count
        waiting, expired, queued = h.waiting, self.leases.expired, State.QUEUED
        ready: list[Delivery] = []
        for d, token in zip(batch, res, strict=True):
            if token > 0:
                waiting.pop(d.ref, None)
                d.msg.fencing_token = token
                if expired(d, now):
                    h.lose(d, "the lease expired before the handler started")
                d.state = queued  # queued below, with the others of the batch
                ready.append(d)
            elif token == Claim.BUSY:
                if not d.waiting_since:
                    d.waiting_since = now
                    count("lock_contended", 1)
                    log.info("job lease held elsewhere; claiming again shortly", extra=fields(
                        stream=self.cfg.stream, key=d.msg.key, entry_id=d.msg.id))
            else:  # acknowledged by claim.lua (done or cancelled), or not ours any more
                waiting.pop(d.ref, None)
                counter, outcome, left = GONE.get(token, ("not_ours", None, "lost"))
                count(counter, 1, outcome)
                if token == Claim.DUPLICATE:
                    h.remember_done(d.msg.key)
                h.forget(d, left)
        if ready:
            self._queue(ready)
            count("consumed", len(ready))
        return self.leases.claims  # a strategy that claims asks the stream's Redis first
