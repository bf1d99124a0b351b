"""Limits that span every worker of a group: a rate (``rate_limit``, a token bucket in
rate.lua) and a cap on jobs in flight per concurrency key (``concurrency_key`` with
``concurrency_per_key``, a semaphore of expiring holds in semaphore.lua).

Both are checked by a runner just before a handler starts. A job over a limit waits,
held and heartbeated like any job that has not started, and uses no attempt: over the rate
the runner sleeps until the bucket's next token is due; over a key's cap the delivery goes
back to the run queue for a moment (so the runner takes other keys' jobs meanwhile).
Holds lapse after ``visibility_timeout`` unless kept, so a crashed worker's holds free
themselves; the holder renews them every third of it while its handlers run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Callable
from typing import Any, Final

from streamwork._redis import scripts
from streamwork._redis.faults import Fault, classify
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._text import describe
from streamwork._wire.keys import GroupKeys
from streamwork._wire.message import Message
from streamwork._worker.core.delivery import Delivery

log = logging.getLogger(WORKER_LOGGER)

RETRY_KEY: Final = 0.05  #: s before a job over its key's cap is looked at again
BURST_SECONDS: Final = 0.1  #: the bucket holds this many seconds of the rate (at least 1)


class KeyFailed(Exception):
    """The worker's ``concurrency_key`` raised ``error`` for a job: the job fails with it
    (retried, then dead-lettered), as if its handler had raised it. Running it without its
    key's cap instead would break the cap the user asked for."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"concurrency_key raised {describe(error)}")
        self.error = error


class Limits:
    """The group-wide limits of one consumer (``None`` parts are off)."""

    def __init__(self, run: Callable[[scripts.Call], Any], gkeys: GroupKeys, holder: str,
                 per_second: float | None, key_of: Callable[[Message], str] | None,
                 per_key: int, hold_ms: int) -> None:
        self._run = run
        self._gkeys = gkeys
        self._holder = holder
        self.per_ms = None if per_second is None else per_second / 1000
        self.burst = None if per_second is None else max(1.0, per_second * BURST_SECONDS)
        self.key_of = key_of
        self.per_key = per_key
        self.hold_ms = hold_ms
        self.holds: dict[bytes, str] = {}  # delivery ref -> the semaphore it holds

    @property
    def on(self) -> bool:
        return self.per_ms is not None or self.key_of is not None

    async def take_key(self, d: Delivery) -> bool:
        """Take a hold of ``d``'s concurrency key; False when the key is at its cap;
        KeyFailed when the user's ``concurrency_key`` raised."""
        if self.key_of is None:
            return True
        try:
            concurrency_key = str(self.key_of(d.msg))
        except Exception as exc:  # the user's function: the job fails, not the runner
            log.warning("concurrency_key raised %s; the job fails (retried, then "
                        "dead-lettered, as if its handler had raised it)", describe(exc),
                        extra=fields(stream=d.msg.stream, key=d.msg.key, entry_id=d.msg.id,
                                     attempt=d.msg.attempt))
            raise KeyFailed(exc) from exc
        key = self._gkeys.semaphore(concurrency_key)
        got = await self._run(scripts.semaphore(key, "take", self._member(d), self.per_key,
                                                self.hold_ms))
        if got:
            self.holds[d.ref] = key
        return bool(got)

    async def take_rate(self) -> None:
        """Wait until the group's bucket gives this job a token."""
        if self.per_ms is None:
            return
        assert self.burst is not None
        while True:
            wait_ms = int(await self._run(scripts.rate(self._gkeys.rate, self.per_ms,
                                                       self.burst)))
            if wait_ms <= 0:
                return
            # spread the runners that wait, so they do not all ask again at once
            await asyncio.sleep(wait_ms / 1000 * random.uniform(1.0, 1.5))

    async def give_back(self, d: Delivery) -> None:
        """The job's handler ended: free its key's hold."""
        key = self.holds.pop(d.ref, None)
        if key is not None:
            await self._run(scripts.semaphore(key, "give", self._member(d), self.per_key,
                                              self.hold_ms))

    async def keep_all(self) -> bool:
        """Renew every hold of a running job (the holds lapse after ``hold_ms``); returns
        whether there was any (Redis asked)."""
        holds = list(self.holds.items())
        for ref, key in holds:
            await self._run(scripts.semaphore(key, "keep", self._holder + ":" + ref.hex(),
                                              self.per_key, self.hold_ms))
        return bool(holds)

    async def allow(self, d: Delivery) -> bool | Exception:
        """Whether ``d`` may start now under the key cap and the rate; a transient Redis
        error means not yet. An exception: the user's ``concurrency_key`` raised it, and
        the job fails with it like with a handler's."""
        try:
            if not await self.take_key(d):
                return False
            await self.take_rate()
            return True
        except asyncio.CancelledError:
            raise
        except KeyFailed as failed:
            return failed.error
        except Exception as exc:
            if classify(exc) is Fault.FATAL:
                raise
            log.warning("limits unavailable (%s); the job waits", exc, extra=fields(
                stream=d.msg.stream, group=self._gkeys.name, key=d.msg.key))
            return False

    async def release(self, d: Delivery) -> None:
        """``give_back`` if ``d`` has a hold; an error leaves the hold to lapse on its own
        (after visibility_timeout)."""
        if d.ref not in self.holds:
            return
        try:
            await self.give_back(d)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if classify(exc) is Fault.FATAL:
                raise

    async def keep_step(self, interval: float) -> bool:
        """Sleep ``interval``, then `keep_all` (one turn of the loop that keeps holds)."""
        await asyncio.sleep(interval)
        return await self.keep_all()

    def _member(self, d: Delivery) -> str:
        return self._holder + ":" + d.ref.hex()


def retry_key_after() -> float:
    """Seconds before a job over its key's cap is tried again (with jitter)."""
    return RETRY_KEY * random.uniform(1.0, 2.0)


def hold_ms(visibility_timeout: float) -> int:
    return max(1, math.ceil(visibility_timeout * 1000))
