"""Per-job options: what a sender may say about each job it sends, each declared once, here.

Every sender takes the same set: ``Producer.send`` / ``send_many``, ``AsyncProducer``'s
twins, ``msg.send`` / ``msg.send_many`` in a handler and ``streamwork send`` (one
``--name`` flag per option). They all check what they are given with `check_send` or
`check_send_many`, which refuse a name that is not a job option, so a misspelt one fails
the send before anything is enqueued. An option is one `JobOption` in `OPTIONS`:

* ``name``: its ``send`` keyword (and the key of ``msg.options``); ``many``: its
  ``send_many`` keyword: the same for one value shared by every job of the call, or a
  plural for a list with one value per job (``order_key`` -> ``order_keys``);
* ``type``: the type of one value (None always means "not given");
* ``check``: the value to carry (or to route the send by), else a ConfigError naming the
  option, what it accepts and what to do;
* ``wire``: its field in the body's options map (``"o"``, see ``codec``), or None for an
  option that only routes the send (``delay``/``at``: the delayed ZSET); ``default``: the
  value that is not carried (None, a constant, or `JOB_KEY`: the job's own key);
* ``read``: how a worker reads the carried value back into ``msg.options`` (a ValueError
  saying what is wrong makes the body undecodable);
* ``help``: one line, for ``streamwork send --help`` and the docs; ``example``: a value it
  takes (the docs show it, the tests send it through every sender); ``wire_help``: what
  its wire value is, for other languages (the wire-format page's table).

Adding an option is one `JobOption` here plus its line in `SendOptions` and in
`SendManyOptions` (checked to agree at import), and the worker feature that acts on
``msg.options[name]``: every sender, the command line and the wire map take it from here.
"""

from __future__ import annotations

import datetime as dt
import math
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from typing_extensions import TypedDict

from streamwork._text import did_you_mean
from streamwork._wire.keys import check_utf8
from streamwork._wire.priorities import DEFAULT as DEFAULT_PRIORITY
from streamwork._wire.priorities import LEVELS, check_priority
from streamwork.errors import ConfigError, DecodeError

__all__ = ["JOB_KEY", "NO_OPTIONS", "OPTIONS", "JobOption", "SendManyOptions", "SendOptions",
           "check_send", "check_send_many", "from_text", "read_wire", "to_many", "type_name",
           "wire_map"]


class SendOptions(TypedDict, total=False):
    """The job options of ``send`` (``**options: Unpack[SendOptions]``): see `OPTIONS`."""

    timeout: float | None
    order_key: str | None
    priority: str | None
    delay: float | None
    at: dt.datetime | None
    expires: float | dt.datetime | None


class SendManyOptions(TypedDict, total=False):
    """The job options of ``send_many``: a per-job option takes one value per job."""

    timeout: float | None
    order_keys: Sequence[str] | None
    priority: str | None
    delay: float | None
    at: dt.datetime | None
    expires: float | dt.datetime | None


class _JobKey:
    """The type of `JOB_KEY`."""

    def __repr__(self) -> str:
        return "JOB_KEY"


#: an option's ``default`` meaning "the job's own key" (an order key equal to it is not carried)
JOB_KEY: Final = _JobKey()
#: the options of a job that carries none (what ``msg.options`` is by default)
NO_OPTIONS: Final[Mapping[str, Any]] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class JobOption:
    """One per-job option (see the module's docstring for each field)."""

    name: str
    many: str
    type: Any  #: a type, or a union of types (``float | datetime``)
    check: Callable[[Any], Any]
    help: str
    example: object
    wire: str | None = None
    wire_help: str = ""
    read: Callable[[Any], Any] = lambda value: value
    default: object = None
    choices: tuple[str, ...] = ()  #: the values it takes, when they are few (for --help)

    @property
    def per_job(self) -> bool:
        """Whether ``send_many`` takes a list of it (one value per job)."""
        return self.many != self.name


# ---- the checks (sender side) and reads (worker side) -------------------------------------


