"""Job leases held in a Redlock quorum over independent masters (``lock_urls``): the
strategy the worker uses when its leases must survive the stream's Redis failing over.
The job record and the ack stay on the stream's Redis."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from streamwork._lock.redlock import AsyncHeldLock, AsyncRedlock
from streamwork._redis import scripts
from streamwork._redis.faults import Fault, classify
from streamwork._redis.replies import Claim, LeaseMode
from streamwork._wire.keys import GroupKeys, redlock_resource
from streamwork._worker.core.leases import LeaseStrategy
from streamwork._worker.core.supervisor import QuorumLink
from streamwork.errors import LockError, LockNotAcquired

if TYPE_CHECKING:
    from streamwork._worker.core.delivery import Delivery
    from streamwork._worker.core.options import CoreConfig

T = TypeVar("T")

REDLOCK_PARALLEL: Final = 16  #: Redlock acquire/extend/release calls in flight per worker


class RedlockLease(LeaseStrategy):
    """The lease lives in a Redlock quorum over ``lock_urls`` (the job record and the ack
    stay on the stream's Redis). The done-check runs again once the lease is held
    (double-checked), so a copy that waited for the first holder sees its done record."""

    mode = LeaseMode.REDLOCK
    claims = True

    def __init__(self, run: scripts.AsyncScripts, keys: GroupKeys, cfg: CoreConfig,
                 consumer: str, owner: str) -> None:
        super().__init__(run, keys, cfg, consumer, owner)
        assert cfg.lock_urls
        # per-master timeout: a tenth of the lease (0.05 s to 1 s); the Redlock default of
        # 0.1 s is too tight for a worker releasing a whole batch at once on a busy host
        self.redlock = AsyncRedlock(list(cfg.lock_urls), ttl=cfg.visibility_timeout,
                                    node_timeout=max(0.05, min(1.0, cfg.visibility_timeout / 10)))
        # at most this many Redlock operations at once, so a batch reuses pooled
        # connections instead of opening one per job to every master
        self._slots = asyncio.Semaphore(REDLOCK_PARALLEL)
        self._releasing: set[asyncio.Future[list[Any]]] = set()  # see release and close
        #: whether a quorum of the masters answers (its outage: quorum.py)
        self.outage = QuorumLink(stream=cfg.stream, group=cfg.group, consumer=consumer)
        #: deliveries too few masters answered for: the consumer lets them go, quorum.py
        #: hands them back to the group
        self.unreached: list[Delivery] = []

    async def _bounded(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run ``op()`` once a slot is free: the coroutine is made only then, so one whose
        wait is cancelled (a stopping worker) is never left un-awaited."""
        async with self._slots:
            return await op()

    async def take(self, batch: Sequence[Delivery],
                   starts: Sequence[int] | None = None) -> list[int]:
        """As `LeaseStrategy.take`; a lease a quorum of masters refused is `Claim.BUSY`
        (held elsewhere: it waits), one too few masters answered for (errors, timeouts)
        `Claim.UNREACHABLE` (kept in `unreached`), and tells `outage` the quorum is lost
        (the consumer lets it go); any answer from a quorum tells it the quorum is there."""
        out = await self._claim(batch, "check")  # only look: done records and ownership
        go = [i for i, code in enumerate(out) if code == Claim.GO]
        sent = time.monotonic()
        results = await asyncio.gather(
            *(self._bounded(functools.partial(
                self.redlock.acquire, redlock_resource(self.cfg.stream, batch[i].msg.key)))
              for i in go),
            return_exceptions=True)
        # valid_for already counts from each lease's own request: add it to now, not to a
        # time before the whole batch was taken (that would count the wait twice)
        now = time.monotonic()
        granted: list[int] = []
        unreached: BaseException | None = None
        for i, grant in zip(go, results, strict=True):
            if isinstance(grant, AsyncHeldLock):
                batch[i].grant = grant
                batch[i].deadline = now + grant.valid_for
                batch[i].lease_id = f"{self.owner}:{grant.fencing_token}"
                out[i] = grant.fencing_token
                granted.append(i)
            elif isinstance(grant, LockNotAcquired) and grant.answered >= grant.quorum:
                out[i] = Claim.BUSY  # a quorum answered: another holder has it
            elif isinstance(grant, LockError) or (
                    isinstance(grant, Exception) and classify(grant) is not Fault.FATAL):
                out[i] = Claim.UNREACHABLE
                unreached = unreached or grant
                self.unreached.append(batch[i])
            else:
                raise grant
        if unreached is not None:
            self.outage.failed(ConnectionError(_unreached(unreached)), sent)
        elif go:
            self.outage.answered(sent)
        if granted:  # look again, now holding them, and mark their records running
            again = await self._claim([batch[i] for i in granted], "mark")
            late = [batch[i] for i, code in zip(granted, again, strict=True) if code != Claim.GO]
            for i, code in zip(granted, again, strict=True):
                if code != Claim.GO:
                    out[i] = code
            await self.release(late)
        return out

    async def reached(self) -> bool:
        """Whether a quorum of the masters answers a PING now (each within its timeout)."""
        pongs = await asyncio.gather(*(c.ping() for c in self.redlock.clients),
                                     return_exceptions=True)
        return sum(1 for p in pongs if p is True) >= self.redlock.quorum

    def marked(self, d: Delivery) -> str:
        return d.lease_id

    def expired(self, d: Delivery, now: float) -> bool:
        return now >= d.deadline or self.spent(d)

    def spent(self, d: Delivery) -> bool:
        """Whether ``d``'s Redlock grant ran out."""
        return d.grant is not None and d.grant.valid_for <= 0

    async def extended(self, kept: Sequence[Delivery], sent: float) -> None:
        ds = [d for d in kept if d.grant is not None]
        results = await asyncio.gather(
            *(self._bounded(d.grant.extend) for d in ds if d.grant is not None),
            return_exceptions=True)
        now = time.monotonic()  # as in take: the validity returned counts from now
        for d, validity in zip(ds, results, strict=True):
            if isinstance(validity, float) and validity > 0 and now < d.deadline:
                d.deadline = now + validity
        if any(isinstance(v, float) for v in results):
            self.outage.answered(sent)
        elif ds and not await self.reached():  # none went through: is the quorum there?
            self.outage.failed(ConnectionError(
                "no lease extension went through and too few masters answer a PING"), sent)

    async def release(self, ds: Sequence[Delivery]) -> None:
        grants = [d.grant for d in ds if d.grant is not None]
        for d in ds:
            d.grant = None
        if grants:  # shielded: a stopping worker must not leave leases behind half-released
            releasing = asyncio.gather(
                *(self._bounded(g.release) for g in grants), return_exceptions=True)
            self._releasing.add(releasing)
            releasing.add_done_callback(self._releasing.discard)
            await asyncio.shield(releasing)

    async def close(self) -> None:
        """Let the releases still under way (their caller may have been cancelled) finish
        first: started after the clients are closed, they would open connections that
        nothing closes."""
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
        await self.redlock.aclose()


def _unreached(exc: BaseException) -> str:
    """What a lease too few masters answered for says: how many did, and the first error."""
    if isinstance(exc, LockNotAcquired):
        cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        return f"{exc.answered} of {exc.total} masters answered, quorum is {exc.quorum}{cause}"
    return f"{type(exc).__name__}: {exc}"
