"""Worker options: declared once (WorkerOptions), checked and frozen per worker (WorkerConfig).

Every option is checked when a worker is built; a bad value raises ConfigError naming the
option and what it accepts, before anything touches Redis.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import re
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Final

from streamwork._redis import sentinel
from streamwork._wire.codec import DEFAULT_MAX_PAYLOAD_BYTES
from streamwork._wire.keys import StreamKeys, check_name
from streamwork._wire.partitions import (
    check_partitions,
    check_stream,
    check_subset,
    partition_names,
)
from streamwork._wire.priorities import DEFAULT_WEIGHTS, check_order, parse_weights
from streamwork._wire.records import DEFAULT_MAX_RESULT_BYTES
from streamwork._wire.schedules import check_catch_up
from streamwork.errors import ConfigError

#: heartbeat every visibility_timeout/3, so two missed beats still leave margin
HEARTBEAT_FRACTION: Final = 1 / 3

#: how alike (difflib's ratio) a worker class attribute's name must be to an option's to
#: be refused as a misspelling of it: catches one or two wrong letters in a name
#: (visiblity_timeout, dedupe, partition) and leaves other names alone (timeout_handler)
NEAR_OPTION: Final = 0.8


class WorkerOptions:
    """The options of a worker, declared once: `StreamWorker` inherits them as class
    attributes (their defaults), `WorkerConfig` holds a checked, frozen copy, and
    ``streamwork run`` gets one ``--option-name`` per option from `HELP`. Durations are
    float seconds."""

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
    partitions: int = 1
    ordered: bool = False
    only_partitions: tuple[int, ...] | None = None
    cancel_running: bool = False
    rate_limit: str | None = None
    concurrency_per_key: int = 1
    catch_up: str = "last"
    batch_max: int = 100
    batch_wait: float = 0.02
    priority_order: str = "strict"
    priority_weights: str = DEFAULT_WEIGHTS


#: one line of help per option (``streamwork run --help``; tests check every option has one)
HELP: Final[dict[str, str]] = {
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
    "partitions": "streams the stream is split into (as the producers say; cluster scale-out)",
    "ordered": "one job in flight per order key, in enqueue order (a lease per partition)",
    "only_partitions": "consume only these partitions (repeat; default: all)",
    "rate_limit": "jobs started per second/minute/hour by the group, across all its workers "
                  "(e.g. 50/s, 600/m)",
    "concurrency_per_key": "jobs in flight per concurrency key across all workers (with "
                           "concurrency_key)",
    "cancel_running": "cancel an async handler whose job is cancelled (else it only sees "
                      "msg.cancelled)",
    "catch_up": "ticks of the schedules missed while no worker ran: last (run the latest), "
                "all, or none",
    "batch_max": "most messages per handle_batch call (batch handlers only)",
    "batch_wait": "s a batch handler's runner waits to fill a batch once it has one message "
                  "(0: take what is ready)",
    "priority_order": "how reads are shared among the high, normal and low levels: strict "
                      "(higher levels drained first) or weighted (priority_weights)",
    "priority_weights": "weighted order: reads of high:normal:low per round (e.g. 8:2:1; "
                        "every level with jobs gets at least one)",
}


def option_types() -> dict[str, Any]:
    """Each option's type, in declaration order."""
    return typing.get_type_hints(WorkerOptions)