def _number(option: str, value: object, low: str, example: str) -> float:
    """``value`` if it is a finite number (not a bool) above 0 (``low`` ">") or from 0 on
    (">="), else a ConfigError saying so."""
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value < 0 or (low == ">" and value == 0)):
        raise ConfigError(option, f"must be a finite number of seconds {low} 0, got "
                                  f"{value!r}; pass e.g. {option}={example}, or leave it out")
    return value


def time_limit_ms(timeout: object) -> int:
    """A job's ``timeout`` (seconds) as the time limit it carries: milliseconds, >= 1."""
    return max(1, round(_number("timeout", timeout, ">", "30") * 1000))


def _timeout_read(ms: object) -> float:
    if type(ms) is not int or ms <= 0:
        raise ValueError(f"must be a positive int (milliseconds), got {ms!r}")
    return ms / 1000


def check_order_key(order_key: object) -> str:
    """A usable order key: a non-empty str of valid UTF-8 text."""
    if not isinstance(order_key, str) or not order_key:
        raise ConfigError("order_key", f"must be a non-empty str, got {order_key!r}; pass the "
                                       "key whose jobs must keep their order (a customer id, "
                                       "say), or leave it out to use the job's key")
    return check_utf8("order_key", order_key)


def _text_read(value: object) -> str:
    if type(value) is not str or not value:
        raise ValueError(f"must be a non-empty str, got {value!r}")
    return value


def _priority_read(value: object) -> str:
    if value not in LEVELS or type(value) is not str:
        raise ValueError(f"must be one of {', '.join(map(repr, LEVELS))}, got {value!r}")
    return value


def check_delay(delay: object) -> float:
    """A job's ``delay``: seconds from now, >= 0."""
    return _number("delay", delay, ">=", "60")


def check_at(at: object) -> dt.datetime:
    """A job's ``at``: a timezone-aware datetime (when it falls due)."""
    if not isinstance(at, dt.datetime) or at.tzinfo is None:
        raise ConfigError("at", f"must be a timezone-aware datetime, got {at!r}; pass e.g. "
                                "datetime(2026, 12, 1, 6, 0, tzinfo=timezone.utc), or delay= "
                                "seconds instead")
    return at


def check_expires(expires: object) -> int:
    """A job's ``expires``: seconds from now, or a time with a zone, as the Unix
    milliseconds it carries; refused when it has passed already."""
    if isinstance(expires, dt.datetime):
        if expires.tzinfo is None:
            raise ConfigError("expires", f"must be a timezone-aware datetime or seconds from "
                                         f"now, got {expires!r}; pass e.g. expires=3600")
        until = round(expires.timestamp() * 1000)
    else:
        until = round((time.time() + _number("expires", expires, ">", "3600")) * 1000)
    if until <= time.time() * 1000:
        raise ConfigError("expires", f"{expires!r} has passed already: the job would never "
                                     "run; give a later time, or leave it out")
    return until


def _expires_read(ms: object) -> dt.datetime:
    if type(ms) is not int or ms <= 0:
        raise ValueError(f"must be a positive int (Unix milliseconds), got {ms!r}")
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc)


# ---- the declaration ------------------------------------------------------------------------

