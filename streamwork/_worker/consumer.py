"""The delivery loop of one worker process: read -> admit -> run -> hand outcomes on.

Tasks, all on one event loop, each supervised (supervisor.py):

* reader    - XREADGROUP ``>`` in batches, never more than concurrency + batch_size
              deliveries held (waiting, queued, running, or finished and not yet written);
* leaser    - retries the lease of deliveries that wait (a live duplicate holds the job,
              the lock quorum is down, Redis refused): waiting never uses up an attempt;
* runners   - ``concurrency`` long-lived tasks that run handlers (no task per message),
              each bounded by the job's time limit;
* flusher   - writes outcomes in batches (outcomes.py);
* heartbeat - keeps held deliveries alive (heartbeat.py);
* reclaimer - takes over deliveries of dead consumers, one suspect at a time (reclaim.py);
* promoter, upkeep, gauges - housekeeping (upkeep.py).

Leases come from one strategy chosen at start (leases.py); every state change of a
delivery goes through a Lua script that first checks this consumer still owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any, Final

import redis.exceptions

from streamwork._redis import connection, scripts
from streamwork._redis.connection import reconnect_delay
from streamwork._redis.faults import Fault, classify
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import WORKER_LOGGER, describe, error_fields, fields
from streamwork._wire.codec import (
    ATTEMPTS_FIELD,
    BODY_FIELD,
    InvalidExt,
    decode_fields,
    parse_attempts,
)
from streamwork._wire.extensions import Codec
from streamwork._wire.keys import GroupKeys, StreamKeys
from streamwork._wire.message import Message, revoke
from streamwork._wire.partitions import check_recorded
from streamwork._wire.payloads import InvalidPayload
from streamwork._worker import leases
from streamwork._worker.config import WorkerConfig, parse_rate
from streamwork._worker.delivery import MAIN, RETRY, Delivery, Entry, Failure, RunQueue, State, ref
from streamwork._worker.done_cache import KeyCache, local_cache
from streamwork._worker.leases import Claim
from streamwork._worker.limits import Limits, hold_ms
from streamwork._worker.loops import heartbeat, reclaim, upkeep
from streamwork._worker.outcomes import Outcomes
from streamwork._worker.runner import Handler, Runner
from streamwork._worker.start import CANCELLED_QUEUED, Start, Starter
from streamwork._worker.supervisor import (
    Link,
    StoppedBeforeStart,
    Supervisor,
    cancel,
    uninterrupted,
)
from streamwork.errors import DecodeError

log = logging.getLogger(WORKER_LOGGER)

WAIT_RETRY: Final = 0.2  #: s before a waiting delivery's lease is tried again (first time)
WAIT_RETRY_MAX: Final = 2.0  #: s, cap of that pause while nothing gets leased
FINAL_FLUSH: Final = 2.0  #: s a stopping worker keeps trying to write its last outcomes
#: the outcome counters the "worker stopped" line reports, each on its own
STOP_COUNTS: Final = ("acked", "retried", "dead_lettered", "deduplicated", "cancelled")



def max_held(concurrency: int, batch_size: int) -> int:
    """Most deliveries one worker process holds at once: concurrency + batch_size running,
    queued or waiting, and as many again whose outcomes are being written."""
    return 2 * (concurrency + batch_size)


def _raw_reply(client: Any, command: str) -> None:
    """Have ``client`` (the consumer's own) return ``command``'s reply as Redis sent it:
    redis-py would build a dict per stream entry, which the consumer does not need."""
    client.set_response_callback(command, lambda response, **options: response)


def consumer_name() -> str:
    """A unique consumer name: host-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Consumer:
    """Runs one handler against a stream's consumer group until stopped."""

    def __init__(self, handle: Handler, cfg: WorkerConfig, url: str, name: str,
                 worker_name: str = "", cache: KeyCache | str | None = "built-in", *,
                 client: Any = None, slots: asyncio.Semaphore | None = None,
                 convert: Callable[[Any], Any] | None = None,
                 key_of: Callable[[Message], str] | None = None,
                 limit_keys: GroupKeys | None = None, link: Link | None = None,
                 codec: Codec | None = None) -> None:
        self.handle = handle
        self.cfg = cfg
        self.name = name
        self.worker_name = worker_name or name
        self.keys = StreamKeys.for_stream(cfg.stream)
        self.gkeys = self.keys.group(cfg.group)
        # a partitioned worker's consumers share one client, one pool of handler slots and
        # one `Link` (what they know of Redis being up)
        self.own_client = client is None
        self.redis: Any = connection.async_client(url) if client is None else client
        self.slots = slots
        self.convert = convert  # the worker's payload_type, as a converter
        self.codec = codec  # the worker's own ext types (payloads read, results written)
        # ordered mode: each order key's deliveries, in admission order; the head alone
        # may run, and those in ``gated`` are leased and wait only for their turn
        self.gate: dict[str, deque[Delivery]] = {}
        self.gated: set[bytes] = set()
        self.scripts = scripts.AsyncScripts(self.redis, flags=False)
        self.limits: Limits | None = None
        if cfg.rate_limit is not None or key_of is not None:
            self.limits = Limits(
                self.scripts.run, limit_keys or self.keys.group(cfg.group), name,
                None if cfg.rate_limit is None else parse_rate(cfg.rate_limit), key_of,
                cfg.concurrency_per_key, hold_ms(cfg.visibility_timeout))
        self.lease = leases.choose(self.scripts, self.gkeys, cfg, name,
                                   f"{name}:{secrets.token_hex(10)}")
        self.queue = RunQueue(eager=self.lease.claims)
        # with job records, a handler starts only once start.lua has checked its record
        self.starter: Starter | None = (
            Starter(self.scripts, self.gkeys, name, self.lease, cfg.visibility_ms, self.queue)
            if self.lease.claims else None)
        self.counts: Counter[str] = Counter()
        self.capacity = cfg.concurrency + cfg.batch_size  # work to come (max_held: all)
        self.inflight: dict[bytes, Delivery] = {}
        # entries whose outcome waits without a Delivery: ref -> (entry id, src)
        self.loose: dict[bytes, tuple[bytes, int]] = {}
        self.waiting: dict[bytes, Delivery] = {}  # need a lease before they can run
        self.outcomes = Outcomes(self, codec)
        self.cache: KeyCache | None = None
        if cfg.dedup:
            self.cache = (local_cache(None, cfg.local_cache_size, cfg.local_cache_ttl)
                          if isinstance(cache, str) else cache)
        self.sup = Supervisor(self._recreate_group, self._distrust_cache, link=link,
                              stream=cfg.stream, group=cfg.group, consumer=name)
        self.isolating = False  # a reclaimed suspect runs alone: no reading meanwhile
        self.joined = False
        self.stopped = False
        self.refresh_telemetry()
        # one XREADGROUP reads the stream and the group's retry stream (both from ">")
        self._read_args = (cfg.stream, self.gkeys.retry, ">", ">")
        _raw_reply(self.redis, "XREADGROUP")
        self._main = cfg.stream.encode()
        self._room = asyncio.Event()
        self._empty = asyncio.Event()
        self._wait_pause = WAIT_RETRY
        self.runner = Runner(self, handle)

    # ---- lifecycle -------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self.sup.stopping

    @property
    def link(self) -> Link:
        """What this consumer's loops know of Redis being up (shared when partitioned)."""
        return self.sup.link

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then drain and return; raise WorkerFailed if a
        loop met an error it cannot ride out (after draining)."""
        sup = self.sup
        sup.stop_event = stop
        try:
            flags = await sup.until_ok("start", lambda: scripts.supports_flags(self.redis))
            self.scripts.use_flags(flags)
            await sup.until_ok("start", self.ensure_group)
            if self.cfg.ordered:  # the partition is ours now: its pending jobs come first
                await sup.until_ok("start", self._take_over)
            self.joined = True
        except StoppedBeforeStart:
            await self._close()
            self.stopped = True
            log.info("worker stopped before it started (Redis did not answer)", extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
            return
        except BaseException:
            await self._close()
            raise
        log.info("worker started", extra=fields(
            stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
        if self.metering:
            telemetry.start_counting(self.cfg.stream, self.cfg.group)
        background = [
            sup.loop("reader", self._read_once),
            sup.loop("reclaimer", lambda: reclaim.reclaim_once(self)),
            sup.loop("promoter", lambda: upkeep.promote_once(self)),
            sup.loop("upkeep", lambda: upkeep.upkeep_step(self)),
            sup.loop("gauges", self._gauges_step),
        ]
        runners = [sup.spawn("runner", self.runner.loop()) for _ in range(self.cfg.concurrency)]
        runners.append(sup.loop("leaser", self._lease_waiting_once))
        keepers = [sup.loop("flusher", self.outcomes.step)]
        if self.limits is not None and self.limits.key_of is not None:
            keepers.append(sup.loop("limits", self._keep_holds))
        if self.cfg.heartbeat:
            keepers.append(sup.loop("heartbeat", lambda: heartbeat.beat_once(self)))
        try:
            await stop.wait()
        finally:
            sup.stopping = True
            await cancel(background)
            left = await self._drain()
            await cancel(runners)
            await self._final_flush()
            await cancel(keepers)
            await self._close()
            self.stopped = True
            log.info("worker stopped", extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                **{what: self.counts[what] for what in STOP_COUNTS}, left_pending=left))
        if sup.fatal is not None:
            raise sup.fatal

    async def _close(self) -> None:
        self.runner.close()
        if self.starter is not None:
            await self.starter.close()
        if self.own_client:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        with contextlib.suppress(Exception):
            await self.lease.close()

    def health(self) -> tuple[bool, bool]:
        """(alive, ready): alive = serving with every internal task running; ready = alive,
        the group joined, no Redis outage under way (from a failed call until a call made
        after it answers), and not draining."""
        alive = self.sup.alive() and not self.stopped
        return alive, alive and self.joined and not self.sup.failures and not self.stopping

    def refresh_telemetry(self) -> None:
        """Look again whether an OpenTelemetry SDK is installed: without one, skip spans
        and instruments entirely (they would be no-ops, but not free)."""
        self.tracing = telemetry.tracing_enabled()
        self.metering = telemetry.metrics_enabled()

    async def _gauges_step(self) -> bool:
        self.refresh_telemetry()
        return await upkeep.gauges_step(self, self.metering)

    def count(self, what: str, n: int = 1, outcome: str | None = None) -> None:
        """Bump a live counter and its OpenTelemetry twin."""
        self.counts[what] += n
        if not self.metering:
            return
        if what in telemetry.COUNTERS:
            telemetry.count(what, n, self.cfg.stream, self.cfg.group, outcome)
        elif what.startswith("lock_"):
            telemetry.count_lock(what[5:], n, self.cfg.stream, self.cfg.group)

    async def ensure_group(self) -> None:
        """Create the consumer group at id 0 (so earlier jobs are delivered) if missing, on
        the stream and on the group's own retry stream."""
        # a stream split into partitions is served by partitioned workers only
        check_recorded(self.cfg.stream, await self.redis.get(self.keys.partitions), 1, "worker")
        # what a cancel can do depends on it: without job records, nothing
        await self.redis.hset(self.gkeys.settings, "dedup", "1" if self.cfg.dedup else "0")
        for stream in (self.cfg.stream, self.gkeys.retry):
            try:
                await self.redis.xgroup_create(stream, self.cfg.group, id="0", mkstream=True)
            except redis.exceptions.ResponseError as exc:
                if not str(exc).startswith("BUSYGROUP"):
                    raise

    def _distrust_cache(self) -> None:
        """Redis failed or came back: completions we cached may not have survived it (a
        failover loses what the replica had not received; a restart without persistence
        loses everything), so forget them and let the job records decide again."""
        if self.cache is not None:
            self.cache.clear()

    async def _recreate_group(self) -> None:
        """The group or the stream is gone (the server came back empty, a FLUSHALL):
        create it again. Deliveries held meanwhile are reported by the heartbeat."""
        self._distrust_cache()
        self.count("group_recreated")
        await self.ensure_group()

    async def _drain(self) -> int:
        """Let held deliveries finish within drain_timeout; return how many are left.
        In ordered mode what has not started is let go at once, to the next owner."""
        if self.cfg.ordered:
            self.let_go_unstarted()
        deadline = time.monotonic() + self.cfg.drain_timeout
        while self.held() and time.monotonic() < deadline:
            self._empty.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._empty.wait(), deadline - time.monotonic())
        return self.held()

    async def _final_flush(self) -> None:
        """Send the outcomes the drain produced, riding out transient errors for a while."""
        deadline = time.monotonic() + FINAL_FLUSH
        while self.outcomes.pending() and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self.outcomes.flush(),
                                       max(deadline - time.monotonic(), 0.01))
            except asyncio.TimeoutError:
                return
            except Exception as exc:
                if classify(exc) is Fault.FATAL:
                    return
                await asyncio.sleep(min(reconnect_delay(1), max(deadline - time.monotonic(), 0)))

    # ---- what the background loops see (delivery.Holder) -------------------------------

    def held(self) -> int:
        """Deliveries this process holds (the PEL entries it owns)."""
        return len(self.inflight) + len(self.loose)

    def held_deliveries(self) -> Iterable[Delivery]:
        return self.inflight.values()

    def loose_ids(self) -> Iterable[tuple[bytes, int]]:
        return self.loose.values()

    def wake_reader(self) -> None:
        """Let a reader that waits for room (or for isolation to end) look again."""
        self._room.set()

    def remember_done(self, key: str) -> None:
        if self.cache is not None:
            self.cache.add(key)

    def release_loose(self, ref: bytes) -> None:
        self.loose.pop(ref, None)
        self._released()

    def forget(self, d: Delivery, outcome: str = "lost") -> None:
        """Drop a delivery from what this process holds, without touching Redis."""
        if self.gate:
            self._ungate(d)
        if d.span is not None:
            telemetry.end_span(d.span, outcome)
            d.span = None
        inflight = self.inflight
        key = d.ref
        if inflight.get(key) is d:
            del inflight[key]
            if d.state == State.FINISHING:
                self.outcomes.finishing -= 1
            self._room.set()
            if not inflight and not self.loose:
                self._empty.set()

    def forget_acked(self, ds: list[Delivery]) -> None:
        """`forget` for a batch whose outcomes Redis now has (the hot path: one pass)."""
        inflight, finishing = self.inflight, 0
        if self.gate:
            for d in ds:
                self._ungate(d)
        for d in ds:
            if d.span is not None:
                telemetry.end_span(d.span, "acked")
                d.span = None
            key = d.ref
            if inflight.get(key) is d:
                del inflight[key]
                if d.state == State.FINISHING:
                    finishing += 1
        self.outcomes.finishing -= finishing
        self._released()

    def _released(self) -> None:
        self._room.set()
        if not self.inflight and not self.loose:
            self._empty.set()

    def _drop(self, d: Delivery, outcome: str) -> bool:
        """Give up a delivery's outcome for good (its handler, if running, is told through
        ``msg.lock_lost``); one that waits or whose outcome waits leaves at once. Returns
        False if it was already dropped."""
        if d.dropped:
            return False
        d.dropped = True
        revoke(d.msg)
        if d.state == State.WAITING:
            self.waiting.pop(d.ref, None)
            self.forget(d, outcome)
        elif d.state == State.FINISHING and self.outcomes.discard(d):
            self.forget(d, outcome)
        return True

    def lose(self, d: Delivery, why: str, error: BaseException | None = None) -> None:
        """Mark a delivery's lease lost: its outcome will never be written by us. ``error``:
        the handler's exception, when the lease was found lost recording its failure."""
        if not self._drop(d, "lost"):
            return
        self.count("lock_lost", 1)
        failed = "" if error is None else f"; its handler had failed: {describe(error)}"
        log.error("lease lost: %s; the job will be completed elsewhere%s", why, failed,
                  extra=fields(
                      stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                      key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt,
                      **error_fields(error)))

    def vanish(self, d: Delivery, error: BaseException | None = None) -> None:
        """The server no longer knows a delivery we hold (it came back empty, or the group
        was deleted): say so loudly; its outcome cannot be recorded. ``error``: the
        handler's exception, when it was found recording its failure."""
        if not self._drop(d, "vanished"):
            return
        self.count("vanished", 1)
        failed = "" if error is None else f"; its handler had failed: {describe(error)}"
        log.error("job vanished from Redis while held (the server lost its data?); its "
                  "outcome cannot be recorded%s", failed, extra=fields(
                      stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                      key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt,
                      **error_fields(error)))

    # ---- reading and admission --------------------------------------------------------

    async def _read_once(self) -> bool:
        """Read the next batch and admit it; False (Redis not asked) when there is no room
        for more work, or while a reclaimed suspect runs alone."""
        cfg = self.cfg
        held = self.held()
        # work to come (queued, running, waiting) is bounded by the capacity; outcomes
        # being written are not work to come, so the next batch is read while they are
        # sent, but never more than twice the capacity in all
        room = min(self.capacity - held + self.outcomes.finishing, 2 * self.capacity - held)
        if room <= 0 or self.isolating:
            self._room.clear()
            await self._room.wait()
            return False
        reply = await self.redis.execute_command(
            "XREADGROUP", "GROUP", cfg.group, self.name, "COUNT", min(room, cfg.batch_size),
            "BLOCK", max(1, round(cfg.read_block * 1000)), "STREAMS", *self._read_args)
        # the reply as Redis sent it (see _raw_reply): no dict per entry
        for stream, entries in (reply.items() if isinstance(reply, dict) else reply or ()):
            src = MAIN if stream == self._main else RETRY
            await uninterrupted(self.admit(entries, src, None))
        return True

    async def admit(self, entries: list[Entry], src: int,
                    deliveries: list[int] | None) -> None:
        """Decode, vet and lease a batch of deliveries from the stream (``src`` MAIN) or the
        group's retry stream (RETRY), then queue what may run. ``deliveries``: each entry's
        delivery count (None: all first deliveries)."""
        cfg = self.cfg
        inflight, loose, cache, convert = self.inflight, self.loose, self.cache, self.convert
        codec = self.codec
        max_payload, max_deliveries = cfg.max_payload_bytes, cfg.max_deliveries
        stream, group, consumer, timeout = cfg.stream, cfg.group, self.name, cfg.timeout
        retry = src != MAIN
        fresh: list[Delivery] = []
        claims = self.lease.claims  # a lease must be taken first: they start WAITING
        initial = State.WAITING if claims else State.QUEUED
        for i, (entry_id, values) in enumerate(entries):
            key = b"r" + entry_id if retry else entry_id  # ref(src, entry_id)
            if key in inflight or key in loose:
                continue
            count = 1 if deliveries is None else deliveries[i]
            if values is None:
                self._dead_on_arrival(entry_id, src, count, "deleted_while_pending", "",
                                      "the entry was deleted from the stream while pending")
                continue
            body: bytes | None
            used: bytes | None
            if len(values) == 2 and values[0] == BODY_FIELD:  # what producers write
                body, used = values[1], None
            else:
                found = dict(zip(values[::2], values[1::2], strict=False))
                body, used = found.get(BODY_FIELD), found.get(ATTEMPTS_FIELD)
            try:
                job_key, enqueued_ms, headers, payload, limit_ms = decode_fields(
                    body, max_payload, codec)
            except InvalidExt as exc:  # an ext value (a codec's type) did not decode
                assert body is not None
                self._dead_on_arrival(entry_id, src, parse_attempts(used) + count,
                                      "payload:invalid", "InvalidPayload", exc.detail,
                                      exc.key, body)
                self.count("invalid_payload", 1)
                continue
            except DecodeError as exc:  # logged once dead-lettered (see Outcomes)
                self._dead_on_arrival(entry_id, src, count, exc.reason, "DecodeError",
                                      exc.detail)
                self.count("undecodable", 1)
                continue
            assert body is not None
            attempt = parse_attempts(used) + count if used else count
            if attempt > max_deliveries:
                self._dead_on_arrival(
                    entry_id, src, attempt - 1, "max_deliveries", "DeliveryLimit",
                    f"delivered {attempt} times, over max_deliveries={max_deliveries}; the "
                    "process handling it died or stalled each time", job_key, body)
                continue
            if cache is not None and job_key in cache:
                loose[key] = (entry_id, src)
                self.outcomes.add_ack(entry_id, src)
                continue
            if convert is not None:
                try:
                    payload = convert(payload)
                except InvalidPayload as exc:  # logged once dead-lettered (see Outcomes)
                    self._dead_on_arrival(entry_id, src, attempt, "payload:invalid",
                                          "InvalidPayload", str(exc), job_key, body)
                    self.count("invalid_payload", 1)
                    continue
            msg = Message(entry_id.decode(), stream, job_key, payload, attempt,
                          enqueued_ms / 1000, headers, None, group, consumer)
            d = Delivery(entry_id, src, msg, body,
                         timeout if limit_ms is None else limit_ms / 1000, key, "", 0.0,
                         initial)
            inflight[key] = d
            fresh.append(d)
        if not fresh:
            return
        if cfg.ordered:
            gate = self.gate
            for d in fresh:
                gate.setdefault(d.msg.order_key, deque()).append(d)
        if not claims:  # built QUEUED: they may run at once
            self._enqueue(fresh)
            self.count("consumed", len(fresh))
            return
        for d in fresh:
            self.waiting[d.ref] = d
        await self._lease(fresh)

    def _dead_on_arrival(self, entry_id: bytes, src: int, attempts: int, reason: str,
                         etype: str, detail: str, job_key: str = "", body: bytes = b"") -> None:
        """A delivery that will never run: straight to the dead letters (via the flusher)."""
        self.loose[ref(src, entry_id)] = (entry_id, src)
        self.outcomes.add_failure(Failure(None, entry_id, src, "d", 0, attempts, reason, etype,
                                          detail, job_key, body))

    async def _lease(self, batch: list[Delivery]) -> bool:
        """Take the leases of waiting deliveries and queue those that may run. Busy ones
        keep waiting (and being heartbeated): waiting behind a live duplicate or for a
        lock quorum is not a failed delivery. Returns whether Redis was asked."""
        batch = [d for d in batch if not d.leasing]  # admission and the leaser may overlap
        if not batch:
            return False
        for d in batch:
            d.leasing = True
        try:
            res = await self.lease.take(batch)
        finally:
            for d in batch:
                d.leasing = False
        now = time.monotonic()
        waiting, expired, queued = self.waiting, self.lease.expired, State.QUEUED
        ready: list[Delivery] = []
        for d, token in zip(batch, res, strict=True):
            if token > 0:
                waiting.pop(d.ref, None)
                d.msg.fencing_token = token
                if expired(d, now):
                    self.lose(d, "the lease expired before the handler started")
                d.state = queued  # queued below, with the others of the batch
                ready.append(d)
            elif token == Claim.BUSY:
                if not d.waiting_since:
                    d.waiting_since = now
                    self.count("lock_contended", 1)
                    log.info("job lease held elsewhere; claiming again shortly", extra=fields(
                        stream=self.cfg.stream, key=d.msg.key, entry_id=d.msg.id))
            else:
                self.waiting.pop(d.ref, None)
                if token == Claim.DUPLICATE:
                    self.count("deduplicated", 1, "duplicate")
                    self.remember_done(d.msg.key)
                    self.forget(d, "deduplicated")
                elif token == Claim.CANCELLED:
                    self.count("cancelled", 1, "queued")
                    self.forget(d, "cancelled")
                else:
                    self.count("not_ours", 1)
                    self.forget(d, "lost")
        if ready:
            self._enqueue(ready)
            self.count("consumed", len(ready))
        return self.lease.claims  # a strategy that claims asks the stream's Redis first

    def _enqueue(self, ds: list[Delivery]) -> None:
        """Queue deliveries that may run; in ordered mode only the head of each order key's
        line runs, the others wait in ``gated`` for their turn."""
        if not self.cfg.ordered:
            self.queue.put_many(ds)
            return
        run = []
        for d in ds:
            line = self.gate.get(d.msg.order_key)
            if line and line[0] is d:
                run.append(d)
            else:
                self.gated.add(d.ref)
        if run:
            self.queue.put_many(run)

    def _ungate(self, d: Delivery) -> None:
        """``d`` leaves (its outcome is written, or it was let go): the next delivery of
        its order key may run, once leased."""
        order_key = d.msg.order_key
        line = self.gate.get(order_key)
        if not line:
            return
        if line[0] is d:
            line.popleft()
            if line and line[0].ref in self.gated:
                self.gated.discard(line[0].ref)
                self.queue.put_many([line[0]])
        elif d in line:
            line.remove(d)
        self.gated.discard(d.ref)
        if not line:
            del self.gate[order_key]

    def cancel_running(self, d: Delivery) -> None:
        """The heartbeat found the job of a held delivery cancelled: tell its handler
        (``msg.cancelled``) and, with ``cancel_running``, cancel an async one."""
        if d.msg._cancelled:
            return
        d.msg._cancelled = True
        self.count("cancel_seen", 1)
        if d.task is not None and d.state == State.RUNNING and not d.cancelling:
            d.cancelling = True
            d.task.cancel()

    def cancelled_unstarted(self, d: Delivery) -> None:
        """start.lua found the job cancelled before its handler started: acknowledge the
        delivery without running it (the record already says cancelled). Once only: the
        heartbeat and a runner's start may both find it."""
        if d.state not in (State.QUEUED, State.WAITING) or d.dropped:
            return
        if d.state == State.WAITING:
            self.waiting.pop(d.ref, None)
        d.lease = ""  # the record is the cancel's now: fail.lua only acknowledges
        m = d.msg
        self.outcomes.add_failure(Failure(
            d, d.entry_id, d.src, "c", 0, m.attempt, CANCELLED_QUEUED, "JobCancelled",
            "the job was cancelled before its handler started", m.key, d.body))

    def _held_again(self, d: Delivery, fut: asyncio.Future[int]) -> None:
        """The answer of start.lua's hold for an in-place retry (see retry_in_place)."""
        if fut.cancelled() or fut.exception() is not None:
            return  # the record still says running; the retry's start checks it again
        if d.dropped or self.inflight.get(d.ref) is not d or d.state != State.QUEUED:
            return
        code = fut.result()
        if code == Start.CANCELLED:
            self.cancelled_unstarted(d)
        elif code == Start.VANISHED:
            self.vanish(d)
        elif code == Start.LOST:
            self.lose(d, "another worker took the job while it waited for its retry")

    def retry_in_place(self, d: Delivery, delay: float) -> None:
        """Ordered mode: a failed job is retried here, after ``delay``, still at the head
        of its order key's line (a retry through the retry stream would let the jobs
        behind it overtake it). It stays pending and heartbeated meanwhile."""
        self.count("retried", 1, "timeout" if d.timed_out else "error")
        m = d.msg
        d.msg = Message(m.id, m.stream, m.key, m.payload, m.attempt + 1, m.enqueued_at,
                        m.headers, m.fencing_token, m.group, m.consumer)
        d.timed_out = False
        d.result = None
        d.state = State.QUEUED
        if self.starter is not None:  # the record says it waits (and a cancel is seen now)
            self.starter.hold(d, delay).add_done_callback(
                lambda fut: self._held_again(d, fut))
        asyncio.get_running_loop().call_later(delay, self._retry_due, d)

    def requeue_later(self, d: Delivery, delay: float) -> None:
        """Queue ``d`` again after ``delay`` (it was over a limit: it waits, held)."""
        d.state = State.QUEUED
        asyncio.get_running_loop().call_later(delay, self._retry_due, d)

    async def _keep_holds(self) -> bool:
        await asyncio.sleep(self.cfg.heartbeat_interval)
        return self.limits is not None and await self.limits.keep_all()

    def _retry_due(self, d: Delivery) -> None:
        # one dropped meanwhile (its lease lost) is queued too: the runner that takes it
        # forgets it and gives back its key hold (left here, it filled the capacity for good)
        if self.inflight.get(d.ref) is d and d.state == State.QUEUED:
            self.queue.put_many([d])

    def let_go_unstarted(self) -> None:
        """Ordered mode, stopping or no longer the owner: deliveries that have not started
        (queued, gated, waiting, retrying later) are let go without touching Redis; they
        stay pending and the partition's next owner takes them over, in order."""
        for d in list(self.inflight.values()):
            if d.state in (State.QUEUED, State.WAITING):
                d.dropped = True
                self.waiting.pop(d.ref, None)
                self.forget(d, "released")

    async def _take_over(self) -> None:
        """Ordered mode, on becoming the partition's owner: claim every delivery still
        pending in the group on the stream (previous owners', whatever their idle time), in
        entry order, before reading new ones; so no job overtakes an older one of its key."""
        cursor: Any = b"0-0"
        while True:
            nxt, raw, deleted, counts = await self.scripts.run(scripts.reclaim(
                self.cfg.stream, self.keys.dead, self.cfg.group, self.name, 0, cursor,
                self.cfg.batch_size, self.worker_name))
            if deleted:
                self.count("deleted_while_pending", len(deleted))
            entries: list[Entry] = [(eid, list(flat) if flat else None) for eid, flat in raw]
            if entries:
                self.count("taken_over", len(entries))
                await self.admit(entries, MAIN, [int(n) for n in counts])
            if nxt in (b"0-0", "0-0"):
                return
            cursor = nxt

    async def _lease_waiting_once(self) -> bool:
        """Try again to lease deliveries that wait, pausing longer while nothing gets
        through (0.2 s doubling to 2 s). Returns whether Redis was asked."""
        await asyncio.sleep(self._wait_pause)
        if not self.waiting:
            self._wait_pause = WAIT_RETRY
            return False
        before = len(self.waiting)
        self._wait_pause = min(self._wait_pause * 2, WAIT_RETRY_MAX)
        reached = await uninterrupted(self._lease(list(self.waiting.values())))
        if len(self.waiting) < before:
            self._wait_pause = WAIT_RETRY
        return reached

    # ---- running handlers -------------------------------------------------------------