class WorkerConfig(WorkerOptions):
    """The checked, frozen options of one worker; build with `WorkerConfig.build` (or with
    keywords). A bad value raises ConfigError naming the option and what it accepts."""

    def __init__(self, **values: Any) -> None:
        names = self.option_names()
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ConfigError(
                unknown[0], f"is not a worker option; known options: {', '.join(names)}")
        for name in names:
            object.__setattr__(self, name, values.get(name, getattr(WorkerOptions, name)))
        self._check()

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"WorkerConfig is frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"WorkerConfig is frozen: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkerConfig) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"WorkerConfig({inner})"

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.option_names()}

    def _check(self) -> None:
        StreamKeys.for_stream(self.stream)  # a name it accepts, not one of its own keys
        check_name("group", self.group)
        _int(self, "concurrency", 1, 10_000)
        _int(self, "max_deliveries", 1, 1_000_000)
        _int(self, "batch_size", 1, 10_000)
        _int(self, "max_payload_bytes", 64, 512 * 1024 * 1024)
        _int(self, "local_cache_size", 0, 100_000_000)
        _int(self, "max_result_bytes", 0, 512 * 1024 * 1024)
        _num(self, "visibility_timeout", 0.05)
        _num(self, "dedup_window", 0.001)
        _num(self, "retry_delay", 0.0)
        _num(self, "retry_max_delay", self.retry_delay)
        _num(self, "read_block", 0.001, 5.0)
        _num(self, "drain_timeout", 0.0)
        _num(self, "consumer_idle_timeout", 1.0)
        _num(self, "local_cache_ttl", 0.0)
        if self.reclaim_interval is not None:
            _num(self, "reclaim_interval", 0.01)
        if self.retention is not None:
            _num(self, "retention", 0.0)
        if self.timeout is not None:
            _num(self, "timeout", 0.001)
        _int(self, "concurrency_per_key", 1, 1_000_000)
        _int(self, "batch_max", 1, 10_000)
        _num(self, "batch_wait", 0.0, 60.0)
        if self.rate_limit is not None:
            parse_rate(self.rate_limit)
        check_catch_up(self.catch_up)
        check_order(self.priority_order)
        parse_weights(self.priority_weights)
        if self.ordered and (self.priority_order != "strict"
                             or self.priority_weights != DEFAULT_WEIGHTS):
            raise ConfigError("priority_order", "ordered mode reads the stream alone, in "
                                                "order: job priorities are not supported with "
                                                "ordered=True; drop the priority options")
        check_partitions(self.partitions)
        check_stream(self.stream, self.partitions)
        object.__setattr__(self, "only_partitions",
                           check_subset(self.only_partitions, self.partitions))
        for flag in ("dedup", "heartbeat", "ordered", "cancel_running"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(flag, f"must be True or False, got {getattr(self, flag)!r}")
        if self.lock_urls is not None:
            _lock_urls(self)
        if self.dedup:
            horizon = self.max_deliveries * (self.visibility_timeout + self.retry_max_delay)
            if self.dedup_window < horizon:
                raise ConfigError(
                    "dedup_window",
                    f"{self.dedup_window:g}s is shorter than the redelivery horizon "
                    f"max_deliveries x (visibility_timeout + retry_max_delay) = {horizon:g}s; a "
                    "job redelivered after its done record expired would run again. Raise "
                    "dedup_window or lower the others.",
                )

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams this worker consumes: its partitions (those of ``only_partitions``),
        or just ``stream``."""
        names = partition_names(self.stream, self.partitions)
        if self.only_partitions is None:
            return names
        return tuple(names[i] for i in self.only_partitions)

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

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(option_types())

    @classmethod
    def build(cls, source: object, overrides: Mapping[str, Any]) -> WorkerConfig:
        """Options from ``source``'s attributes, replaced by ``overrides``; unknown names raise."""
        names = cls.option_names()
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise ConfigError(
                unknown[0], f"is not a worker option{did_you_mean(unknown[0], names)}; "
                            f"known options: {', '.join(names)}"
            )
        values = {n: getattr(source, n) for n in names if hasattr(source, n)}
        values.update(overrides)
        for required in ("stream", "group"):
            if not values.get(required):
                raise ConfigError(
                    required, "is not set: give the worker class a "
                    f"`{required} = \"...\"` attribute or pass {required}=... to from_url"
                )
        return cls(**values)


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming the one of ``names`` closest to ``name``, or "" when
    none is near (`NEAR_OPTION`)."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=NEAR_OPTION)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_attributes(cls: type, base: type, extra: Iterable[str] = ()) -> None:
    """Refuse a class attribute of worker class ``cls`` (or of its bases that ``base``
    does not have) whose name is near an option's (or one of ``extra``) without being
    one: a misspelt option would otherwise be ignored without a word. Private names,
    methods, properties and the names ``base`` has are not looked at."""
    options = [*WorkerConfig.option_names(), *extra]
    own = set(dir(base))
    for klass in cls.__mro__:
        if klass in base.__mro__:
            continue
        for name, value in vars(klass).items():
            if (name.startswith("_") or name in own or inspect.isroutine(value)
                    or inspect.isdatadescriptor(value)):
                continue
            hint = did_you_mean(name, options)
            if hint:
                raise ConfigError(name, (
                    f"is not a worker option (a class attribute of {klass.__qualname__}, "
                    f"which would be ignored){hint} Rename it, or prefix it with _ if it is "
                    "your own"))


#: schemes a Redlock master may have: one server each (a sentinel URL: its service's primary)
_LOCK_SCHEMES: Final = ("redis://", "rediss://", "unix://", *sentinel.SCHEMES)
_RATE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
_PER: Final = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
               "h": 3600.0, "hour": 3600.0}


def parse_rate(text: object) -> float:
    """``rate_limit`` ("50/s", "600/m", "10/h") as jobs per second; ConfigError otherwise."""
    found = _RATE.match(text) if isinstance(text, str) else None
    if found is None or float(found.group(1)) <= 0:
        raise ConfigError("rate_limit", f"must look like '50/s', '600/m' or '10/h' (jobs "
                                        f"started per second, minute or hour), got {text!r}")
    return float(found.group(1)) / _PER[found.group(2)]


def _lock_urls(cfg: WorkerConfig) -> None:
    urls = cfg.lock_urls
    if isinstance(urls, str) or not urls or not all(isinstance(u, str) for u in urls):
        raise ConfigError("lock_urls", f"must be a non-empty list of Redis URLs, got {urls!r}")
    for url in urls:
        if not url.startswith(_LOCK_SCHEMES):
            raise ConfigError("lock_urls", f"{url!r} is not a {', '.join(_LOCK_SCHEMES)} URL")
        if sentinel.is_sentinel_url(url):
            sentinel.parse(url)  # a malformed one fails here, with what to fix
    if not cfg.dedup:
        raise ConfigError("lock_urls", "job leases are only taken with dedup=True")
    object.__setattr__(cfg, "lock_urls", tuple(urls))


def _int(cfg: WorkerConfig, name: str, low: int, high: int) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(name, f"must be an int from {low} to {high}, got {value!r}")


def _num(cfg: WorkerConfig, name: str, low: float, high: float = math.inf) -> None:
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not (low <= value <= high):
        bound = f"from {low:g} to {high:g}" if high != math.inf else f">= {low:g} and finite"
        raise ConfigError(name, f"must be a number of seconds {bound}, got {value!r}")