#: every per-job option, in the order ``--help`` shows them
OPTIONS: Final[tuple[JobOption, ...]] = (
    JobOption("timeout", "timeout", float, time_limit_ms, wire="l", read=_timeout_read,
              example=2.5, wire_help="int > 0: the time limit in milliseconds (seconds x "
                                     "1000, rounded, at least 1)",
              help="this job's time limit in seconds, overriding the worker's timeout"),
    JobOption("order_key", "order_keys", str, check_order_key, wire="ok", read=_text_read,
              default=JOB_KEY, example="customer-7", wire_help="str: non-empty UTF-8 text",
              help="orders the job among those sharing it (ordered mode) and picks the "
                   "partition of a partitioned stream [default: the job key]"),
    JobOption("priority", "priority", str, check_priority, wire="pr", read=_priority_read,
              default=DEFAULT_PRIORITY, choices=LEVELS, example="high",
              wire_help='str: "high" or "low" (the job is on that level\'s stream)',
              help="the job's priority level: workers read higher levels first "
                   "[default: normal]"),
    JobOption("delay", "delay", float, check_delay, example=30.0,
              help="seconds from now before the job is due (it waits in the delayed set)"),
    JobOption("at", "at", dt.datetime, check_at,
              example=dt.datetime(2030, 1, 1, 6, 0, tzinfo=dt.timezone.utc),
              help="when the job is due: a time with a zone (ISO 8601 on the command line, "
                   "e.g. 2026-12-01T06:00:00+00:00)"),
    JobOption("expires", "expires", float | dt.datetime, check_expires, wire="ex",
              read=_expires_read,
              example=dt.datetime(2030, 1, 1, 6, 0, tzinfo=dt.timezone.utc),
              wire_help="int: Unix milliseconds; a worker that has not started the job by "
                        "then drops it (state expired) instead of running it",
              help="drop the job (state expired) if it has not started by then: seconds "
                   "from now, or a time with a zone"),
)
BY_NAME: Final = {o.name: o for o in OPTIONS}  #: the options by send keyword
BY_MANY: Final = {o.many: o for o in OPTIONS}  #: the options by send_many keyword
BY_WIRE: Final = {o.wire: o for o in OPTIONS if o.wire is not None}  #: by wire field


def _join_read(value: object) -> tuple[str, str, int, int]:
    if (not isinstance(value, list) or len(value) != 4 or type(value[0]) is not str
            or type(value[1]) is not str or type(value[2]) is not int
            or type(value[3]) is not int or value[2] < 0 or value[3] <= 0):
        raise ValueError(f"must be [callback stream, join key, child index, ttl ms], got "
                         f"{value!r}")
    return value[0], value[1], value[2], value[3]


#: fields of the options map that no sender takes as an option: what a join writes
#: (`Producer.send_join`): a child's membership ``join`` (its join's callback stream, key,
#: its index among the children and how long the join is kept, ms) and a callback's
#: ``join_of`` (the key of the join it is the callback of)
JOIN_WIRE: Final = "jn"
JOIN_OF_WIRE: Final = "jo"
_INTERNAL: Final[dict[str, tuple[str, Callable[[object], Any]]]] = {
    JOIN_WIRE: ("join", _join_read), JOIN_OF_WIRE: ("join_of", _text_read)}


def _agree() -> None:
    """Refuse at import a declaration that `SendOptions` / `SendManyOptions` do not match
    (an option added to one but not the other, or of another type)."""
    listed: Any = Sequence  # per-job values: Sequence[type]
    for typed, many in ((SendOptions, False), (SendManyOptions, True)):
        hints = typing.get_type_hints(typed)
        want = {(o.many if many else o.name):
                (listed[o.type] if many and o.per_job else o.type) | None for o in OPTIONS}
        if hints != want:
            raise TypeError(f"{typed.__name__} must declare exactly {want} (one line per "
                            f"JobOption in OPTIONS), it declares {hints}")
    if len(BY_MANY) != len(OPTIONS) or len(BY_WIRE) != sum(o.wire is not None for o in OPTIONS):
        raise TypeError("two job options share a send_many keyword or a wire field")


_agree()


# ---- checking what a sender is given ----------------------------------------------------------


def _unknown(name: str, known: Mapping[str, JobOption], call: str) -> ConfigError:
    return ConfigError(name, f"is not a job option of {call}{did_you_mean(name, known)}; the "
                             f"job options are: {', '.join(known)}")


def check_send(given: Mapping[str, Any]) -> dict[str, Any]:
    """``send``'s job options (by send keyword), each checked: by option name, the value to
    carry or route by; None (not given) left out. Raises ConfigError for an unknown name."""
    out = {}
    for name, value in given.items():
        option = BY_NAME.get(name)
        if option is None:
            raise _unknown(name, BY_NAME, "send()")
        if value is not None:
            out[name] = option.check(value)
    return out


