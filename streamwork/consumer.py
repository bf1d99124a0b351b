"""The delivery loop of one worker process: read, admit, run, finish, in batches.

Tasks, all on one event loop, each a supervised loop (see `Consumer.ride_out`):

* reader    - XREADGROUP ``>`` in batches, never more than concurrency + batch_size
              deliveries held (waiting, queued, running, or finished and not yet flushed);
* leaser    - retries the lease of deliveries that wait (a live duplicate holds the job,
              the lock quorum is down, Redis refused): waiting never uses up an attempt;
* runners   - ``concurrency`` long-lived tasks that run handlers (no task per message),
              each bounded by the job's time limit;
* flusher   - sends finished deliveries to Redis in batches (complete.lua / fail.lua),
              flushing as soon as the previous flush returned, so latency stays low; an
              outcome that could not be written is kept and retried until it is;
* heartbeat - keeps held deliveries' idle time and leases fresh (recovery.py);
* reclaimer - takes over deliveries idle past the visibility timeout, one at a time and
              alone, so a job that kills its process costs only itself (recovery.py);
* promoter  - moves due retries and delayed jobs back onto the stream (recovery.py);
* upkeep    - safe trimming and reaping of idle consumers (recovery.py).

Every state change of a delivery goes through a Lua script that first checks this
consumer still owns it, so a stale worker can never acknowledge a job it lost. Every
error a loop meets is classified once (faults.py): transient ones are ridden out with
backoff, a vanished group is recreated, anything else stops the worker loudly.
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgpack
import redis.exceptions
from opentelemetry import trace

from . import connection, recovery, scripts, telemetry
from .codec import ATTEMPTS_FIELD, BODY_FIELD, decode_body, parse_attempts
from .config import WorkerConfig
from .dedup import RecentKeys
from .errors import DeadLetter, DecodeError, LockError, Retry, WorkerFailed
from .faults import Fault, classify
from .keys import StreamKeys
from .lock import AsyncHeldLock, AsyncRedlock
from .logs import fields
from .message import Message
from .pool import DaemonPool
from .retry import reconnect_delay, retry_delay_for

if TYPE_CHECKING:
    from .worker import StreamWorker

log = logging.getLogger(__name__)

TRACEBACK_LIMIT: Final = 2000  #: characters of traceback kept in a dead letter
REDLOCK_PARALLEL: Final = 16  #: Redlock acquire/extend/release calls in flight per worker
WAIT_RETRY: Final = 0.2  #: s before a waiting delivery's lease is tried again (first time)
WAIT_RETRY_MAX: Final = 2.0  #: s, cap of that pause while nothing gets leased
LEASE_MARGIN: Final = 0.01  #: fraction of the lease kept as clock-drift margin (plus 2 ms)
FLUSH_CHUNK: Final = 500  #: outcomes per script call (keeps one call around a millisecond)
FINAL_FLUSH: Final = 2.0  #: s a stopping worker keeps trying to write its last outcomes

# results of claim.lua
_DUPLICATE, _BUSY, _NOT_OURS = -1, -2, -3
# results of complete.lua / fail.lua / heartbeat.lua
_LOST, _VANISHED = 0, 4

# states of a held delivery
WAITING, QUEUED, RUNNING, FINISHING = 0, 1, 2, 3

Entry = tuple[bytes, dict[bytes, bytes] | None]
T = TypeVar("T")


def max_held(concurrency: int, batch_size: int) -> int:
    """Most deliveries one worker process holds at once (running, queued or unflushed)."""
    return concurrency + batch_size


def lease_deadline(sent: float, ttl: float) -> float:
    """Monotonic time until which a lease of ``ttl`` s requested at ``sent`` is safe to
    rely on: the TTL minus a clock-drift margin (1 % + 2 ms), counted from the request."""
    return sent + ttl * (1 - LEASE_MARGIN) - 0.002


def consumer_name() -> str:
    """A unique consumer name: host-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def redlock_resource(stream: str, key: str) -> str:
    """Name of the Redlock resource for job ``key`` of ``stream``: a digest, so that any
    job key the producer accepts (spaces, braces, any length) and any stream name work."""
    import hashlib

    digest = hashlib.sha256(msgpack.packb([stream, key], use_bin_type=True)).hexdigest()
    return f"streamwork-{digest[:40]}"


