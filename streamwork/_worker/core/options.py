"""The options of the delivery core, declared once (`CoreOptions`), with their help and
checks; features declare their own (seam.py), and `_worker/config.py` puts them together.

Durations are float seconds. A bad value raises ConfigError naming the option and what it
accepts, before anything touches Redis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from streamwork._redis import sentinel, tls
from streamwork._wire.codec import DEFAULT_MAX_PAYLOAD_BYTES
from streamwork._wire.keys import StreamKeys, check_name
from streamwork._wire.records import DEFAULT_MAX_RESULT_BYTES
from streamwork.errors import ConfigError

#: heartbeat every visibility_timeout/3, so two missed beats still leave margin
HEARTBEAT_FRACTION: Final = 1 / 3


class CoreOptions:
    """The core's worker options and their defaults (class attributes)."""

    stream: str = ""
    group: str = ""
    concurrency: int = 16
    visibility_timeout: float = 30.0
    max_deliveries: int = 5
    dedup: bool = True
    dedup_window: float = 3600.0
    retry_delay: float = 1.0
    retry_max_delay: float = 300.0
    batch_size: int = 100
    read_block: float = 1.0
    drain_timeout: float = 30.0
    heartbeat: bool = True
    reclaim_interval: float | None = None
    retention: float | None = 86400.0
    consumer_idle_timeout: float = 3600.0
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    local_cache_size: int = 100_000
    local_cache_ttl: float = 60.0
    lock_urls: tuple[str, ...] | None = None
    timeout: float | None = 300.0
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    cancel_running: bool = False
    batch_max: int = 100
    batch_wait: float = 0.02


class CoreConfig(CoreOptions):
    """The core's view of a worker's checked options (`WorkerConfig` is one)."""

    @property
    def visibility_ms(self) -> int:
        return max(1, round(self.visibility_timeout * 1000))

    @property
    def heartbeat_interval(self) -> float:
        return self.visibility_timeout * HEARTBEAT_FRACTION

    @property
    def reclaim_every(self) -> float:
        """Seconds between XAUTOCLAIM sweeps (default: half the visibility timeout, <= 5 s)."""
        if self.reclaim_interval is not None:
            return self.reclaim_interval
        return min(self.visibility_timeout / 2, 5.0)


#: one line of help per core option (``streamwork run --help``)
CORE_HELP: Final[Mapping[str, str]] = {
    "stream": "stream to consume",
    "group": "consumer-group name",
    "concurrency": "handlers in flight per process",
    "visibility_timeout": "s of idle time after which another worker may reclaim a delivery "
                          "(also the lease TTL)",
    "max_deliveries": "deliveries before a job goes to the dead letters",
    "dedup": "once-only effect per job key and group (job record: lease, then done; fencing token)",
    "dedup_window": "s a done record (and its result) is kept",
    "retry_delay": "s before the first retry (exponential with jitter after)",
    "retry_max_delay": "s, cap of one retry's delay",
    "batch_size": "entries per XREADGROUP/XAUTOCLAIM call",
    "read_block": "s each read blocks waiting for entries",
    "drain_timeout": "s a stopping worker waits for the jobs it holds",
    "heartbeat": "keep live deliveries' idle time and leases fresh",
    "reclaim_interval": "s between XAUTOCLAIM sweeps (none: min(visibility_timeout/2, 5))",
    "retention": "trim fully acknowledged entries older than this many s (none: keep all)",
    "consumer_idle_timeout": "s after which consumers that own nothing are removed",
    "max_payload_bytes": "largest job body in bytes; larger ones are dead-lettered",
    "local_cache_size": "keys completed here kept in an in-process cache (0: no cache)",
    "local_cache_ttl": "s a key stays in the in-process cache",
    "lock_urls": "take job leases from a Redlock over these masters (repeat)",
    "timeout": "s a job may run (none: no limit)",
    "max_result_bytes": "largest handle() result kept in the job record (bigger: not kept)",
    "cancel_running": "cancel an async handler whose job is cancelled (else it only sees "
                      "msg.cancelled)",
    "batch_max": "most messages per handle_batch call (batch handlers only)",
    "batch_wait": "s a batch handler's runner waits to fill a batch once it has one message "
                  "(0: take what is ready)",
}


