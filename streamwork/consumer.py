"""The delivery loop of one worker process: read, admit, run, finish, in batches.

Tasks, all on one event loop:

* reader    - XREADGROUP ``>`` in batches, never more than concurrency + batch_size
              deliveries held (running, queued, or finished and not yet flushed);
* runners   - ``concurrency`` long-lived tasks that run handlers (no task per message);
* flusher   - sends finished deliveries to Redis in batches (complete.lua / fail.lua),
              flushing as soon as the previous flush returned, so latency stays low;
* heartbeat - keeps live deliveries' idle time and leases fresh (recovery.py);
* reclaimer - XAUTOCLAIM of deliveries idle past the visibility timeout (recovery.py);
* promoter  - moves due retries and delayed jobs back onto the stream (recovery.py);
* upkeep    - safe trimming and reaping of idle consumers (recovery.py).

Every state change of a delivery goes through a Lua script that first checks this
consumer still owns it, so a stale worker can never acknowledge a job it lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import secrets
import socket
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgpack
import redis.exceptions
from opentelemetry import trace

from . import connection, recovery, scripts, telemetry
from .codec import ATTEMPTS_FIELD, BODY_FIELD, decode_body, parse_attempts
from .config import WorkerConfig
from .dedup import RecentKeys
from .errors import DeadLetter, DecodeError, LockError, Retry
from .keys import StreamKeys
from .lock import AsyncHeldLock, AsyncRedlock
from .logs import fields
from .message import Message
from .retry import TRANSIENT, reconnect_delay, retry_delay_for

if TYPE_CHECKING:
    from .worker import StreamWorker

log = logging.getLogger(__name__)

TRACEBACK_LIMIT: Final = 2000  #: characters of traceback kept in a dead letter
REDLOCK_PARALLEL: Final = 16  #: Redlock acquire/extend/release calls in flight per worker
PARKED_RETRY: Final = 0.2  #: s between lease attempts for deliveries whose lease was busy
LEASE_MARGIN: Final = 0.01  #: fraction of the lease kept as clock-drift margin (plus 2 ms)

# results of claim.lua
_DUPLICATE, _BUSY, _NOT_OURS = -1, -2, -3

Entry = tuple[bytes, dict[bytes, bytes] | None]
T = TypeVar("T")


def max_held(concurrency: int, batch_size: int) -> int:
    """Most deliveries one worker process holds at once (running, queued or unflushed)."""
    return concurrency + batch_size


def consumer_name() -> str:
    """A unique consumer name: host-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(slots=True, eq=False)
class Delivery:
    """A delivery this process holds, from admission until Redis has its outcome."""

    entry_id: bytes
    msg: Message
    lease: str  # lease value "<owner>:<token>" when dedup is on, else ""
    deadline: float  # monotonic time after which the lease counts as lost
    started: float = 0.0  # monotonic time the handler began (0: still queued)
    finishing: bool = False  # outcome decided, waiting for the flusher
    parked_since: float = 0.0  # monotonic time its lease was first found busy
    held: AsyncHeldLock | None = None  # the Redlock lease, when leases come from lock_urls
    span: Any = None  # the delivery's OpenTelemetry span, ended when Redis has the outcome


@dataclass(slots=True)
class Failure:
    """A failed delivery on its way to fail.lua."""

    delivery: Delivery | None
    entry_id: bytes
    action: str  # "r" retry, "d" dead letter
    delay_ms: int
    attempts: int
    reason: str
    error_type: str
    detail: str
    lease_key: str
    error: BaseException | None = None


