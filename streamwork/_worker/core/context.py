"""What the parts of one consumer share and never change: its settings, names, keys,
client, scripts, lease strategy, done-cache and sources, and the counters they all bump."""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from streamwork._redis.scripts import AsyncScripts
from streamwork._telemetry import api as telemetry
from streamwork._telemetry.logs import fields
from streamwork._wire.keys import GroupKeys, StreamKeys
from streamwork._worker.core.done_cache import KeyCache, local_cache
from streamwork._worker.core.leases import LeaseStrategy, RedisLease
from streamwork._worker.core.options import CoreConfig
from streamwork._worker.core.redlock_lease import RedlockLease
from streamwork._worker.core.sources import Sources


@dataclass(slots=True)
class Tally:
    """A consumer's live counters, and whether an OpenTelemetry SDK is there to count and
    trace too (looked at again now and then: without one, spans and instruments are
    skipped entirely; they would be no-ops, but not free)."""

    stream: str
    group: str
    counts: Counter[str] = field(default_factory=Counter)
    tracing: bool = False
    metering: bool = False

    def refresh(self) -> None:
        self.tracing = telemetry.tracing_enabled()
        self.metering = telemetry.metrics_enabled()

    def count(self, what: str, n: int = 1, outcome: str | None = None) -> None:
        """Bump a live counter and its OpenTelemetry twin."""
        self.counts[what] += n
        if not self.metering:
            return
        if what in telemetry.COUNTERS:
            telemetry.count(what, n, self.stream, self.group, outcome)
        elif what.startswith("lock_"):
            telemetry.count_lock(what[5:], n, self.stream, self.group)


@dataclass(frozen=True, slots=True)
class Context:
    """One consumer's fixed parts, handed to its runners, flusher and loops."""

    cfg: CoreConfig
    name: str  #: the consumer's name in the group
    worker_name: str  #: the worker's (dead letters name it)
    keys: StreamKeys
    gkeys: GroupKeys
    redis: Any
    scripts: AsyncScripts
    leases: LeaseStrategy
    cache: KeyCache | None  #: keys completed here recently (dedup on)
    tally: Tally
    sources: Sources  #: the streams it reads deliveries from

    def count(self, what: str, n: int = 1, outcome: str | None = None) -> None:
        self.tally.count(what, n, outcome)

    def fields(self, **more: Any) -> dict[str, Any]:
        """A log line's structured fields: stream, group, consumer (None: left out) and
        ``more``."""
        return fields(**{"stream": self.cfg.stream, "group": self.cfg.group,
                         "consumer": self.name, **more})


def build(cfg: CoreConfig, client: Any, name: str, worker_name: str,
          cache: KeyCache | str | None) -> Context:
    """The context of consumer ``name`` talking to Redis through ``client``: its scripts
    (told later whether the server takes script flags), the lease strategy the options ask
    for, and with dedup on the done-cache given (a string: a built-in local one)."""
    keys = StreamKeys.for_stream(cfg.stream)
    gkeys = keys.group(cfg.group)
    run = AsyncScripts(client, flags=False)
    if not cfg.dedup:
        cache = None
    elif isinstance(cache, str):
        cache = local_cache(None, cfg.local_cache_size, cfg.local_cache_ttl)
    kind = LeaseStrategy if not cfg.dedup else RedlockLease if cfg.lock_urls else RedisLease
    return Context(cfg, name, worker_name, keys, gkeys, client, run,
                   kind(run, gkeys, cfg, name, f"{name}:{secrets.token_hex(10)}"), cache,
                   Tally(cfg.stream, cfg.group), Sources(cfg.stream, gkeys.retry))