def check_core(cfg: CoreOptions) -> None:
    """Refuse bad values of the core's options (ConfigError naming the first one)."""
    StreamKeys.for_stream(cfg.stream)  # a name it accepts, not one of its own keys
    check_name("group", cfg.group)
    check_int(cfg, "concurrency", 1, 10_000)
    check_int(cfg, "max_deliveries", 1, 1_000_000)
    check_int(cfg, "batch_size", 1, 10_000)
    check_int(cfg, "max_payload_bytes", 64, 512 * 1024 * 1024)
    check_int(cfg, "local_cache_size", 0, 100_000_000)
    check_int(cfg, "max_result_bytes", 0, 512 * 1024 * 1024)
    check_seconds(cfg, "visibility_timeout", 0.05)
    check_seconds(cfg, "dedup_window", 0.001)
    check_seconds(cfg, "retry_delay", 0.0)
    check_seconds(cfg, "retry_max_delay", cfg.retry_delay)
    check_seconds(cfg, "read_block", 0.001, 5.0)
    check_seconds(cfg, "drain_timeout", 0.0)
    check_seconds(cfg, "consumer_idle_timeout", 1.0)
    check_seconds(cfg, "local_cache_ttl", 0.0)
    if cfg.reclaim_interval is not None:
        check_seconds(cfg, "reclaim_interval", 0.01)
    if cfg.retention is not None:
        check_seconds(cfg, "retention", 0.0)
    if cfg.timeout is not None:
        check_seconds(cfg, "timeout", 0.001)
    check_int(cfg, "batch_max", 1, 10_000)
    check_seconds(cfg, "batch_wait", 0.0, 60.0)
    for flag in ("dedup", "heartbeat", "cancel_running"):
        check_flag(cfg, flag)
    if cfg.lock_urls is not None:
        _lock_urls(cfg)
    if cfg.dedup:
        horizon = cfg.max_deliveries * (cfg.visibility_timeout + cfg.retry_max_delay)
        if cfg.dedup_window < horizon:
            raise ConfigError(
                "dedup_window",
                f"{cfg.dedup_window:g}s is shorter than the redelivery horizon "
                f"max_deliveries x (visibility_timeout + retry_max_delay) = {horizon:g}s; a "
                "job redelivered after its done record expired would run again. Raise "
                "dedup_window or lower the others.",
            )


def check_flag(cfg: object, name: str) -> None:
    """Refuse an option ``name`` of ``cfg`` that is not a bool."""
    if not isinstance(getattr(cfg, name), bool):
        raise ConfigError(name, f"must be True or False, got {getattr(cfg, name)!r}")


#: schemes a Redlock master may have: one server each (a sentinel URL: its service's primary)
_LOCK_SCHEMES: Final = ("redis://", "rediss://", "unix://", *sentinel.SCHEMES)


def _lock_urls(cfg: CoreOptions) -> None:
    urls = cfg.lock_urls
    if isinstance(urls, str) or not urls or not all(isinstance(u, str) for u in urls):
        raise ConfigError("lock_urls", f"must be a non-empty list of Redis URLs, got {urls!r}")
    for url in urls:
        if not url.startswith(_LOCK_SCHEMES):
            raise ConfigError("lock_urls", f"{url!r} is not a {', '.join(_LOCK_SCHEMES)} URL")
        if sentinel.is_sentinel_url(url):
            sentinel.parse(url)  # a malformed one fails here, with what to fix
        try:
            tls.check_url(url)
        except ConfigError as exc:
            raise ConfigError("lock_urls", str(exc).removeprefix("url: ")) from None
    if not cfg.dedup:
        raise ConfigError("lock_urls", "job leases are only taken with dedup=True")
    object.__setattr__(cfg, "lock_urls", tuple(urls))


def check_int(cfg: object, name: str, low: int, high: int) -> None:
    """Refuse an option ``name`` of ``cfg`` that is not an int from ``low`` to ``high``."""
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(name, f"must be an int from {low} to {high}, got {value!r}")


def check_seconds(cfg: object, name: str, low: float, high: float = math.inf) -> None:
    """Refuse an option ``name`` of ``cfg`` that is not a finite number of seconds in range."""
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not (low <= value <= high):
        bound = f"from {low:g} to {high:g}" if high != math.inf else f">= {low:g} and finite"
        raise ConfigError(name, f"must be a number of seconds {bound}, got {value!r}")