class Consumer:
    """Runs one StreamWorker against Redis until stopped; see the module docstring."""

    def __init__(self, worker: StreamWorker, cfg: WorkerConfig, url: str, name: str) -> None:
        self.worker = worker
        self.cfg = cfg
        self.url = url
        self.name = name
        self.keys = StreamKeys.for_stream(cfg.stream)
        self.redis: Any = connection.async_client(url)
        self.scripts = scripts.register(self.redis)
        self.counts: Counter[str] = Counter()
        self.capacity = max_held(cfg.concurrency, cfg.batch_size)
        self.inflight: dict[bytes, Delivery] = {}
        self.queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self.parked: list[Delivery] = []  # leases busy elsewhere: claim again shortly
        self.done_buf: list[Delivery] = []
        self.fail_buf: list[Failure] = []
        self.lease_owner = f"{name}:{secrets.token_hex(10)}"
        self.cache: RecentKeys | None = (
            RecentKeys(cfg.local_cache_size, cfg.local_cache_ttl)
            if cfg.dedup and cfg.local_cache_size and cfg.local_cache_ttl
            else None
        )
        # per-master timeout: a tenth of the lease (0.05 s to 1 s); the Redlock default of
        # 0.1 s is too tight for a worker releasing a whole batch at once on a busy host
        self.redlock = (
            AsyncRedlock(list(cfg.lock_urls), ttl=cfg.visibility_timeout,
                         node_timeout=max(0.05, min(1.0, cfg.visibility_timeout / 10)))
            if cfg.lock_urls else None
        )
        # at most this many Redlock operations at once, so a batch reuses pooled
        # connections instead of opening one per job to every master
        self._redlock_slots = asyncio.Semaphore(REDLOCK_PARALLEL)
        self.stopping = False
        self.refresh_telemetry()
        self._room = asyncio.Event()
        self._flush_needed = asyncio.Event()
        self._empty = asyncio.Event()
        self._failures = 0
        self._is_async = inspect.iscoroutinefunction(type(worker).handle)
        self._executor = (
            None
            if self._is_async
            else ThreadPoolExecutor(cfg.concurrency, thread_name_prefix=f"sw-{cfg.stream}")
        )

    # ---- lifecycle -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then drain and return."""
        await self._until_connected(self.ensure_group)
        log.info("worker started", extra=fields(
            stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
        background = [
            self._spawn(self._read_loop(), "reader"),
            self._spawn(recovery.reclaim_loop(self), "reclaimer"),
            self._spawn(recovery.promote_loop(self), "promoter"),
            self._spawn(recovery.upkeep_loop(self), "upkeep"),
            self._spawn(self._parked_loop(), "parked"),
            self._spawn(recovery.gauge_loop(self), "gauges"),
        ]
        runners = [self._spawn(self._run_loop(), "runner") for _ in range(self.cfg.concurrency)]
        keepers = [self._spawn(self._flush_loop(), "flusher")]
        if self.cfg.heartbeat:
            keepers.append(self._spawn(recovery.heartbeat_loop(self), "heartbeat"))
        try:
            await stop.wait()
        finally:
            self.stopping = True
            await _cancel(background)
            left = await self._drain()
            await _cancel(runners)
            await self._final_flush()
            await _cancel(keepers)
            if self._executor:
                self._executor.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(Exception):
                await self.redis.aclose()
            if self.redlock:
                with contextlib.suppress(Exception):
                    await self.redlock.aclose()
            log.info("worker stopped", extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                count=sum(self.counts.values()), outcome=f"left pending: {left}"))

    def refresh_telemetry(self) -> None:
        """Look again whether an OpenTelemetry SDK is installed: without one, skip spans
        and instruments entirely (they would be no-ops, but not free)."""
        self.tracing = telemetry.tracing_enabled()
        self.metering = telemetry.metrics_enabled()

    def count(self, what: str, n: int = 1) -> None:
        """Bump a live counter and its OpenTelemetry twin."""
        self.counts[what] += n
        if not self.metering:
            return
        if what in telemetry.COUNTERS:
            telemetry.count(what, n, self.cfg.stream, self.cfg.group)
        elif what.startswith("lock_"):
            telemetry.count_lock(what[5:], n, self.cfg.stream, self.cfg.group)

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"streamwork-{what}")
        task.add_done_callback(self._crashed)
        return task

    def _crashed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("internal task %s failed", task.get_name(), exc_info=task.exception())

    async def _drain(self) -> int:
        """Let held deliveries finish within drain_timeout; return how many are left."""
        deadline = time.monotonic() + self.cfg.drain_timeout
        while self.inflight and time.monotonic() < deadline:
            self._empty.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._empty.wait(), deadline - time.monotonic())
        return len(self.inflight)

    async def _final_flush(self) -> None:
        """Send the outcomes the drain produced, retrying transport errors for a while."""
        deadline = time.monotonic() + max(self.cfg.drain_timeout, 1.0)
        while (self.done_buf or self.fail_buf) and time.monotonic() < deadline:
            try:
                await self._flush_once()
            except TRANSIENT as exc:
                await self.transport_failed(exc)

    async def ensure_group(self) -> None:
        """Create the consumer group at id 0 (so earlier jobs are delivered) if missing."""
        try:
            await self.redis.xgroup_create(self.cfg.stream, self.cfg.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise

    async def _until_connected(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        while True:
            try:
                result = await fn()
            except TRANSIENT as exc:
                await self.transport_failed(exc)
            else:
                self.transport_ok()
                return result

    async def transport_failed(self, exc: BaseException) -> None:
        """Note a transport error and sleep the reconnect backoff."""
        self._failures += 1
        if self._failures == 1:
            log.warning("redis unreachable, retrying with backoff: %s", exc, extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
        await asyncio.sleep(reconnect_delay(self._failures))

    def transport_ok(self) -> None:
        if self._failures:
            log.warning("redis reachable again after %d failed calls", self._failures,
                        extra=fields(stream=self.cfg.stream, consumer=self.name))
            self._failures = 0

    # ---- reading and admission --------------------------------------------------------

    async def _read_loop(self) -> None:
        cfg = self.cfg
        block_ms = max(1, round(cfg.read_block * 1000))
        streams = {cfg.stream: ">"}
        while not self.stopping:
            room = self.capacity - len(self.inflight)
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            sent = time.monotonic()
            try:
                reply = await self.redis.xreadgroup(
                    cfg.group, self.name, streams, count=min(room, cfg.batch_size), block=block_ms
                )
            except redis.exceptions.ResponseError as exc:
                if not str(exc).startswith("NOGROUP"):
                    raise
                log.warning("consumer group missing (server restarted empty?); recreating it",
                            extra=fields(stream=cfg.stream, group=cfg.group))
                await self._until_connected(self.ensure_group)
                continue
            except TRANSIENT as exc:
                await self.transport_failed(exc)
                continue
            self.transport_ok()
            if reply:
                entries = reply[0][1]
                try:
                    await _uninterrupted(self.admit(entries, [1] * len(entries), sent))
                except TRANSIENT as exc:  # they stay pending here; the reclaimer gets them
                    await self.transport_failed(exc)

    async def admit(self, entries: list[Entry], deliveries: list[int], sent: float) -> None:
        """Decode, vet and (with dedup) lease a batch of new deliveries, then queue them."""
        cfg, keys = self.cfg, self.keys
        dead: list[Failure] = []
        duplicates: list[bytes] = []
        fresh: list[Delivery] = []
        deadline = sent + cfg.visibility_timeout * (1 - LEASE_MARGIN) - 0.002
        for (entry_id, values), count in zip(entries, deliveries, strict=True):
            if entry_id in self.inflight:
                continue
            eid = entry_id.decode()
            if values is None:
                dead.append(self._dead(entry_id, count, "deleted_while_pending", "", ""))
                continue
            try:
                env = decode_body(values.get(BODY_FIELD), cfg.max_payload_bytes)
            except DecodeError as exc:
                log.warning("undecodable entry moved to dead letters", extra=fields(
                    stream=cfg.stream, group=cfg.group, entry_id=eid, reason=exc.reason))
                dead.append(self._dead(entry_id, count, exc.reason, "DecodeError", exc.detail))
                self.count("undecodable", 1)
                continue
            attempt = parse_attempts(values.get(ATTEMPTS_FIELD)) + count
            if attempt > cfg.max_deliveries:
                dead.append(self._dead(
                    entry_id, attempt - 1, "max_deliveries", "DeliveryLimit",
                    f"delivered {attempt} times, over max_deliveries={cfg.max_deliveries}; the "
                    "process handling it died or stalled each time", keys.lock(env.key)))
                continue
            if self.cache is not None and env.key in self.cache:
                duplicates.append(entry_id)
                continue
            msg = Message(
                id=eid, stream=cfg.stream, key=env.key, payload=env.payload, attempt=attempt,
                enqueued_at=env.enqueued_ms / 1000, headers=env.headers,
                group=cfg.group, consumer=self.name,
            )
            fresh.append(Delivery(entry_id, msg, "", deadline))
        if dead:
            await self.send_failures(dead)
        if duplicates:
            await self._ack_duplicates(duplicates)
        if fresh and cfg.dedup:
            fresh = await self._lease(fresh)
        self._enqueue(fresh)

    def _enqueue(self, runnable: list[Delivery]) -> None:
        for d in runnable:
            self.inflight[d.entry_id] = d
            self.queue.put_nowait(d)
        self.count("consumed", len(runnable))

    def _dead(
        self, entry_id: bytes, attempts: int, reason: str, etype: str, detail: str,
        lease_key: str | None = None,
    ) -> Failure:
        return Failure(None, entry_id, "d", 0, attempts, reason, etype, detail,
                       lease_key or self.keys.lock_prefix)

    async def _ack_duplicates(self, entry_ids: list[bytes]) -> None:
        """Acknowledge deliveries the local cache knows are done (ownership-checked)."""
        res = await self.scripts.complete(keys=[self.keys.stream], args=[
            self.cfg.group, self.name, "0", 0, "", "", "", _pack([entry_ids])])
        self.count("deduplicated", sum(1 for r in res if r == 1))

    async def _claim(self, batch: list[Delivery], ttl_ms: int) -> list[int]:
        """claim.lua for a batch (``ttl_ms`` 0: only check done-markers and ownership)."""
        keys = self.keys
        return list(await self.scripts.claim(keys=[keys.stream, keys.fence], args=[
            self.cfg.group, self.name, ttl_ms, self.lease_owner, keys.done_prefix,
            keys.lock_prefix,
            _pack([[d.entry_id for d in batch], [d.msg.key for d in batch]])]))

    async def _lease(self, fresh: list[Delivery]) -> list[Delivery]:
        """claim.lua for a batch: skip done jobs, take leases and fencing tokens."""
        res = await self._claim(fresh, 0 if self.redlock else self.cfg.visibility_ms)
        if self.redlock:
            res = await self._lease_from_redlock(fresh, res)
        runnable = []
        for d, token in zip(fresh, res, strict=True):
            if token > 0:
                d.lease = f"{self.lease_owner}:{token}"
                if d.held is not None and d.held.valid_for <= 0:
                    self.lose(d, "the Redlock lease expired before the handler started")
                d.msg.fencing_token = token
                runnable.append(d)
            elif token == _DUPLICATE:
                self.count("deduplicated", 1)
                if self.cache is not None:
                    self.cache.add(d.msg.key)
            elif token == _BUSY:
                if not d.parked_since:
                    d.parked_since = time.monotonic()
                    self.count("lock_contended", 1)
                    log.info("job lease held elsewhere; claiming again shortly", extra=fields(
                        stream=self.cfg.stream, key=d.msg.key, entry_id=d.msg.id))
                self.parked.append(d)
            else:
                self.count("not_ours", 1)
        return runnable

    async def _lease_from_redlock(self, fresh: list[Delivery], res: list[int]) -> list[int]:
        """Take the job leases from the Redlock masters, all at once; returns claim codes.

        The done-check ran before the lease was taken, so it runs again once the lease is
        held (double-checked): a copy that waited for the first holder to finish and
        release must see that holder's done-marker, not run the job again."""
        assert self.redlock is not None
        go = [i for i, code in enumerate(res) if code == 0]
        started = time.monotonic()
        redlock = self.redlock
        results = await asyncio.gather(
            *(self.bounded(redlock.acquire(f"{self.cfg.stream}:{fresh[i].msg.key}"))
              for i in go),
            return_exceptions=True)
        out = list(res)
        granted = []
        for i, held in zip(go, results, strict=True):
            if isinstance(held, AsyncHeldLock):
                fresh[i].held = held
                fresh[i].deadline = started + held.valid_for
                out[i] = held.fencing_token
                granted.append(i)
            elif isinstance(held, (LockError, *TRANSIENT)):
                out[i] = _BUSY
            else:
                raise held
        if granted:
            again = await self._claim([fresh[i] for i in granted], 0)
            late = [fresh[i] for i, code in zip(granted, again, strict=True) if code != 0]
            for i, code in zip(granted, again, strict=True):
                if code != 0:
                    out[i] = code
            await self.release_held(late)
        return out

    async def release_held(self, ds: list[Delivery]) -> None:
        """Release the Redlock leases of finished or lost deliveries (compare-and-delete)."""
        held = [d.held for d in ds if d.held is not None]
        for d in ds:
            d.held = None
        if held:  # shielded: a stopping worker must not leave leases behind half-released
            await asyncio.shield(asyncio.gather(
                *(self.bounded(h.release()) for h in held), return_exceptions=True))

    async def bounded(self, op: Awaitable[T]) -> T:
        """Run one Redlock operation within the worker's limit of parallel ones."""
        async with self._redlock_slots:
            return await op

    async def _parked_loop(self) -> None:
        """Re-try the lease of deliveries whose job was running elsewhere (a duplicate
        enqueue): usually the other holder finishes and this one is acked as a duplicate.
        After half a visibility timeout they are left pending for the reclaimer."""
        give_up = self.cfg.visibility_timeout / 2
        while True:
            await asyncio.sleep(PARKED_RETRY)
            if not self.parked or self.stopping:
                continue
            now = time.monotonic()
            parked, self.parked = self.parked, []
            keep = [d for d in parked if now - d.parked_since < give_up]
            try:
                await _uninterrupted(self._lease_and_enqueue(keep))
            except TRANSIENT as exc:
                self.parked.extend(keep)
                await self.transport_failed(exc)

    async def _lease_and_enqueue(self, batch: list[Delivery]) -> None:
        self._enqueue(await self._lease(batch))

    # ---- running handlers -------------------------------------------------------------

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        handle: Any = self.worker.handle  # async, or plain def run in the pool
        cfg = self.cfg
        debug = log.isEnabledFor(logging.DEBUG)
        while True:
            d = await self.queue.get()
            msg = d.msg
            if msg.lock_lost:
                self._forget(d)
                continue
            d.started = time.monotonic()
            if self.tracing:
                d.span = telemetry.consumer_span(
                    cfg.stream, cfg.group, msg.id, msg.attempt, msg.key, msg.headers)
            if debug:
                log.debug("job started", extra=fields(
                    stream=cfg.stream, group=cfg.group, consumer=self.name, key=msg.key,
                    entry_id=msg.id, attempt=msg.attempt))
            try:
                if d.span is None:
                    if self._is_async:
                        await handle(msg)
                    else:
                        await loop.run_in_executor(self._executor, handle, msg)
                else:
                    with trace.use_span(d.span, end_on_exit=False):
                        if self._is_async:
                            await handle(msg)
                        else:
                            ctx = contextvars.copy_context()
                            await loop.run_in_executor(self._executor, ctx.run, handle, msg)
            except asyncio.CancelledError:
                telemetry.end_span(d.span, "cancelled")
                self._forget(d)
                raise
            except Exception as exc:
                self._finished(d, "failed", debug)
                self._failed(d, exc)
            else:
                self._finished(d, "ok", debug)
                self._succeeded(d)

    def _finished(self, d: Delivery, result: str, debug: bool) -> None:
        if not (self.metering or debug):
            return
        took = time.monotonic() - d.started
        if self.metering:
            telemetry.record_duration(took, self.cfg.stream, self.cfg.group, result)
        if debug:
            log.debug("job finished", extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt,
                duration_ms=round(took * 1000, 2), outcome=result))

    def _succeeded(self, d: Delivery) -> None:
        if d.msg.lock_lost:
            self._forget(d)
            return
        d.finishing = True
        self.done_buf.append(d)
        self._flush_needed.set()

    def _failed(self, d: Delivery, exc: Exception) -> None:
        if d.msg.lock_lost:
            self._forget(d)
            return
        cfg, msg = self.cfg, d.msg
        etype = type(exc).__name__
        detail = f"{exc}\n" + "".join(traceback.format_exception(exc))[-TRACEBACK_LIMIT:]
        if isinstance(exc, DeadLetter):
            action, reason, delay = "d", f"dead_letter: {exc.reason}", 0.0
        elif msg.attempt >= cfg.max_deliveries:
            action, reason, delay = "d", "max_deliveries", 0.0
        else:
            action, reason = "r", "retry"
            explicit = exc.delay if isinstance(exc, Retry) else None
            delay = explicit if explicit is not None else retry_delay_for(
                msg.attempt, cfg.retry_delay, cfg.retry_max_delay)
        log.warning("job failed: %s", "retrying" if action == "r" else "dead-lettered",
                    extra=fields(stream=cfg.stream, group=cfg.group, consumer=self.name,
                                 key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                                 error_type=etype, reason=reason,
                                 duration_ms=round((time.monotonic() - d.started) * 1000, 1)))
        d.finishing = True
        self.fail_buf.append(Failure(
            d, d.entry_id, action, round(delay * 1000), msg.attempt, reason, etype, detail,
            self.keys.lock(msg.key), exc))
        self._flush_needed.set()

    def _forget(self, d: Delivery, outcome: str = "lost") -> None:
        """Drop a delivery without touching Redis: it stays pending for another worker."""
        if d.span is not None:
            telemetry.end_span(d.span, outcome)
            d.span = None
        if self.inflight.get(d.entry_id) is d:
            del self.inflight[d.entry_id]
            self._released()

    def _released(self) -> None:
        self._room.set()
        if not self.inflight:
            self._empty.set()

    def lose(self, d: Delivery, why: str) -> None:
        """Mark a delivery's lease lost: its outcome will never be written by us."""
        if d.msg.lock_lost:
            return
        d.msg._lost = True
        self.count("lock_lost", 1)
        log.error("lease lost: %s; the job will be completed elsewhere", why, extra=fields(
            stream=self.cfg.stream, group=self.cfg.group, consumer=self.name, key=d.msg.key,
            entry_id=d.msg.id, attempt=d.msg.attempt))

    # ---- finishing --------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_needed.wait()
            self._flush_needed.clear()
            try:  # a stop lets a flush under way finish: its scripts already ran
                await _uninterrupted(self._flush_once())
            except TRANSIENT as exc:
                await self.transport_failed(exc)
                self._flush_needed.set()
            else:
                self.transport_ok()

    async def _flush_once(self) -> None:
        """Send what finished so far (complete.lua, fail.lua); on a transport error put it
        back for the next try and raise."""
        done, self.done_buf = self.done_buf, []
        failed, self.fail_buf = self.fail_buf, []
        try:
            if done:
                await self._send_done(done)
            if failed:
                await self.send_failures(failed)
        except TRANSIENT:
            self.done_buf[:0] = [d for d in done if d.entry_id in self.inflight]
            self.fail_buf[:0] = failed
            raise

    async def _send_done(self, done: list[Delivery]) -> None:
        live = []
        for d in done:
            if d.held is not None and d.held.valid_for <= 0:
                self.lose(d, "the Redlock lease expired before completion")
            if d.msg.lock_lost:
                self._forget(d)
            else:
                live.append(d)
        await self.release_held([d for d in done if d.msg.lock_lost])
        if not live:
            return
        cfg, keys = self.cfg, self.keys
        script_keys = [keys.stream]
        staged = _staged_ops(live, script_keys)
        mode = "0" if not cfg.dedup else "2" if self.redlock else "1"
        batch: list[list[Any]] = [[d.entry_id for d in live]]
        if cfg.dedup:
            batch += [[d.msg.key for d in live], [d.lease for d in live]]
        res = await self.scripts.complete(keys=script_keys, args=[
            cfg.group, self.name, mode, round(cfg.dedup_window * 1000), staged,
            keys.done_prefix, keys.lock_prefix, _pack(batch)])
        self.count("acked", sum(1 for ok in res if ok))
        for d, ok in zip(live, res, strict=True):
            if ok:
                if self.cache is not None:
                    self.cache.add(d.msg.key)
                if ok == 3:
                    self.count("deduplicated", 1)
                if ok == 2:
                    self.count("staged_rejected", 1)
                    log.error("a staged write was rejected by Redis; the others applied",
                              extra=fields(stream=cfg.stream, key=d.msg.key,
                                           entry_id=d.msg.id))
            else:
                self.lose(d, "not the owner at completion (reclaimed by another worker)")
            self._forget(d, "acked" if ok else "lost")
        await self.release_held(live)

    async def send_failures(self, failed: list[Failure]) -> None:
        """fail.lua for a batch: schedule retries or dead-letter, XACK, release leases."""
        keys = self.keys
        script_keys = [keys.stream, keys.delayed, keys.dead, *(f.lease_key for f in failed)]
        args: list[Any] = [self.cfg.group, self.name, self.worker.worker_name]
        for f in failed:
            lease = f.delivery.lease if f.delivery and not self.redlock else ""
            args += [f.entry_id, f.action, f.delay_ms, f.attempts, lease, f.reason,
                     f.error_type, f.detail]
        res = await self.scripts.fail(keys=script_keys, args=args)
        for f, r in zip(failed, res, strict=True):
            if r == 1:
                self.count("retried", 1)
            elif r == 2:
                self.count("dead_lettered", 1)
                log.error("job dead-lettered", extra=fields(
                    stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                    entry_id=f.entry_id.decode(), attempt=f.attempts, reason=f.reason,
                    error_type=f.error_type))
            elif f.delivery is not None:
                self.lose(f.delivery, "not the owner when recording a failure")
            if f.delivery is not None:
                outcome = {1: "retried", 2: "dead_lettered"}.get(r, "lost")
                if f.delivery.span is not None and f.error is not None:
                    f.delivery.span.record_exception(f.error)
                self._forget(f.delivery, outcome)
        await self.release_held([f.delivery for f in failed if f.delivery is not None])


def _staged_ops(live: list[Delivery], script_keys: list[str]) -> bytes:
    """Encode the staged writes of a batch for complete.lua; appends their keys."""
    ops: dict[int, list[list[Any]]] = {}
    for i, d in enumerate(live, start=1):
        for command, cmd_keys, cmd_args in d.msg.staged:
            index = []
            for key in cmd_keys:
                script_keys.append(key)
                index.append(len(script_keys))
            ops.setdefault(i, []).append([command, index, list(cmd_args)])
    return _pack(ops) if ops else b""


def _pack(value: Any) -> bytes:
    """MessagePack for Redis's Lua cmsgpack, which reads str but not bin: bytes go as str."""
    data: bytes = msgpack.packb(value, use_bin_type=False)
    return data


async def _uninterrupted(step: Awaitable[None]) -> None:
    """Run a step that changes state in Redis (acks, leases) to its end even if the caller
    is cancelled meanwhile, so its outcome is recorded here too; then let the cancellation
    through. Such steps are one or two script calls long."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end. A cancel that lands inside a redis-py
    read can surface as a timeout or connection error, which a loop treats as transient
    and survives; so cancel again until every task has really ended."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.2)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not warn about it
