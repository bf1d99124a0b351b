"""A worker over several streams: the partitions of a partitioned stream, and ordered mode.

Each stream it serves gets its own `Consumer` (its reader, runners, flusher, heartbeat and
reclaimer, all on this event loop), sharing one Redis client and ``concurrency`` handler
slots, so the process runs at most ``concurrency`` handlers whatever the partition count
and a busy partition may use every slot. They also share one `Link`: a Redis outage is
one outage of the worker (one line when lost, one when back), whatever the partitions.

Ordered mode adds a lease per partition (``{P}:owner:<len>:G``, SET NX PX
visibility_timeout, renewed every third of it): only its owner reads and runs the
partition's jobs, so at most one job per order key is in flight across all workers. The
group's live workers register in ``{S}:members:<len>:G`` (a ZSET scored by when each one's
membership lapses); every worker computes the same share-out of the partitions from that
list, takes the free ones that fall to it, and hands back (drains, then deletes the lease
of) those that fall to another. A worker that dies stops renewing: its membership and its
leases lapse after visibility_timeout and the others take its partitions, first claiming
every delivery still pending there, in entry order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from streamwork._redis import acl, connection, scripts
from streamwork._redis.faults import Fault, classify
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._wire.extensions import Codec
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import check_recorded, partition_names
from streamwork._wire.pausing import PauseState
from streamwork._worker.config import WorkerConfig
from streamwork._worker.core.batch_runner import AnyHandler
from streamwork._worker.core.consumer import Consumer
from streamwork._worker.core.done_cache import KeyCache
from streamwork._worker.core.supervisor import Link, StoppedBeforeStart, Supervisor
from streamwork._worker.features import FEATURES
from streamwork._worker.features.ordered import OrderedGate
from streamwork._worker.features.pause import Pausing
from streamwork.errors import WorkerFailed

log = logging.getLogger(WORKER_LOGGER)

RENEW_FRACTION: Final = 1 / 3  #: leases and membership are renewed this often (of the TTL)


async def _nothing() -> None:
    """No consumer group to recreate while recording the partition count."""


def share_out(members: Sequence[str], partitions: int) -> dict[str, list[int]]:
    """Which partitions each live member should own: each partition, in order, goes to the
    member that may take it (its ``/``-suffix lists what it may take, ``*`` all) and owns the
    fewest so far, ties to the first in sorted order. Every worker computes the same map
    from the same member list."""
    ranked = sorted(members)
    allowed = {m: _allowed(m) for m in ranked}
    owned: dict[str, list[int]] = {m: [] for m in ranked}
    for i in range(partitions):
        takers = [m for m in ranked if allowed[m] is None or i in allowed[m]]  # type: ignore[operator]
        if takers:
            best = min(takers, key=lambda m: len(owned[m]))
            owned[best].append(i)
    return owned


def _allowed(member: str) -> frozenset[int] | None:
    spec = member.rsplit("/", 1)[-1]
    if spec == "*":
        return None
    return frozenset(int(i) for i in spec.split(",") if i)


class Partitioned:
    """Serves every stream a worker consumes (partitions, or one stream in ordered mode)."""

    def __init__(self, handle: AnyHandler, cfg: WorkerConfig, url: str, name: str,
                 worker_name: str, cache: KeyCache | None,
                 convert: Callable[[Any], Any] | None = None,
                 codec: Codec | None = None, extras: Mapping[str, Any] | None = None) -> None:
        self.handle = handle
        self.codec = codec
        self.convert = convert
        self.extras = dict(extras or {})
        self.cfg = cfg
        self.url = url
        self.name = name
        self.worker_name = worker_name
        self.cache = cache
        self.redis: Any = connection.async_client(url)
        self.scripts = scripts.AsyncScripts(self.redis, flags=False)
        self.names = partition_names(cfg.stream, cfg.partitions)
        self.mine = cfg.only_partitions or tuple(range(cfg.partitions))
        spec = ",".join(map(str, cfg.only_partitions)) if cfg.only_partitions else "*"
        self.member = f"{name}:{secrets.token_hex(6)}/{spec}"
        self.base = StreamKeys.for_stream(cfg.stream).group(cfg.group)
        self.consumers: dict[int, Consumer] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.stops: dict[int, asyncio.Event] = {}
        self.leases: dict[int, float] = {}  # partition -> monotonic time its lease lapses
        self.handing: dict[int, asyncio.Task[None]] = {}  # being drained for another owner
        self.past: Counter[str] = Counter()  # the counts of consumers that have stopped
        self.slots: asyncio.Semaphore | None = None
        self.stopping = False
        self.fatal: BaseException | None = None
        self.joined = False
        # what every consumer (and the start, and the partition leases) knows of Redis
        self.link = Link(stream=cfg.stream, group=cfg.group, consumer=name)
        self.start_sup: Supervisor | None = None  # rides out errors while starting

    # ---- what StreamWorker sees -------------------------------------------------------

    @property
    def counts(self) -> Counter[str]:
        total = Counter(self.past)
        for c in self.consumers.values():
            total.update(c.counts)
        return total

    @property
    def redis_ok(self) -> bool:
        """Whether Redis answers (as far as the worker's last calls tell)."""
        return self.link.up

    def health(self) -> tuple[bool, bool]:
        alive = not self.stopping and self.fatal is None and all(
            c.health()[0] or not c.joined for c in self.consumers.values())
        ready = alive and self.joined and self.redis_ok and all(
            c.health()[1] and c.quorum.up for c in self.consumers.values() if c.joined)
        return alive, ready

    def paused(self) -> PauseState | None:
        """The pause of the group as the first paused partition's consumer read it."""
        pauses = (c.feature(Pausing) for c in self.consumers.values())
        return next((p.state() for p in pauses if p is not None and p.state() is not None),
                    None)

    def dead_tasks(self) -> tuple[str, ...]:
        return tuple(t for c in self.consumers.values() for t in c.sup.dead_tasks)

    def owned(self) -> list[int]:
        """The partitions this worker serves right now."""
        return sorted(self.consumers)

    # ---- running ----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self.slots = asyncio.Semaphore(self.cfg.concurrency)
        try:
            if not await self._record_partitions(stop):
                return  # stopped before Redis ever answered
            if self.cfg.ordered:
                await self._run_ordered(stop)
            else:
                for i in self.mine:
                    self._start(i)
                self.joined = True
                await self._until(stop)
        finally:
            self.stopping = True
            await self._stop_all()
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        if self.fatal is not None:
            raise self.fatal

    async def _record_partitions(self, stop: asyncio.Event) -> bool:
        """Record the stream's partition count (or find it recorded) before serving, riding
        out transient errors as a consumer's start does; a producer or worker with another
        count is refused (WorkerFailed). False when stopped before Redis answered."""
        sup = self.start_sup = Supervisor(_nothing, link=self.link, stream=self.cfg.stream,
                                          explain=acl.explainer(self.url, self.cfg.stream),
                                          group=self.cfg.group, consumer=self.name)
        sup.stop_event = stop
        try:
            recorded = await sup.until_ok("start", lambda: self.redis.set(
                self.base.stream.partitions, self.cfg.partitions, nx=True, get=True))
        except StoppedBeforeStart:
            return False
        try:
            check_recorded(self.cfg.stream, recorded, self.cfg.partitions, "worker")
        except Exception as exc:
            failed = WorkerFailed("start", exc, started=False)
            log.error("%s", failed, exc_info=exc, extra=fields(
                stream=self.cfg.stream, group=self.cfg.group, consumer=self.name))
            raise failed from exc
        return True

    def _start(self, i: int) -> None:
        """Start serving partition ``i``."""
        cfg = WorkerConfig(**{**self.cfg.as_dict(), "stream": self.names[i], "partitions": 1,
                              "only_partitions": None})
        consumer = Consumer(self.handle, cfg, self.url, self.name, self.worker_name,
                            cache=self.cache, features=FEATURES, client=self.redis,
                            slots=self.slots, convert=self.convert, codec=self.codec,
                            # limits span the partitions: their keys are the stream's
                            extras={**self.extras, "limit_keys": self.base},
                            link=self.link)
        stop = asyncio.Event()
        self.consumers[i] = consumer
        self.stops[i] = stop
        self.tasks[i] = asyncio.create_task(self._serve(i, consumer, stop),
                                            name=f"partition-{i}")

    async def _serve(self, i: int, consumer: Consumer, stop: asyncio.Event) -> None:
        try:
            await consumer.run(stop)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError) and self.fatal is None:
                self.fatal = exc
                log.error("partition %d stopped on an error; the worker stops", i,
                          extra=fields(stream=self.names[i], group=self.cfg.group))
            raise
        finally:
            self.past.update(consumer.counts)
            if self.consumers.get(i) is consumer:
                del self.consumers[i]
                self.stops.pop(i, None)
                self.tasks.pop(i, None)

    async def _until(self, stop: asyncio.Event, timeout: float | None = None) -> None:
        """Wait for ``stop``, a partition failing, or ``timeout`` seconds."""
        waiter = asyncio.ensure_future(stop.wait())
        try:
            pending: Iterable[asyncio.Future[Any]] = [waiter, *self.tasks.values()]
            await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if self.fatal is not None:
                stop.set()
        finally:
            waiter.cancel()

    async def _stop_one(self, i: int) -> None:
        """Drain partition ``i`` and wait until its consumer has returned."""
        stop, task = self.stops.get(i), self.tasks.get(i)
        if stop is not None:
            stop.set()
        if task is not None:
            with contextlib.suppress(BaseException):
                await task

    async def _stop_all(self) -> None:
        await asyncio.gather(*(self._stop_one(i) for i in list(self.tasks)),
                             *self.handing.values(), return_exceptions=True)
        for i in list(self.leases):
            await self._release(i)
        if self.cfg.ordered:
            with contextlib.suppress(Exception):
                await self.redis.zrem(self.base.members, self.member)

    # ---- ordered mode: partition leases ------------------------------------------------

    def _owner_key(self, i: int) -> str:
        return StreamKeys.for_stream(self.names[i]).group(self.cfg.group).owner

    async def _run_ordered(self, stop: asyncio.Event) -> None:
        every = self.cfg.visibility_timeout * RENEW_FRACTION
        while not stop.is_set() and self.fatal is None:
            since = time.monotonic()
            try:
                await self._rebalance()
                self.link.answered(since)
                self.joined = True
            except Exception as exc:
                kind = classify(exc)
                if kind is Fault.FATAL:
                    self.fatal = WorkerFailed("partition-lease manager (ordered mode)", exc)
                    break
                if kind is Fault.TRANSIENT:  # an outage: the link says so, once
                    self.link.failed(exc, since)
                log.log(logging.DEBUG if kind is Fault.TRANSIENT else logging.WARNING,
                        "partition leases: %s; trying again", exc,
                        extra=fields(stream=self.cfg.stream, group=self.cfg.group))
            self._halt_lapsed()
            await self._until(stop, every)

    async def _rebalance(self) -> None:
        """Renew what we own, register as live, and take or hand back partitions so that
        we own our share."""
        ttl_ms = self.cfg.visibility_ms
        for i in list(self.leases):
            await self._renew(i, ttl_ms)
        now = int(time.time() * 1000)
        members_key = self.base.members
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(members_key, {self.member: now + ttl_ms})
        pipe.zremrangebyscore(members_key, "-inf", now)
        pipe.zrange(members_key, 0, -1)
        pipe.pexpire(members_key, ttl_ms * 10)
        *_, raw, _ = await pipe.execute()
        members = [m.decode() if isinstance(m, bytes) else str(m) for m in raw]
        if self.member not in members:
            members.append(self.member)
        want = set(share_out(members, self.cfg.partitions).get(self.member, ()))
        for i in sorted(set(self.leases) - want - set(self.handing)):
            # drained in the background: our leases are renewed meanwhile
            self.handing[i] = asyncio.create_task(self._hand_back(i))
        for i in sorted(want - set(self.leases) - set(self.handing)):
            if await self.redis.set(self._owner_key(i), self.member, nx=True, px=ttl_ms):
                self.leases[i] = time.monotonic() + self.cfg.visibility_timeout
                log.info("partition %d taken (ordered)", i, extra=fields(
                    stream=self.names[i], group=self.cfg.group, consumer=self.name))
                self._start(i)

    async def _renew(self, i: int, ttl_ms: int) -> None:
        started = time.monotonic()
        ok = await self.scripts.run(scripts.redlock_extend(self._owner_key(i), self.member,
                                                           ttl_ms))
        if ok:
            self.leases[i] = started + self.cfg.visibility_timeout
        else:
            log.error("lost the lease of partition %d; its unstarted jobs are let go",
                      i, extra=fields(stream=self.names[i], group=self.cfg.group))
            self.leases.pop(i, None)
            self._halt(i)

    def _halt_lapsed(self) -> None:
        """A lease we could not renew in time counts as lost: stop starting its jobs."""
        now = time.monotonic()
        for i, until in list(self.leases.items()):
            if now >= until:
                log.error("the lease of partition %d lapsed (Redis unreachable?); its "
                          "unstarted jobs are let go", i,
                          extra=fields(stream=self.names[i], group=self.cfg.group))
                self.leases.pop(i, None)
                self._halt(i)

    def _halt(self, i: int) -> None:
        consumer = self.consumers.get(i)
        if consumer is not None:
            gate = consumer.feature(OrderedGate)
            if isinstance(gate, OrderedGate):
                gate.let_go_unstarted()
        stop = self.stops.get(i)
        if stop is not None:
            stop.set()

    async def _hand_back(self, i: int) -> None:
        """Another worker should own partition ``i``: drain it, then delete our lease."""
        log.info("handing partition %d back (rebalance)", i,
                 extra=fields(stream=self.names[i], group=self.cfg.group))
        try:
            await self._stop_one(i)
            await self._release(i)
        finally:
            self.handing.pop(i, None)

    async def _release(self, i: int) -> None:
        self.leases.pop(i, None)
        with contextlib.suppress(Exception):
            await self.scripts.run(scripts.redlock_release(self._owner_key(i), self.member))