def check_send_many(given: Mapping[str, Any], count: int
                    ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """``send_many``'s job options (by send_many keyword) for ``count`` jobs, checked: the
    ones shared by every job, and the per-job ones (a list of ``count`` values each), both
    by option name; None (not given) left out. Raises ConfigError naming the keyword."""
    shared: dict[str, Any] = {}
    per_job: dict[str, list[Any]] = {}
    for name, value in given.items():
        option = BY_MANY.get(name)
        if option is None:
            raise _unknown(name, BY_MANY, "send_many()")
        if value is None:
            continue
        if not option.per_job:
            shared[option.name] = option.check(value)
            continue
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise ConfigError(name, f"must be a list with one {option.name} per job, got "
                                    f"{value!r}; for one job use send({option.name}=...)")
        if len(value) != count:
            raise ConfigError(name, f"has {len(value)} values for {count} jobs: give one "
                                    f"{option.name} per job, in the jobs' order")
        per_job[option.name] = [option.check(v) for v in value]
    return shared, per_job


def to_many(given: Mapping[str, Any]) -> dict[str, Any]:
    """``send``'s job options as ``send_many``'s for one job (a per-job value in a list);
    an unknown name is refused here, named as ``send`` knows it."""
    out = {}
    for name, value in given.items():
        option = BY_NAME.get(name)
        if option is None:
            raise _unknown(name, BY_NAME, "send()")
        out[option.many] = [value] if option.per_job and value is not None else value
    return out


def wire_map(values: Mapping[str, Any], key: str | None = None) -> dict[str, Any]:
    """The body's options map for checked ``values`` (by option name): each option with a
    wire field, under it, unless it is its default (`JOB_KEY`: ``key``)."""
    out = {}
    for name, value in values.items():
        option = BY_NAME[name]
        if option.wire is not None and value != (key if option.default is JOB_KEY
                                                 else option.default):
            out[option.wire] = value
    return out


def read_wire(raw: Mapping[Any, Any]) -> Mapping[str, Any]:
    """A body's options map read back: by option name, python values (read-only). Fields
    no option has are ignored (a newer producer's: readers stay forward compatible); a
    value its option cannot read is a DecodeError ``schema:type:o.<field>``."""
    out = {}
    for field, value in raw.items():
        option = BY_WIRE.get(field) if type(field) is str else None
        if option is not None:
            try:
                out[option.name] = option.read(value)
            except ValueError as exc:
                raise DecodeError(f"schema:type:o.{field}",
                                  f"'o.{field}' ({option.name}) {exc}") from None
        elif type(field) is str and field in _INTERNAL:
            name, read = _INTERNAL[field]
            try:
                out[name] = read(value)
            except ValueError as exc:
                raise DecodeError(f"schema:type:o.{field}",
                                  f"'o.{field}' ({name}) {exc}") from None
    return MappingProxyType(out) if out else NO_OPTIONS


def from_text(option: JobOption, text: str) -> Any:
    """A value of ``option`` from command-line text (by its type; an option of several
    types takes the first that reads it), else ValueError."""
    kinds = typing.get_args(option.type) or (option.type,)
    errors = []
    for kind in kinds:
        try:
            return _text_as(kind, text)
        except ValueError as exc:
            errors.append(str(exc))
    raise ValueError(" and ".join(errors) if len(errors) > 1 else errors[0])


def type_name(option: JobOption) -> str:
    """What the command line calls a value of ``option`` (``--help``)."""
    kinds = typing.get_args(option.type) or (option.type,)
    return " or ".join({"str": "text", "datetime": "time", "float": "seconds"}.get(
        k.__name__, k.__name__) for k in kinds)


def _text_as(kind: Any, text: str) -> Any:
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number of seconds") from None
    if kind is dt.datetime:
        try:  # Python before 3.11 does not take a trailing Z for UTC
            when = dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z")
                                             else text)
        except ValueError:
            raise ValueError(f"{text!r} is not an ISO 8601 time such as "
                             "2026-12-01T06:00:00+00:00") from None
        if when.tzinfo is None:
            raise ValueError(f"{text!r} has no time zone: add one, e.g. +00:00 or Z")
        return when
    return text
