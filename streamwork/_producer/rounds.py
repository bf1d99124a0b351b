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
from typing import Any, Generic, TypeAlias, TypeVar

import redis.exceptions

from streamwork._redis import connection, scripts
from streamwork._redis.faults import is_transient
from streamwork._telemetry.logs import seconds
from streamwork._text import credentials_hint, redact_url
from streamwork._wire.codec import BODY_FIELD
from streamwork.errors import ConfigError, RedisUnavailable

#: the producer's logger (a send waiting on an outage says so here)
log = logging.getLogger("streamwork.producer")

T = TypeVar("T")


# Each command's ``issue`` makes its call on a redis-py client (and its script registry):
# the reply from a sync client, an awaitable of it from an asyncio one.


@dataclass(frozen=True, slots=True)
class Xadd:
    """XADD one encoded job; ``maxlen``: trim the stream to about that many entries."""

    stream: str
    body: bytes
    maxlen: int | None

    def issue(self, client: Any, runner: Any) -> Any:
        return client.xadd(self.stream, {BODY_FIELD: self.body}, maxlen=self.maxlen,
                           approximate=True)


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


Command: TypeAlias = Xadd | Script | Get | SetIfMissing | Groups | HashSet | HashGetAll | Delete
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


def attempt(request: Command, what: str, url: str, retry_timeout: float) -> Steps[Any]:
    """The reply to ``request``, retried while its errors are transient: at once, then
    after a backoff (50 ms doubling to 2 s, jittered), until ``retry_timeout`` seconds have
    passed since the retries began; then RedisUnavailable (``what`` says what failed)."""
    try:
        return (yield request)  # the usual case: no retry state built at all
    except Exception as exc:
        if not is_transient(exc):
            raise refused(exc, url) from exc
    started, failures = time.monotonic(), 0
    while True:
        try:
            return (yield request)
        except Exception as exc:
            if not is_transient(exc):
                raise refused(exc, url) from exc
            failures += 1
            if time.monotonic() - started >= retry_timeout:
                raise RedisUnavailable(what, url, exc) from exc
            if failures == 1:
                waiting(what, url, exc, retry_timeout)
        yield Sleep(connection.reconnect_delay(failures))


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
