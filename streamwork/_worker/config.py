"""Worker options: the core's and those its features declare (seam.py), put together once
(`WorkerOptions`), checked and frozen per worker (`WorkerConfig`).

Every option is checked when a worker is built; a bad value raises ConfigError naming the
option and what it accepts, before anything touches Redis.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Final

from streamwork._text import did_you_mean as near
from streamwork._wire.partitions import partition_names
from streamwork._worker.core.options import CORE_HELP, CoreConfig, CoreOptions, check_core
from streamwork._worker.features import FEATURES
from streamwork._worker.features.limits import LimitsOptions
from streamwork._worker.features.ordered import OrderedOptions
from streamwork._worker.features.partitions import PartitionOptions
from streamwork._worker.features.priorities import PriorityOptions
from streamwork._worker.features.schedules import ScheduleOptions
from streamwork.errors import ConfigError

#: how alike (difflib's ratio) a worker class attribute's name must be to an option's to
#: be refused as a misspelling of it: catches one or two wrong letters in a name
#: (visiblity_timeout, dedupe, partition) and leaves other names alone (timeout_handler)
NEAR_OPTION: Final = 0.8


class WorkerOptions(CoreOptions, PartitionOptions, PriorityOptions, OrderedOptions,
                    LimitsOptions, ScheduleOptions):
    """The options of a worker, declared once each (by the core or by the feature they
    belong to): `StreamWorker` inherits them as class attributes (their defaults),
    `WorkerConfig` holds a checked, frozen copy, and ``streamwork run`` gets one
    ``--option-name`` per option from `HELP`. Durations are float seconds."""


#: one line of help per option (``streamwork run --help``; tests check every option has one)
HELP: Final[dict[str, str]] = {**CORE_HELP, **{
    name: text for feature in FEATURES for name, text in feature.help.items()}}


def option_types() -> dict[str, Any]:
    """Each option's type: the core's in declaration order, then each feature's."""
    found = dict(typing.get_type_hints(CoreOptions))
    for feature in FEATURES:
        if feature.options is not None:
            found.update(typing.get_type_hints(feature.options))
    return found


class WorkerConfig(CoreConfig, WorkerOptions):
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
        check_core(self)
        for feature in FEATURES:
            feature.check(self)

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

    @property
    def streams(self) -> tuple[str, ...]:
        """The streams this worker consumes: its partitions (those of ``only_partitions``),
        or just ``stream``."""
        names = partition_names(self.stream, self.partitions)
        if self.only_partitions is None:
            return names
        return tuple(names[i] for i in self.only_partitions)

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return _NAMES

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


_NAMES: Final = tuple(option_types())


def check_handler(cfg: WorkerConfig, batch: bool, name: str) -> None:
    """Refuse options that do not go with the worker's kind of handler (``batch``: it
    defines ``handle_batch``), as the features see it."""
    for feature in FEATURES:
        feature.check_handler(cfg, batch, name)


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` naming the one of ``names`` closest to ``name`` (`NEAR_OPTION`),
    else what streamwork calls the option ``name`` is in other job queues (`PEERS`), else
    ""."""
    close = near(name, names, cutoff=NEAR_OPTION)
    return close or peer_hint(name)


_DELIVERIES: Final = ("use max_deliveries: deliveries in all, the first one included "
                      "(retries=3 is max_deliveries=4)")
_CONCURRENCY: Final = ("use concurrency: handlers in flight per process (more processes: "
                       "streamwork run --processes N)")
_PREFETCH: Final = ("use batch_size: entries per read (a worker holds at most concurrency "
                    "plus a batch)")
_STREAM: Final = "use stream (and group, the consumer group that shares its jobs)"
_ACKS: Final = ("streamwork always acknowledges a job after its handler succeeded (a job "
                "whose worker dies is delivered again after visibility_timeout): leave it out")
_BACKOFF: Final = "use retry_delay and retry_max_delay (exponential backoff with jitter)"
#: option names of other job queues (Celery, dramatiq, arq, rq, Sidekiq) and what to do
#: in streamwork instead: such a name on a worker class would be ignored without a word
PEERS: Final[dict[str, str]] = {
    "retries": _DELIVERIES, "max_retries": _DELIVERIES, "max_attempts": _DELIVERIES,
    "max_tries": _DELIVERIES, "retry": _DELIVERIES, "retry_count": _DELIVERIES,
    "acks_late": _ACKS, "ack_late": _ACKS,
    "prefetch": _PREFETCH, "prefetch_count": _PREFETCH, "prefetch_multiplier": _PREFETCH,
    "queue": _STREAM, "queue_name": _STREAM, "topic": _STREAM,
    "workers": _CONCURRENCY, "threads": _CONCURRENCY, "processes": _CONCURRENCY,
    "max_jobs": _CONCURRENCY, "worker_concurrency": _CONCURRENCY,
    "num_workers": _CONCURRENCY, "parallelism": _CONCURRENCY,
    "time_limit": "use timeout: seconds a job may run", "job_timeout": "use timeout",
    "soft_time_limit": "use timeout: seconds a job may run",
    "retry_backoff": _BACKOFF, "backoff": _BACKOFF,
    "min_backoff": "use retry_delay", "max_backoff": "use retry_max_delay",
    "rate": "use rate_limit (e.g. '50/s')", "throttle": "use rate_limit (e.g. '50/s')",
    "unique": "use dedup", "idempotent": "use dedup", "deduplicate": "use dedup",
    "visibility": "use visibility_timeout", "ack_timeout": "use visibility_timeout",
}


def peer_hint(name: str) -> str:
    """``"; that is another job queue's option: use ..."`` if ``name`` is another job
    queue's option name (`PEERS`), else ""."""
    use = PEERS.get(name.lower())
    return f"; that is another job queue's option: {use}" if use else ""


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
            hint = near(name, options, cutoff=NEAR_OPTION) or (
                peer_hint(name) if _scalar(value) else "")
            if hint:
                end = "" if hint.endswith("?") else "."
                raise ConfigError(name, (
                    f"is not a worker option (a class attribute of {klass.__qualname__}, "
                    f"which would be ignored){hint}{end} Rename it, or prefix it with _ if "
                    "it is your own"))


def _scalar(value: object) -> bool:
    """A value an option would take (``retries = 3``, ``queue = "emails"``), not an object of
    the user's own (a client, a queue)."""
    return value is None or isinstance(value, (bool, int, float, str, tuple, list))
