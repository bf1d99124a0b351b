"""Limits that span every worker of a group: a rate (``rate_limit``, a token bucket in
rate.lua) and a cap on jobs in flight per concurrency key (``concurrency_key`` with
``concurrency_per_key``, a semaphore of expiring holds in semaphore.lua).

Both are checked by a runner before a job's start is committed (``before_start``, so no
start is committed ahead of them). A job over a limit waits, held and heartbeated like any
job that has not started, and uses no attempt: over the rate the runner sleeps until the
bucket's next token is due (the start gate is looked at again after the wait: a pause seen
meanwhile holds the job back); over a key's cap the delivery goes back to the run queue for
a moment (so the runner takes other keys' jobs meanwhile).
Holds lapse after ``visibility_timeout`` unless kept, so a crashed worker's holds free
themselves; the holder renews them every third of it while its handlers run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
from collections.abc import Callable
from typing import Any, Final, cast

from streamwork._redis import scripts
from streamwork._redis.faults import Fault, classify
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._text import describe
from streamwork._wire.keys import GroupKeys
from streamwork._wire.message import Message
from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.options import CoreConfig, check_int
from streamwork._worker.core.seam import GO, Fail, Feature, Parts, Step, Verdict, Wait
from streamwork.errors import ConfigError

log = logging.getLogger(WORKER_LOGGER)

RETRY_KEY: Final = 0.05  #: s before a job over its key's cap is looked at again
BURST_SECONDS: Final = 0.1  #: the bucket holds this many seconds of the rate (at least 1)
LIMITS_DOWN: Final = 0.2  #: s before a job whose limits Redis could not check tries again
_RATE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PER: Final = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
               "h": 3600.0, "hour": 3600.0}


class LimitsOptions:
    """The worker options of group-wide limits."""

    rate_limit: str | None = None
    concurrency_per_key: int = 1


class _Config(CoreConfig, LimitsOptions):
    """The options a `Limits` reads."""


def parse_rate(text: object) -> float:
    """``rate_limit`` ("50/s", "600/m", "10/h") as jobs per second; ConfigError otherwise."""
    found = _RATE.match(text) if isinstance(text, str) else None
    if found is None or float(found.group(1)) <= 0:
        raise ConfigError("rate_limit", f"must look like '50/s', '600/m' or '10/h' (jobs "
                                        f"started per second, minute or hour), got {text!r}")
    return float(found.group(1)) / _PER[found.group(2)]


class KeyFailed(Exception):
    """The worker's ``concurrency_key`` raised ``error`` for a job: the job fails with it
    (retried, then dead-lettered), as if its handler had raised it. Running it without its
    key's cap instead would break the cap the user asked for."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"concurrency_key raised {describe(error)}")
        self.error = error


class Limits(Feature):
    """The group-wide limits of one consumer (``None`` parts are off)."""

    options = LimitsOptions
    help = {
        "rate_limit": "jobs started per second/minute/hour by the group, across all its "
                      "workers (e.g. 50/s, 600/m)",
        "concurrency_per_key": "jobs in flight per concurrency key across all workers (with "
                               "concurrency_key)",
    }

    @classmethod
    def check(cls, cfg: Any) -> None:
        check_int(cfg, "concurrency_per_key", 1, 1_000_000)
        if cfg.rate_limit is not None:
            parse_rate(cfg.rate_limit)

    @classmethod
    def build(cls, parts: Parts) -> Limits | None:
        """Limits when the worker has a rate limit or a concurrency key (the Python-only
        ``concurrency_key`` option, in ``parts.extras``); their keys are the group's, or
        those ``extras["limit_keys"]`` names (a partitioned worker's limits span its
        partitions)."""
        cfg = cast(_Config, parts.ctx.cfg)
        key_of = parts.extras.get("concurrency_key")
        if cfg.rate_limit is None and key_of is None:
            return None
        return cls(parts.ctx.scripts.run, parts.extras.get("limit_keys") or parts.ctx.gkeys,
                   parts.ctx.name, None if cfg.rate_limit is None else parse_rate(cfg.rate_limit),
                   key_of, cfg.concurrency_per_key, hold_ms(cfg.visibility_timeout),
                   cfg.heartbeat_interval)

    def __init__(self, run: Callable[[scripts.Call], Any], gkeys: GroupKeys, holder: str,
                 per_second: float | None, key_of: Callable[[Message], str] | None,
                 per_key: int, hold_ms: int, keep_every: float = 1.0) -> None:
        self._run = run
        self._gkeys = gkeys
        self._holder = holder
        self.per_ms = None if per_second is None else per_second / 1000
        self.burst = None if per_second is None else max(1.0, per_second * BURST_SECONDS)
        self.key_of = key_of
        self.per_key = per_key
        self.hold_ms = hold_ms
        self.holds: dict[bytes, str] = {}  # delivery ref -> the semaphore it holds
        self._keep_every = keep_every  # s between renewals of the holds

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

    async def before_start(self, d: Delivery) -> Verdict:
        """Whether ``d`` may start now under the key cap and the rate (`Wait`: not yet,
        also while Redis cannot tell); `Fail`: the user's ``concurrency_key`` raised, and
        the job fails with its error like with a handler's."""
        try:
            if not await self.take_key(d):
                return Wait(retry_key_after())
            await self.take_rate()
            return GO
        except asyncio.CancelledError:
            raise
        except KeyFailed as failed:
            return Fail(failed.error)
        except Exception as exc:
            fault = classify(exc)
            if fault is Fault.FATAL:
                raise
            # an outage is reported once by the worker, not once per job that waits in it
            log.log(logging.DEBUG if fault is Fault.TRANSIENT else logging.WARNING,
                    "limits unavailable (%s); the job waits", exc, extra=fields(
                        stream=d.msg.stream, group=self._gkeys.name, key=d.msg.key))
            return Wait(LIMITS_DOWN)

    async def after_run(self, d: Delivery) -> None:
        """The job ended (or will not start): free its key's hold."""
        await self.release(d)

    def keepers(self) -> list[tuple[str, Step]]:
        if self.key_of is None:
            return []
        return [("limits", lambda: self.keep_step(self._keep_every))]

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
