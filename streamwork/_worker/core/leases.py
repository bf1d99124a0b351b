"""Job leases, chosen once per worker (context.build): none (dedup off), a lease in the
stream's Redis, or a Redlock lease over independent masters (``lock_urls``, in
redlock_lease.py).

A strategy alone knows how to take a batch's leases, what value the scripts compare, how
a heartbeat extends them, when one counts as lost, and how to release them; the consumer
and the background loops only ask it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamwork._lock.core import drift_allowance
from streamwork._redis import scripts
from streamwork._redis.replies import Claim, LeaseMode
from streamwork._wire.keys import GroupKeys
from streamwork._worker.core.ends import claim_columns

if TYPE_CHECKING:
    from streamwork._worker.core.delivery import Delivery
    from streamwork._worker.core.options import CoreConfig


def lease_deadline(sent: float, ttl: float) -> float:
    """Monotonic time until which a lease of ``ttl`` s requested at ``sent`` is safe to rely
    on: the TTL minus the clock-drift allowance, counted from the request (the Redlock
    algorithm's validity time). The one place the margin is computed, for Redis leases and
    Redlock alike."""
    return sent + ttl - float(drift_allowance(ttl))


class LeaseStrategy:
    """How this worker leases its jobs; this base takes no lease (dedup off): deliveries
    run at once, nothing to extend or release."""

    mode = LeaseMode.NONE
    claims = False  #: deliveries need ``take`` before they may run

    def __init__(self, run: scripts.AsyncScripts, keys: GroupKeys, cfg: CoreConfig,
                 consumer: str, owner: str) -> None:
        self._run = run
        self.keys = keys
        self.cfg = cfg
        self.consumer = consumer
        self.owner = owner

    async def take(self, batch: Sequence[Delivery],
                   starts: Sequence[int] | None = None) -> list[int]:
        """Take the leases of ``batch``: a fencing token or a Claim code per delivery (with
        ``starts``, those flagged 1 taken as running, where the job record is the lease)."""
        return [Claim.GO] * len(batch)

    def value(self, d: Delivery) -> str:
        """The lease value scripts compare before writing ("" when they check none)."""
        return ""

    def marked(self, d: Delivery) -> str:
        """The lease a job record names without being it (a Redlock's): heartbeats keep
        such a record and read a cancel from it ("" when the record is the lease or none)."""
        return ""

    def expired(self, d: Delivery, now: float) -> bool:
        """Whether ``d``'s lease ran out unconfirmed (it must then count as lost)."""
        return False

    def sort_spent(self, ds: list[Delivery]) -> tuple[list[Delivery], list[Delivery]]:
        """``ds`` sorted, in order, into those whose lease holds and those whose lease ran
        out (`expired`): lost, never completed, whatever a server would still accept."""
        now, expired = time.monotonic(), self.expired
        return [d for d in ds if not expired(d, now)], [d for d in ds if expired(d, now)]

    async def extended(self, kept: Sequence[Delivery], sent: float) -> None:
        """heartbeat.lua kept ``kept`` (beat sent at ``sent``): move their deadlines, but
        never that of a lease whose deadline passed before the reply came (its handler may
        have seen ``msg.lock_lost``: the heartbeat gives it up)."""

    async def release(self, ds: Sequence[Delivery]) -> None:
        """Give back leases held outside the stream's Redis (finished or lost jobs)."""

    async def close(self) -> None:
        """Close connections of its own."""

    async def _claim(self, batch: Sequence[Delivery], mode: str,
                     starts: Sequence[int] | None = None) -> list[int]:
        """claim.lua over ``batch`` in ``mode`` (lease / check / mark; ``starts``: see take)."""
        report_keys: list[str | bytes] = []
        return list(await self._run.run(scripts.claim(
            self.keys, self.consumer, self.cfg.visibility_ms, self.owner, mode,
            claim_columns(batch, starts, report_keys), report_keys)))


class RedisLease(LeaseStrategy):
    """The lease is the job's record in the stream's Redis (one key per group and job key),
    taken by claim.lua with a fencing token from ``{S}:fence``, extended by heartbeat.lua,
    checked and turned into the done (or waiting, dead) record by complete.lua / fail.lua
    in the same atomic step as the ack."""

    mode = LeaseMode.REDIS
    claims = True

    async def take(self, batch: Sequence[Delivery],
                   starts: Sequence[int] | None = None) -> list[int]:
        sent = time.monotonic()
        res = await self._claim(batch, "lease", starts)
        owner, deadline = self.owner, lease_deadline(sent, self.cfg.visibility_timeout)
        for d, token in zip(batch, res, strict=True):
            if token > 0:
                d.lease_id = f"{owner}:{token}"
                d.deadline = deadline
        return res

    def value(self, d: Delivery) -> str:
        return d.lease_id

    def expired(self, d: Delivery, now: float) -> bool:
        return now >= d.deadline

    async def extended(self, kept: Sequence[Delivery], sent: float) -> None:
        deadline, now = lease_deadline(sent, self.cfg.visibility_timeout), time.monotonic()
        for d in kept:
            if now < d.deadline:  # one that ran out before the reply stays lost (final)
                d.deadline = deadline