@dataclass(slots=True, eq=False)
class Delivery:
    """A delivery this process holds, from admission until Redis has its outcome."""

    entry_id: bytes
    msg: Message
    body: bytes  # the raw body: kept to adopt an entry deleted while pending
    limit: float | None  # the job's time limit, s
    lease: str = ""  # lease value "<owner>:<token>" when dedup is on, else ""
    deadline: float = 0.0  # monotonic time after which the lease counts as lost
    state: int = WAITING
    started: float = 0.0  # monotonic time the handler began
    waiting_since: float = 0.0  # monotonic time its lease was first found busy
    member: bytes = b""  # adopted (entry deleted while pending): its delayed-ZSET member
    dropped: bool = False  # its outcome must not be written (lease lost, vanished)
    leasing: bool = False  # a claim for it is under way (admission or the leaser)
    timed_out: bool = False
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
    job_key: str = ""
    body: bytes = b""
    error: BaseException | None = None


class Consumer:
    """Runs one StreamWorker against Redis until stopped; see the module docstring."""

    def __init__(self, worker: StreamWorker, cfg: WorkerConfig, url: str, name: str) -> None:
        self.worker = worker
        self.cfg = cfg
        self.name = name
        self.keys = StreamKeys.for_stream(cfg.stream)
        self.redis: Any = connection.async_client(url)
        self.scripts = scripts.register(self.redis)
        self.counts: Counter[str] = Counter()
        self.capacity = max_held(cfg.concurrency, cfg.batch_size)
        self.inflight: dict[bytes, Delivery] = {}
        self.loose: set[bytes] = set()  # entries whose outcome waits without a Delivery
        self.queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self.waiting: dict[bytes, Delivery] = {}  # need a lease before they can run
        self.done_buf: list[Delivery] = []
        self.fail_buf: list[Failure] = []
        self.ack_buf: list[bytes] = []  # duplicates the local cache knows are done
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
        self.isolating = False  # a reclaimed suspect runs alone: no reading meanwhile
        self.joined = False
        self.stopped = False
        self.fatal: WorkerFailed | None = None
        self.tasks: dict[asyncio.Task[None], str] = {}
        self.dead_tasks: list[str] = []
        self.refresh_telemetry()
        self._stop: asyncio.Event | None = None
        self._room = asyncio.Event()
        self._flush_needed = asyncio.Event()
        self._empty = asyncio.Event()
        self._failures = 0
        self._wait_pause = WAIT_RETRY
        self._is_async = inspect.iscoroutinefunction(type(worker).handle)
        self._pool = (
            None if self._is_async else DaemonPool(cfg.concurrency, f"sw-{cfg.stream}")
        )

    # ---- lifecycle -------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then drain and return; raise WorkerFailed if a
        loop met an error it cannot ride out (after draining)."""
        self._stop = stop
        try:
            flags = await self._until_ok("start", lambda: scripts.supports_flags(self.redis))
            self.scripts = scripts.register(self.redis, flags=flags)
            await self._until_ok("start", self.ensure_group)
            self.joined = True
        except BaseException:
            await self._close()
            raise
        log.info("worker started", extra=fields(
            stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
        background = [
            self._loop("reader", self._read_once),
            self._loop("reclaimer", lambda: recovery.reclaim_once(self)),
            self._loop("promoter", lambda: recovery.promote_once(self)),
            self._loop("upkeep", lambda: recovery.upkeep_step(self)),
            self._loop("gauges", lambda: recovery.gauges_step(self)),
        ]
        runners = [self._spawn("runner", self._run_loop())
                   for _ in range(self.cfg.concurrency)]
        runners.append(self._loop("leaser", self._lease_waiting_once))
        keepers = [self._loop("flusher", self._flush_step)]
        if self.cfg.heartbeat:
            keepers.append(self._loop("heartbeat", lambda: recovery.heartbeat_once(self)))
        try:
            await stop.wait()
        finally:
            self.stopping = True
            await _cancel(background)
            left = await self._drain()
            await _cancel(runners)
            await self._final_flush()
            await _cancel(keepers)
            await self._close()
            self.stopped = True
            log.info("worker stopped", extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                count=sum(self.counts.values()), outcome=f"left pending: {left}"))
        if self.fatal is not None:
            raise self.fatal

    async def _close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        with contextlib.suppress(Exception):
            await self.redis.aclose()
        if self.redlock:
            with contextlib.suppress(Exception):
                await self.redlock.aclose()

    def health(self) -> tuple[bool, bool]:
        """(alive, ready): alive = serving with every internal task running; ready = alive,
        the group joined, the last Redis call answered, and not draining."""
        alive = (self.fatal is None and not self.dead_tasks and bool(self.tasks)
                 and not self.stopped)
        ready = alive and self.joined and not self._failures and not self.stopping
        return alive, ready

    def refresh_telemetry(self) -> None:
        """Look again whether an OpenTelemetry SDK is installed: without one, skip spans
        and instruments entirely (they would be no-ops, but not free)."""
        self.tracing = telemetry.tracing_enabled()
        self.metering = telemetry.metrics_enabled()

    def count(self, what: str, n: int = 1, outcome: str | None = None) -> None:
        """Bump a live counter and its OpenTelemetry twin."""
        self.counts[what] += n
        if not self.metering:
            return
        if what in telemetry.COUNTERS:
            telemetry.count(what, n, self.cfg.stream, self.cfg.group, outcome)
        elif what.startswith("lock_"):
            telemetry.count_lock(what[5:], n, self.cfg.stream, self.cfg.group)

    # ---- supervision -------------------------------------------------------------------

    def _spawn(self, what: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"streamwork-{what}")
        self.tasks[task] = what
        task.add_done_callback(self._ended)
        return task

    def _loop(self, what: str, step: Callable[[], Awaitable[Any]]) -> asyncio.Task[None]:
        """A task running ``step`` again and again, riding out the errors it raises."""

        async def supervised() -> None:
            while True:
                try:
                    await step()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not await self.ride_out(what, exc):
                        return
                else:
                    self.transport_ok()

        return self._spawn(what, supervised())

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A task ended: fine while stopping; otherwise the worker is no longer whole."""
        what = self.tasks.get(task, task.get_name())
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and self.stopping:
            return
        self.dead_tasks.append(what)
        self.fail(what, exc or RuntimeError(f"the {what} task returned unexpectedly"))

    async def ride_out(self, what: str, exc: BaseException) -> bool:
        """Deal with an error a loop met: back off (transient), recreate the group (gone),
        or stop the worker (anything else). Returns whether the loop may go on."""
        kind = classify(exc)
        if kind is Fault.TRANSIENT:
            await self.transport_failed(exc)
            return True
        if kind is Fault.GONE:
            await self.recreate_group(exc)
            return True
        self.fail(what, exc)
        return False

    def fail(self, what: str, exc: BaseException) -> None:
        """Stop the worker: it met an error no backoff will cure. It drains, then ``run``
        raises WorkerFailed."""
        if self.fatal is None:
            self.fatal = WorkerFailed(what, exc)
            log.error("%s failed; the worker stops: %s", what, exc, exc_info=exc,
                      extra=fields(stream=self.cfg.stream, group=self.cfg.group,
                                   consumer=self.name))
        if self._stop is not None:
            self._stop.set()

    async def _until_ok(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()``, retried through transient errors and a vanished group; anything else
        raises WorkerFailed."""
        while True:
            try:
                result = await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if classify(exc) is Fault.FATAL:
                    raise WorkerFailed(what, exc) from exc
                await self.transport_failed(exc)
            else:
                self.transport_ok()
                return result

    async def ensure_group(self) -> None:
        """Create the consumer group at id 0 (so earlier jobs are delivered) if missing."""
        try:
            await self.redis.xgroup_create(self.cfg.stream, self.cfg.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise

    async def recreate_group(self, exc: BaseException) -> None:
        """The group or the stream is gone (the server came back empty, a FLUSHALL):
        create it again and go on. Deliveries held meanwhile are reported by the heartbeat."""
        log.warning("consumer group missing (%s); recreating it", exc, extra=fields(
            stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
        self.count("group_recreated")
        try:
            await self.ensure_group()
        except Exception as again:
            if classify(again) is Fault.FATAL:
                self.fail("group", again)
            else:
                await self.transport_failed(again)

    async def transport_failed(self, exc: BaseException) -> None:
        """Note a transient error and sleep the reconnect backoff."""
        self._failures += 1
        if self._failures == 1:
            log.warning("redis unavailable, retrying with backoff: %s", exc, extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
        await asyncio.sleep(reconnect_delay(self._failures))

    def transport_ok(self) -> None:
        if self._failures:
            log.warning("redis available again after %d failed calls", self._failures,
                        extra=fields(stream=self.cfg.stream, consumer=self.name))
            self._failures = 0

    async def _drain(self) -> int:
        """Let held deliveries finish within drain_timeout; return how many are left."""
        deadline = time.monotonic() + self.cfg.drain_timeout
        while self.held() and time.monotonic() < deadline:
            self._empty.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._empty.wait(), deadline - time.monotonic())
        return self.held()

    async def _final_flush(self) -> None:
        """Send the outcomes the drain produced, riding out transient errors for a while."""
        deadline = time.monotonic() + FINAL_FLUSH
        while (self.done_buf or self.fail_buf or self.ack_buf) and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self._flush_once(), max(deadline - time.monotonic(), 0.01))
            except asyncio.TimeoutError:
                return
            except Exception as exc:
                if classify(exc) is Fault.FATAL:
                    return
                await asyncio.sleep(min(reconnect_delay(1), max(deadline - time.monotonic(), 0)))

    def wake_reader(self) -> None:
        """Let a reader that waits for room (or for isolation to end) look again."""
        self._room.set()

    def held(self) -> int:
        """Deliveries this process holds (the PEL entries it owns)."""
        return len(self.inflight) + len(self.loose)

    # ---- reading and admission --------------------------------------------------------

    async def _read_once(self) -> None:
        cfg = self.cfg
        room = self.capacity - self.held()
        if room <= 0 or self.isolating:
            self._room.clear()
            await self._room.wait()
            return
        reply = await self.redis.xreadgroup(
            cfg.group, self.name, {cfg.stream: ">"}, count=min(room, cfg.batch_size),
            block=max(1, round(cfg.read_block * 1000)))
        if reply:
            entries = reply[0][1]
            await _uninterrupted(self.admit(entries, None))

    async def admit(self, entries: list[Entry], deliveries: list[int] | None) -> None:
        """Decode, vet and (with dedup) lease a batch of deliveries, then queue them.
        ``deliveries``: each entry's delivery count (None: all first deliveries)."""
        cfg = self.cfg
        fresh: list[Delivery] = []
        for i, (entry_id, values) in enumerate(entries):
            if entry_id in self.inflight or entry_id in self.loose:
                continue
            count = 1 if deliveries is None else deliveries[i]
            if values is None:
                self._dead_on_arrival(entry_id, count, "deleted_while_pending", "",
                                      "the entry was deleted from the stream while pending")
                continue
            body = values.get(BODY_FIELD)
            try:
                env = decode_body(body, cfg.max_payload_bytes)
            except DecodeError as exc:
                log.warning("undecodable entry moved to dead letters", extra=fields(
                    stream=cfg.stream, group=cfg.group, entry_id=entry_id.decode(),
                    reason=exc.reason))
                self._dead_on_arrival(entry_id, count, exc.reason, "DecodeError", exc.detail)
                self.count("undecodable", 1)
                continue
            assert body is not None
            attempt = parse_attempts(values.get(ATTEMPTS_FIELD)) + count
            if attempt > cfg.max_deliveries:
                self._dead_on_arrival(
                    entry_id, attempt - 1, "max_deliveries", "DeliveryLimit",
                    f"delivered {attempt} times, over max_deliveries={cfg.max_deliveries}; the "
                    "process handling it died or stalled each time", env.key, body)
                continue
            if self.cache is not None and env.key in self.cache:
                self.loose.add(entry_id)
                self.ack_buf.append(entry_id)
                continue
            msg = Message(
                id=entry_id.decode(), stream=cfg.stream, key=env.key, payload=env.payload,
                attempt=attempt, enqueued_at=env.enqueued_ms / 1000, headers=env.headers,
                group=cfg.group, consumer=self.name,
            )
            limit = cfg.timeout if env.limit_ms is None else env.limit_ms / 1000
            d = Delivery(entry_id, msg, body, limit)
            self.inflight[entry_id] = d
            fresh.append(d)
        if self.fail_buf or self.ack_buf:
            self._flush_needed.set()
        if not fresh:
            return
        if not cfg.dedup:
            for d in fresh:
                self._enqueue(d)
            return
        for d in fresh:
            self.waiting[d.entry_id] = d
        await self._lease(fresh)

    def _dead_on_arrival(self, entry_id: bytes, attempts: int, reason: str, etype: str,
                         detail: str, job_key: str = "", body: bytes = b"") -> None:
        """A delivery that will never run: straight to the dead letters (via the flusher)."""
        self.loose.add(entry_id)
        self.fail_buf.append(Failure(None, entry_id, "d", 0, attempts, reason, etype, detail,
                                     job_key, body))

    def _enqueue(self, d: Delivery) -> None:
        d.state = QUEUED
        self.queue.put_nowait(d)
        self.count("consumed", 1)

    async def _claim(self, batch: list[Delivery], ttl_ms: int) -> list[int]:
        """claim.lua for a batch (``ttl_ms`` 0: only check done-markers and ownership)."""
        keys = self.keys
        return list(await self.scripts.claim(keys=[keys.stream, keys.fence], args=[
            self.cfg.group, self.name, ttl_ms, self.lease_owner, keys.done_prefix,
            keys.lock_prefix,
            _pack([[d.entry_id for d in batch], [d.msg.key for d in batch]])]))

    async def _lease(self, batch: list[Delivery]) -> None:
        """claim.lua for a batch of waiting deliveries: skip done jobs, take leases and
        fencing tokens, queue what may run. Busy ones keep waiting (and being heartbeated):
        waiting behind a live duplicate or for a lock quorum is not a failed delivery."""
        batch = [d for d in batch if not d.leasing]  # admission and the leaser may overlap
        if not batch:
            return
        for d in batch:
            d.leasing = True
        try:
            await self._lease_batch(batch)
        finally:
            for d in batch:
                d.leasing = False

    async def _lease_batch(self, batch: list[Delivery]) -> None:
        sent = time.monotonic()
        res = await self._claim(batch, 0 if self.redlock else self.cfg.visibility_ms)
        if self.redlock:
            res = await self._lease_from_redlock(batch, res)
        now = time.monotonic()
        for d, token in zip(batch, res, strict=True):
            if token > 0:
                self.waiting.pop(d.entry_id, None)
                d.lease = f"{self.lease_owner}:{token}"
                if d.held is None:
                    d.deadline = lease_deadline(sent, self.cfg.visibility_timeout)
                elif d.held.valid_for <= 0:
                    self.lose(d, "the Redlock lease expired before the handler started")
                d.msg.fencing_token = token
                self._enqueue(d)
            elif token == _BUSY:
                if not d.waiting_since:
                    d.waiting_since = now
                    self.count("lock_contended", 1)
                    log.info("job lease held elsewhere; claiming again shortly", extra=fields(
                        stream=self.cfg.stream, key=d.msg.key, entry_id=d.msg.id))
            else:
                self.waiting.pop(d.entry_id, None)
                if token == _DUPLICATE:
                    self.count("deduplicated", 1, "duplicate")
                    if self.cache is not None:
                        self.cache.add(d.msg.key)
                    self._forget(d, "deduplicated")
                else:
                    self.count("not_ours", 1)
                    self._forget(d, "lost")

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
            *(self.bounded(redlock.acquire(redlock_resource(self.cfg.stream, fresh[i].msg.key)))
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
            elif isinstance(held, LockError) or (
                    isinstance(held, Exception) and classify(held) is not Fault.FATAL):
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

    async def _lease_waiting_once(self) -> None:
        """Try again to lease deliveries that wait (their job runs elsewhere, the lock
        quorum or Redis refused), pausing longer while nothing gets through."""
        await asyncio.sleep(self._wait_pause)
        for d in [d for d in self.waiting.values() if d.dropped]:
            del self.waiting[d.entry_id]
            self._forget(d)
        if not self.waiting:
            self._wait_pause = WAIT_RETRY
            return
        before = len(self.waiting)
        self._wait_pause = min(self._wait_pause * 2, WAIT_RETRY_MAX)
        await _uninterrupted(self._lease(list(self.waiting.values())))
        if len(self.waiting) < before:
            self._wait_pause = WAIT_RETRY

    # ---- running handlers -------------------------------------------------------------

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        runner = asyncio.current_task()
        assert runner is not None
        handle: Any = self.worker.handle  # async, or plain def run in the pool
        cfg = self.cfg
        debug = log.isEnabledFor(logging.DEBUG)
        while True:
            d = await self.queue.get()
            msg = d.msg
            if d.dropped:
                self._forget(d)
                continue
            d.state = RUNNING
            d.started = time.monotonic()
            timer = (None if d.limit is None
                     else loop.call_later(d.limit, self._time_out, d, runner))
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
                        assert self._pool is not None
                        await asyncio.wrap_future(self._pool.submit(handle, msg))
                else:
                    with trace.use_span(d.span, end_on_exit=False):
                        if self._is_async:
                            await handle(msg)
                        else:
                            assert self._pool is not None
                            ctx = contextvars.copy_context()
                            await asyncio.wrap_future(self._pool.submit(ctx.run, handle, msg))
            except asyncio.CancelledError:
                if not d.timed_out:
                    telemetry.end_span(d.span, "cancelled")
                    self._forget(d)
                    raise
                _uncancel(runner)
                self._timed_out(d, debug)
            except Exception as exc:
                if d.timed_out:
                    _uncancel(runner)
                    self._timed_out(d, debug)
                else:
                    self._finished(d, "failed", debug)
                    self._failed(d, exc)
            else:
                if d.timed_out:  # the handler swallowed its cancellation
                    _uncancel(runner)
                    self._timed_out(d, debug)
                else:
                    self._finished(d, "ok", debug)
                    self._succeeded(d)
            finally:
                if timer is not None:
                    timer.cancel()

    def _time_out(self, d: Delivery, runner: asyncio.Task[None]) -> None:
        """The job's time limit passed: cancel its handler (an async one stops at its next
        await; a sync one's thread cannot be stopped, so its delivery is let go)."""
        if d.state == RUNNING and not d.timed_out:
            d.timed_out = True
            d.msg._lost = True  # msg.check() now raises: the job is someone else's again
            runner.cancel()

    def _timed_out(self, d: Delivery, debug: bool) -> None:
        if self._pool is not None:
            self._pool.abandon()  # its thread may still run: keep the pool's size for others
        self._finished(d, "timeout", debug)
        self.count("timed_out", 1)
        limit = d.limit or 0.0
        self._failed(d, HandlerTimeout(
            f"the handler ran longer than its time limit of {limit:g} s (timeout) and was "
            f"{'cancelled' if self._is_async else 'abandoned; its late outcome is dropped'}"))

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
        if d.dropped:
            self._forget(d)
            return
        d.state = FINISHING
        self.done_buf.append(d)
        self._flush_needed.set()

    def _failed(self, d: Delivery, exc: Exception) -> None:
        if d.dropped:
            self._forget(d)
            return
        cfg, msg = self.cfg, d.msg
        etype = type(exc).__name__
        detail = f"{exc}\n" + "".join(traceback.format_exception(exc))[-TRACEBACK_LIMIT:]
        if isinstance(exc, DeadLetter):
            action, reason, delay = "d", f"dead_letter: {exc.reason}", 0.0
        elif msg.attempt >= cfg.max_deliveries:
            action, reason, delay = "d", "timeout" if d.timed_out else "max_deliveries", 0.0
        else:
            action = "r"
            reason = "timeout" if d.timed_out else "retry"
            explicit = exc.delay if isinstance(exc, Retry) else None
            delay = retry_delay_for(msg.attempt, cfg.retry_delay, cfg.retry_max_delay,
                                    explicit=explicit)
        log.warning("job failed: %s", "retrying" if action == "r" else "dead-lettered",
                    extra=fields(stream=cfg.stream, group=cfg.group, consumer=self.name,
                                 key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                                 error_type=etype, reason=reason,
                                 duration_ms=round((time.monotonic() - d.started) * 1000, 1)))
        d.state = FINISHING
        self.fail_buf.append(Failure(
            d, d.entry_id, action, round(delay * 1000), msg.attempt, reason, etype, detail,
            msg.key, d.body, exc))
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
        if not self.inflight and not self.loose:
            self._empty.set()

    def lose(self, d: Delivery, why: str) -> None:
        """Mark a delivery's lease lost: its outcome will never be written by us."""
        if d.dropped:
            return
        d.dropped = True
        d.msg._lost = True
        self.count("lock_lost", 1)
        log.error("lease lost: %s; the job will be completed elsewhere", why, extra=fields(
            stream=self.cfg.stream, group=self.cfg.group, consumer=self.name, key=d.msg.key,
            entry_id=d.msg.id, attempt=d.msg.attempt))

    def vanish(self, d: Delivery) -> None:
        """The server no longer knows a delivery we hold (it came back empty, or the group
        was deleted): say so loudly; its outcome cannot be recorded."""
        if d.dropped:
            return
        d.dropped = True
        d.msg._lost = True
        self.count("vanished", 1)
        log.error("job vanished from Redis while held (the server lost its data?); its "
                  "outcome cannot be recorded", extra=fields(
                      stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                      key=d.msg.key, entry_id=d.msg.id, attempt=d.msg.attempt))
        if d.state == WAITING:
            self.waiting.pop(d.entry_id, None)
            self._forget(d, "vanished")

    # ---- finishing --------------------------------------------------------------------

    async def _flush_step(self) -> None:
        await self._flush_needed.wait()
        self._flush_needed.clear()
        # a stop lets a flush under way finish: its scripts already ran
        await _uninterrupted(self._flush_once())

    async def _flush_once(self) -> None:
        """Send what finished so far; on an error put back what was not written (for the
        next try, after the caller's backoff) and raise."""
        acks, self.ack_buf = self.ack_buf, []
        done, self.done_buf = self.done_buf, []
        failed, self.fail_buf = self.fail_buf, []
        try:
            while acks:
                await self._send_acks(acks[:FLUSH_CHUNK])
                del acks[:FLUSH_CHUNK]
            while done:
                await self._send_done(done[:FLUSH_CHUNK])
                del done[:FLUSH_CHUNK]
            while failed:
                await self.send_failures(failed[:FLUSH_CHUNK])
                del failed[:FLUSH_CHUNK]
        except BaseException:
            self.ack_buf[:0] = acks
            self.done_buf[:0] = [d for d in done if self.inflight.get(d.entry_id) is d]
            self.fail_buf[:0] = failed
            self._flush_needed.set()
            raise

    async def _send_acks(self, entry_ids: list[bytes]) -> None:
        """Acknowledge deliveries the local cache knows are done (ownership-checked)."""
        res = await self.scripts.ack(keys=[self.keys.stream, self.keys.delayed], args=[
            self.cfg.group, self.name, "0", 0, "", "", "", _pack([entry_ids])])
        for entry_id in entry_ids:
            self.loose.discard(entry_id)
        self.count("deduplicated", sum(1 for r in res if r == 1), "duplicate")
        self._released()

    async def _send_done(self, done: list[Delivery]) -> None:
        live = []
        for d in done:
            if d.held is not None and d.held.valid_for <= 0:
                self.lose(d, "the Redlock lease expired before completion")
            if d.dropped:
                self._forget(d)
            else:
                live.append(d)
        await self.release_held([d for d in done if d.dropped])
        if not live:
            return
        cfg, keys = self.cfg, self.keys
        script_keys: list[str | bytes] = [keys.stream, keys.delayed]
        staged = _staged_ops(live, script_keys)
        mode = "0" if not cfg.dedup else "2" if self.redlock else "1"
        batch: list[list[Any]] = [[d.entry_id for d in live]]
        if cfg.dedup:
            batch += [[d.msg.key for d in live], [d.lease for d in live]]
        if any(d.member for d in live):
            if not cfg.dedup:
                batch += [[], []]
            batch.append([d.member for d in live])
        script = self.scripts.complete if cfg.dedup or staged else self.scripts.ack
        res = await script(keys=script_keys, args=[
            cfg.group, self.name, mode, round(cfg.dedup_window * 1000), staged,
            keys.done_prefix, keys.lock_prefix, _pack(batch)])
        acked = 0
        for d, code in zip(live, res, strict=True):
            if code in (1, 2, 3):
                acked += 1
                if self.cache is not None:
                    self.cache.add(d.msg.key)
                if code == 3:
                    self.count("deduplicated", 1, "duplicate")
                if code == 2:
                    self.count("staged_rejected", 1)
                    log.error("a staged write was rejected by Redis; the others applied",
                              extra=fields(stream=cfg.stream, key=d.msg.key,
                                           entry_id=d.msg.id))
                self._forget(d, "acked")
            elif code == _VANISHED:
                self.vanish(d)
                self._forget(d, "vanished")
            else:
                self.lose(d, "not the owner at completion (reclaimed by another worker)")
                self._forget(d, "lost")
        self.count("acked", acked, "success")
        await self.release_held(live)

    async def send_failures(self, failed: list[Failure]) -> None:
        """fail.lua for a batch: schedule retries or dead-letter, XACK, release leases."""
        keys = self.keys
        live = [f for f in failed if f.delivery is None or not f.delivery.dropped]
        for f in failed:
            if f.delivery is not None and f.delivery.dropped:
                self._forget(f.delivery)
        res = await self.scripts.fail(
            keys=[keys.stream, keys.delayed, keys.dead],
            args=[self.cfg.group, self.name, self.worker.worker_name, keys.lock_prefix,
                  _pack([[f.entry_id, f.action, f.delay_ms, f.attempts, f.job_key,
                          f.delivery.lease if f.delivery and not self.redlock else "",
                          f.delivery.member if f.delivery else b"",
                          f.reason, f.error_type, f.detail, f.body] for f in live])]
        ) if live else []
        for f, r in zip(live, res, strict=True):
            d = f.delivery
            if r == 1:
                self.count("retried", 1, "timeout" if f.reason == "timeout" else "error")
            elif r == 2:
                self.count("dead_lettered", 1, f.reason.split(":", 1)[0])
                log.error("job dead-lettered", extra=fields(
                    stream=self.cfg.stream, group=self.cfg.group, consumer=self.name,
                    entry_id=f.entry_id.decode(), attempt=f.attempts, reason=f.reason,
                    error_type=f.error_type))
            elif d is not None and r == _VANISHED:
                self.vanish(d)
            elif d is not None:
                self.lose(d, "not the owner when recording a failure")
            if d is None:
                self.loose.discard(f.entry_id)
                self._released()
            else:
                outcome = {1: "retried", 2: "dead_lettered", 4: "vanished"}.get(r, "lost")
                if d.span is not None and f.error is not None:
                    telemetry.end_span(d.span, outcome, f.error)
                    d.span = None
                self._forget(d, outcome)
        await self.release_held([f.delivery for f in failed if f.delivery is not None])


class HandlerTimeout(Exception):
    """A handler ran past its job's time limit (``timeout``)."""


def _staged_ops(live: list[Delivery], script_keys: list[str | bytes]) -> bytes:
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


def _uncancel(task: asyncio.Task[None]) -> None:
    """Withdraw a cancellation this worker made itself (a time limit), on Pythons that
    count them (3.11+), so later timeouts inside handlers are not confused."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


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
