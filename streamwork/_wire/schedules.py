"""Periodic jobs: the `Every` and `Cron` schedules, the ticks they make, and which ticks a
worker enqueues after some were missed. Pure, no I/O (the loop is in _scheduler.py).

A schedule ticks at fixed times: ``Every(60)`` at the multiples of 60 s of Unix time,
``Cron("*/5 * * * *", tz="Europe/Berlin")`` whenever the expression matches the wall clock
of its time zone (cronsim evaluates it, daylight-saving changes included, the way Debian's
cron does). Each tick is one job with the key ``<name>:<tick time>`` (ISO 8601 UTC with
milliseconds, fixed width, so two (name, tick) pairs never share a key).

A tick more than `MISSED_AFTER_MS` overdue when a worker looks counts as *missed* (every
worker was down, or Redis unreachable); the worker's ``catch_up`` decides what becomes of
missed ticks: ``"last"`` runs only the latest of them (and none if a tick on time follows
it), ``"all"`` runs each of them (the latest `MAX_CATCH_UP`), ``"none"`` runs none. Ticks
on time are always enqueued. Every worker applies the same rule, so the outcome does not
depend on which worker gets there first.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from streamwork._text import text
from streamwork._wire.codec import DEFAULT_MAX_PAYLOAD_BYTES, decode_fields, pack_body
from streamwork._wire.extensions import (
    USER_CODES,
    Codec,
    encode_builtin,
    packer,
    registered_anywhere,
)
from streamwork._wire.payloads import to_plain
from streamwork.errors import ConfigError, PayloadTooLarge

__all__ = ["CATCH_UP", "MAX_CATCH_UP", "MISSED_AFTER_MS", "Cron", "Every", "Schedule",
           "check_catch_up", "check_schedules", "from_description", "plan", "tick_key",
           "tick_text"]

CATCH_UP: Final = ("last", "all", "none")  #: the catch_up policies
#: a tick this late (ms) when a worker looks has been missed: ``catch_up`` decides. Longer
#: than a live worker's stalls (event-loop lag, a Redis hiccup ridden out with backoff), so
#: a tick that is merely late is still enqueued, whatever the policy
MISSED_AFTER_MS: Final = 10_000
MAX_CATCH_UP: Final = 1000  #: catch_up="all" enqueues at most the latest this many ticks
MIN_EVERY: Final = 0.1  #: s, the shortest interval of Every (faster: loop in a handler)
#: the largest name accepted, in UTF-8 bytes (it becomes part of job keys and Redis keys)
MAX_NAME_BYTES: Final = 200
#: the error that says how to get the cron library
_NEED_CRONSIM: Final = ("Cron needs the cronsim library, which comes with the 'schedules' "
                        "extra: pip install 'streamwork[schedules]'")


def check_catch_up(value: object) -> str:
    """``value`` if it is a catch_up policy, else ConfigError."""
    if value not in CATCH_UP:
        raise ConfigError("catch_up", f"must be one of {', '.join(map(repr, CATCH_UP))} "
                                      f"(what becomes of ticks missed while no worker ran), "
                                      f"got {value!r}")
    assert isinstance(value, str)
    return value


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError("schedules", f"a schedule's name must be a non-empty str, got "
                                       f"{name!r}")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigError("schedules", f"schedule name {name!r} is not valid UTF-8") from None
    if size > MAX_NAME_BYTES or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ConfigError("schedules", f"schedule name {name!r} must be at most "
                                       f"{MAX_NAME_BYTES} bytes without control characters")
    return name


def _check_payload(payload: Any, name: str) -> None:
    """Refuse a payload no worker could send; the types some codec registered (the
    worker's is not known yet) pass here and are checked by `check_schedules`."""
    try:
        packer(_ANY_TYPE).pack(to_plain(payload, _ANY_TYPE))  # a Packer per thread
    except (TypeError, ValueError, OverflowError) as exc:
        shown = str(exc).removeprefix("payload: ")
        raise ConfigError("schedules", f"the payload of schedule {name!r} cannot be encoded "
                                       f"as MessagePack ({shown}); give dicts, lists, str, "
                                       f"bytes, numbers, bools, None, Decimal, UUID, date, "
                                       f"aware datetime, or types of the worker's codec "
                                       f"(registered before the schedule is made)"
                          ) from None


class _AnyType(Codec):
    """A codec taking as its own every type some codec registered (with any data): a
    schedule's payload is checked before the worker's codec is known."""

    def handles(self, cls: type) -> bool:
        return registered_anywhere(cls)

    def encode(self, obj: Any) -> Any:
        if registered_anywhere(type(obj)):
            return msgpack.ExtType(USER_CODES[-1], b"")
        return encode_builtin(obj)


_ANY_TYPE: Final = _AnyType()


def tick_text(tick_ms: int) -> str:
    """A tick time as fixed-width ISO 8601 UTC with milliseconds (2026-11-30T16:05:00.000Z)."""
    seconds, ms = divmod(tick_ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def tick_key(name: str, tick_ms: int) -> str:
    """The job key of one tick: ``<schedule name>:<tick time>``."""
    return f"{name}:{tick_text(tick_ms)}"


@dataclass(frozen=True, init=False)
class Every:
    """A schedule that ticks every ``seconds`` (>= 0.1, whole milliseconds), aligned to
    Unix time: ``Every(60)`` at every full minute, ``Every(3600)`` at every full hour (UTC).

    Each tick enqueues one job with ``payload`` and the key ``<name>:<tick time>``; the
    default ``name`` is ``every-<seconds>s``. Put it in a worker's ``schedules``."""

    seconds: float
    payload: Any
    name: str

    def __init__(self, seconds: float | dt.timedelta, payload: Any = None,
                 name: str | None = None) -> None:
        if isinstance(seconds, dt.timedelta):
            seconds = seconds.total_seconds()
        if (not isinstance(seconds, (int, float)) or isinstance(seconds, bool)
                or not math.isfinite(seconds) or seconds < MIN_EVERY
                or abs(seconds * 1000 - round(seconds * 1000)) > 1e-6):
            raise ConfigError("schedules", f"Every(seconds) needs a number of seconds >= "
                                           f"{MIN_EVERY:g} in whole milliseconds (e.g. 60 or "
                                           f"0.5), got {seconds!r}")
        interval_ms = round(seconds * 1000)
        if name is None:
            shown = str(interval_ms // 1000) if interval_ms % 1000 == 0 else repr(seconds)
            name = f"every-{shown}s"
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "name", _check_name(name))
        _check_payload(payload, self.name)

    @property
    def interval_ms(self) -> int:
        return round(self.seconds * 1000)

    @property
    def tz(self) -> str:
        """Every ticks on Unix time, whatever the time zone."""
        return "UTC"

    def next_after(self, ms: int) -> int | None:
        """The first tick later than ``ms`` (Unix ms)."""
        every = self.interval_ms
        return (ms // every + 1) * every

    def ticks(self, after_ms: int, upto_ms: int, limit: int) -> tuple[list[int], bool]:
        """The latest ``limit`` ticks in (after_ms, upto_ms], ascending, and whether older
        ticks in that range were left out."""
        every = self.interval_ms
        first = (after_ms // every + 1) * every
        last = (upto_ms // every) * every
        if last < first or limit < 1:
            return [], last >= first
        start = max(first, last - (limit - 1) * every)
        return list(range(start, last + 1, every)), start > first

    def describe(self) -> dict[str, Any]:
        """What ``streamwork schedules`` shows (and rebuilds the schedule from)."""
        return {"kind": "every", "every": self.seconds, "tz": "UTC"}


@dataclass(frozen=True, init=False)
class Cron:
    """A schedule that ticks when the cron expression ``expr`` matches the wall clock in
    time zone ``tz`` (an IANA name such as "Europe/Berlin"; default "UTC").

    Five fields (minute hour day-of-month month day-of-week), or six with seconds first;
    ``L``, ``W`` and ``MON#2`` work as in cronsim, which evaluates the expression (the
    ``schedules`` extra), daylight-saving changes included as Debian's cron handles them.
    Each tick enqueues one job with ``payload`` and the key ``<name>:<tick time>``; the
    default ``name`` is ``cron-<expr>`` (``cron-<expr>@<tz>`` outside UTC)."""

    expr: str
    tz: str
    payload: Any
    name: str

    def __init__(self, expr: str, tz: str = "UTC", payload: Any = None,
                 name: str | None = None) -> None:
        if not isinstance(expr, str) or not expr.strip():
            raise ConfigError("schedules", f"Cron(expr) needs a cron expression such as "
                                           f"'*/5 * * * *', got {expr!r}")
        expr = " ".join(expr.split())
        zone = _zone(tz)
        try:
            from cronsim import CronSim, CronSimError
        except ImportError:
            raise ConfigError("schedules", _NEED_CRONSIM) from None
        try:
            it = CronSim(expr, dt.datetime.now(zone).replace(microsecond=0))
        except CronSimError as exc:
            raise ConfigError("schedules", f"cron expression {expr!r}: {exc}; write five "
                                           f"fields (minute hour day-of-month month "
                                           f"day-of-week, e.g. '*/5 * * * *'), or six with "
                                           f"seconds first") from None
        try:
            next(it)
        except StopIteration:
            raise ConfigError("schedules", f"cron expression {expr!r} never matches in the "
                                           f"next 50 years; check its day and month "
                                           f"fields") from None
        if name is None:
            name = f"cron-{expr}" if tz == "UTC" else f"cron-{expr}@{tz}"
        object.__setattr__(self, "expr", expr)
        object.__setattr__(self, "tz", tz)
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "name", _check_name(name))
        _check_payload(payload, self.name)

    def _iter(self, ms: int, reverse: bool = False) -> Any:
        from cronsim import CronSim

        start = dt.datetime.fromtimestamp(ms // 1000, _zone(self.tz))
        if reverse:  # cronsim then yields the whole second itself first, if it matches
            start = start.replace(microsecond=1)
        return CronSim(self.expr, start, reverse=reverse)

    def next_after(self, ms: int) -> int | None:
        """The first tick later than ``ms`` (Unix ms); None if there is none in 50 years."""
        try:
            return int(next(self._iter(ms)).timestamp()) * 1000
        except StopIteration:
            return None

    def ticks(self, after_ms: int, upto_ms: int, limit: int) -> tuple[list[int], bool]:
        """The latest ``limit`` ticks in (after_ms, upto_ms], ascending, and whether older
        ticks in that range were left out."""
        if upto_ms <= after_ms:
            return [], False
        found: list[int] = []
        for when in self._iter(upto_ms, reverse=True):
            tick = int(when.timestamp()) * 1000
            if tick <= after_ms:
                break
            if len(found) == limit:
                return found[::-1], True
            found.append(tick)
        return found[::-1], False

    def describe(self) -> dict[str, Any]:
        """What ``streamwork schedules`` shows (and rebuilds the schedule from)."""
        return {"kind": "cron", "cron": self.expr, "tz": self.tz}


Schedule = Every | Cron


def _zone(tz: object) -> dt.tzinfo:
    if not isinstance(tz, str) or not tz:
        raise ConfigError("schedules", f"a Cron's tz must be an IANA time zone name such as "
                                       f"'Europe/Berlin' or 'UTC', got {tz!r}")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError("schedules", f"unknown time zone {tz!r}: give an IANA name such as "
                                       f"'Europe/Berlin' or 'UTC' (where the system has no "
                                       f"time zone database, pip install tzdata)") from None


def check_schedules(value: object, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                    convert: Callable[[Any], Any] | None = None,
                    codec: Codec | None = None) -> tuple[Schedule, ...]:
    """A worker's ``schedules``: a list of `Every`/`Cron` with distinct names, each of
    whose jobs the worker's ``codec`` encodes within ``max_payload_bytes`` and, given the
    worker's payload converter ``convert``, carries a payload that validates (else every
    tick would be dead-lettered as ``payload:invalid``)."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, Every, Cron)) or not isinstance(value, Sequence):
        raise ConfigError("schedules", f"must be a list of sw.Every(...) / sw.Cron(...), got "
                                       f"{value!r}")
    seen: set[str] = set()
    for item in value:
        if not isinstance(item, (Every, Cron)):
            raise ConfigError("schedules", f"must hold sw.Every(...) or sw.Cron(...) "
                                           f"schedules, got {item!r}")
        if item.name in seen:
            raise ConfigError("schedules", f"two schedules are named {item.name!r}; give "
                                           f"each a distinct name=... (the name is part of "
                                           f"every tick's job key)")
        seen.add(item.name)
        try:
            body = pack_body(tick_key(item.name, 0), to_plain(item.payload, codec), {}, 0,
                             max_payload_bytes, codec=codec)
        except PayloadTooLarge as exc:
            raise ConfigError("schedules", f"the payload of schedule {item.name!r} is too "
                                           f"large: {exc}") from None
        except ConfigError as exc:  # a type the worker's codec does not know
            raise ConfigError("schedules", f"the payload of schedule {item.name!r} cannot "
                                           f"be sent: {exc}") from None
        if convert is not None:
            _check_typed(item, decode_fields(body, max_payload_bytes, codec)[3], convert)
    return tuple(value)


def _check_typed(item: Schedule, payload: Any, convert: Callable[[Any], Any]) -> None:
    """ConfigError unless ``payload`` (a tick's payload as the worker decodes it) passes
    the worker's payload converter ``convert``."""
    try:
        convert(payload)
    except Exception as exc:  # InvalidPayload, with the validator's message
        how = (f"sw.Every({item.seconds!r}, payload={{...}})" if isinstance(item, Every)
               else f"sw.Cron({item.expr!r}, tz={item.tz!r}, payload={{...}})")
        shown = repr(payload)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise ConfigError("schedules", f"schedule {item.name!r} ticks with the payload "
                                       f"{shown}, which the worker's payload_type "
                                       f"refuses ({text(exc)}), so every tick would be "
                                       f"dead-lettered; give the schedule a payload that "
                                       f"validates: {how}") from None


def from_description(name: str, desc: dict[str, Any]) -> Schedule:
    """The schedule a worker published as ``describe()`` (without its payload)."""
    if desc.get("kind") == "cron":
        return Cron(str(desc["cron"]), tz=str(desc.get("tz", "UTC")), name=name)
    return Every(float(desc["every"]), name=name)


def plan(ticks: Sequence[int], now_ms: int, catch_up: str,
         missed_after_ms: int = MISSED_AFTER_MS) -> list[int]:
    """Which of ``ticks`` (ascending, none later than ``now_ms``, none decided yet) to
    enqueue: those on time always; of the missed ones (more than ``missed_after_ms``
    overdue) all, the latest (only if no tick on time follows it), or none."""
    cutoff = now_ms - missed_after_ms
    missed = 0
    while missed < len(ticks) and ticks[missed] < cutoff:
        missed += 1
    on_time = list(ticks[missed:])
    if catch_up == "all":
        return list(ticks)
    if catch_up == "last" and not on_time:
        return list(ticks[missed - 1:missed])
    return on_time
