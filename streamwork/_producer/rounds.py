"""The round trips the producer's steps ask for, and how the steps are driven.

The steps (`core`, `jobs`) are generators that do no I/O: each yields a request, receives
its reply (or has its error thrown in) and finally returns what the public method returns.
The shells (`shells`) perform the requests, the sync one blocking, the async one awaiting.
A transport failure is retried here, once for both shells (`attempt`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeAlias, TypeVar

import redis
import redis.exceptions

from streamwork._redis import acl, connection, scripts
from streamwork._redis.faults import is_transient
from streamwork._telemetry.logs import seconds
from streamwork._text import credentials_hint, redact_url
from streamwork.errors import ConfigError, PermissionDenied, RedisUnavailable

#: the producer's logger (a send waiting on an outage says so here)
log = logging.getLogger("streamwork.producer")

T = TypeVar("T")


# Each command's ``issue`` makes its call on a redis-py client (and its script registry):
# the reply from a sync client, an awaitable of it from an asyncio one.


@dataclass(frozen=True, slots=True)
class Script:
    """One script call (produce, schedule, cancel)."""

    call: scripts.Call

    def issue(self, client: Any, runner: Any) -> Any:
        return runner.run(self.call)


@dataclass(frozen=True, slots=True)
class Get:
    """GET one key (a job record, or a stream's recorded partition count)."""

    key: str

    def issue(self, client: Any, runner: Any) -> Any:
        return client.get(self.key)


@dataclass(frozen=True, slots=True)
class MGet:
    """GET several keys of one slot in one command (a job record and its progress)."""

    keys: tuple[str, ...]

    def issue(self, client: Any, runner: Any) -> Any:
        return client.mget(self.keys)


@dataclass(frozen=True, slots=True)
class SetIfMissing:
    """SET NX GET: store ``value`` unless the key exists; the reply is what was there."""

    key: str
    value: int

    def issue(self, client: Any, runner: Any) -> Any:
        return client.set(self.key, self.value, nx=True, get=True)


@dataclass(frozen=True, slots=True)
class Groups:
    """XINFO GROUPS of one stream (a missing stream is a ResponseError)."""

    stream: str

    def issue(self, client: Any, runner: Any) -> Any:
        return client.xinfo_groups(self.stream)


@dataclass(frozen=True, slots=True)
class HashSet:
    """HSET the ``fields`` of one hash (a group's pause)."""

    key: str
    fields: dict[str, str | int]

    def issue(self, client: Any, runner: Any) -> Any:
        return client.hset(self.key, mapping=self.fields)


@dataclass(frozen=True, slots=True)
class HashGetAll:
    """HGETALL one hash (a group's pause); the reply is a dict, empty if there is none."""

    key: str

    def issue(self, client: Any, runner: Any) -> Any:
        return client.hgetall(self.key)


@dataclass(frozen=True, slots=True)
class Delete:
    """DEL one key; the reply is how many were there (0 or 1)."""

    key: str

    def issue(self, client: Any, runner: Any) -> Any:
        return client.delete(self.key)


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (a retry's backoff, or `result`'s pause); the reply is None."""

    seconds: float


Command: TypeAlias = (Script | Get | MGet | SetIfMissing | Groups | HashSet | HashGetAll
                     | Delete)
Request: TypeAlias = "Command | Sleep"
Steps: TypeAlias = Generator[Request, Any, T]


@dataclass(frozen=True, slots=True)
class Result(Generic[T]):
    """What the steps returned: the public method's result."""

    value: T


def advance(steps: Steps[T], reply: Any, error: BaseException | None) -> Request | Result[T]:
    """Feed the steps the outcome of their last request (``error`` is thrown in); get their
    next request or their result."""
    try:
        if error is not None:
            return steps.throw(error)
        return steps.send(reply)
    except StopIteration as stop:
        return Result(stop.value)


#: the command each request sends (a refused key is then told with its command)
_COMMANDS: Final = {"Get": "get", "MGet": "mget", "SetIfMissing": "set",
                    "Groups": "xinfo|groups", "HashSet": "hset", "HashGetAll": "hgetall",
                    "Delete": "del"}


def _refused(exc: BaseException, request: Command, url: str) -> PermissionDenied | None:
    """`PermissionDenied` naming what to grant, if ``exc`` is a refused ACL permission."""
    if isinstance(request, Script):
        keys: tuple[Any, ...] = tuple(request.call.keys)
    else:
        keys = (*getattr(request, "keys", ()), getattr(request, "key", None)
                or getattr(request, "stream", None))
    return acl.explain(exc, url, keys=[k for k in keys if k is not None],
                       command=_COMMANDS.get(type(request).__name__))


class Tally:
    """What the failed attempts of one write tell (`attempt` fills it in): how many failed,
    whether any of them may have reached Redis (its request written, its reply lost: a
    timeout or a connection lost after connecting), and when the first began."""

    __slots__ = ("began", "failures", "reached")

    def __init__(self, blind_retries: bool = False) -> None:
        #: the client retries on its own (redis-py's ``retry``): an attempt may be several
        #: requests, any of which may have reached Redis whatever the last one's error
        self.reached = blind_retries
        self.failures = 0
        self.began = time.monotonic()

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        if not _before_request(exc):
            self.reached = True


def _before_request(exc: BaseException) -> bool:
    """Whether ``exc`` proves the request was never written: the connection could not be
    opened (redis-py's "Error ... connecting to ..." / "Timeout connecting to server"), or
    Redis answered with an error (LOADING, READONLY, OOM, BUSY, ...: a script refused
    whole)."""
    if isinstance(exc, redis.ResponseError):
        return True
    text = str(exc)
    return " connecting to " in text or text.startswith("Timeout connecting to server")


class Budget:
    """The retry deadline the round trips of one call share (a send's partition check and
    its write), so that the call as a whole retries no longer than ``retry_timeout`` after
    its first failure; ``last`` is the latest error, ``failures`` the count after the first
    (for the backoff)."""

    __slots__ = ("deadline", "failures", "last")

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.failures = 0
        self.last: BaseException | None = None


def attempt(request: Command, what: str, url: str, retry_timeout: float,
            tally: Tally | None = None, budget: Budget | None = None) -> Steps[Any]:
    """The reply to ``request``, retried while its errors are transient: the first failure
    at once (a pooled connection the server closed), then after a backoff (50 ms doubling
    to 2 s, jittered, never past the deadline), until ``retry_timeout`` seconds have passed
    since the first failure; then RedisUnavailable (``what`` says what failed). No attempt
    starts after the deadline, so the whole takes at most ``retry_timeout`` plus two
    attempts (the one that failed first, and the last). ``tally`` (a write's) records what
    the failures tell of whether the request reached Redis; ``budget`` shares the deadline
    with the other round trips of the same call (one that begins past it is not tried)."""
    if budget is None:
        budget = Budget()
    elif budget.deadline is not None and time.monotonic() >= budget.deadline:
        raise RedisUnavailable(what, url, budget.last) from budget.last
    while True:
        try:
            return (yield request)  # the usual case: no retry state touched at all
        except Exception as exc:
            if not is_transient(exc):
                denied = _refused(exc, request, url)
                if denied is not None:
                    raise denied from exc
                told = refused(exc, url)
                if told is exc:
                    raise
                raise told from exc
            if tally is not None:
                tally.failed(exc)
            budget.last = exc
            now = time.monotonic()
            if budget.deadline is None:  # the call's first failure: retried at once
                budget.deadline = now + retry_timeout
                continue
            left = budget.deadline - now
            if left <= 0:
                raise RedisUnavailable(what, url, exc) from exc
            budget.failures += 1
            if budget.failures == 1:  # failed twice in a row: it waits for Redis now
                waiting(what, url, exc, retry_timeout)
        yield Sleep(min(connection.reconnect_delay(budget.failures), left))


#: monotonic time of the last `waiting` WARNING per URL: one per retry window, not one
#: per send of a busy producer
_WARNED: dict[str, float] = {}


def waiting(what: str, url: str, exc: BaseException, retry_timeout: float) -> None:
    """A request failed twice in a row (at once, then retried at once): it now waits for
    Redis. One WARNING saying so and for how long, at most one per ``retry_timeout`` per
    URL (the others at DEBUG), so a caller blocked in ``send`` is not left without a word."""
    now = time.monotonic()
    level = logging.DEBUG if now - _WARNED.get(url, -retry_timeout) < retry_timeout \
        else logging.WARNING
    if level == logging.WARNING:
        _WARNED[url] = now
    log.log(level, "%s: Redis at %s is unavailable (%s: %s); retrying for up to %s s "
            "(retry_timeout) before raising RedisUnavailable", what, redact_url(url),
            type(exc).__name__, exc, seconds(retry_timeout))


class CredentialsRefused(ConfigError, redis.exceptions.AuthenticationError):
    """The server refused the URL's credentials: a ConfigError (of option ``url``) saying
    what to put in the URL, and still the redis-py AuthenticationError it was."""


def refused(exc: BaseException, url: str) -> BaseException:
    """``exc``, or a `CredentialsRefused` saying what to do if the server refused the URL's
    credentials (none given where it needs a password, or wrong ones)."""
    hint = credentials_hint(exc)
    if not hint:
        return exc
    return CredentialsRefused("url", f"Redis at {redact_url(url)} refused the connection: "
                                     f"{hint} (it said: {type(exc).__name__}: {exc})")
