"""Redlock over N independent Redis masters, sync (`Redlock`) and asyncio (`AsyncRedlock`).

What it gives and what it does not:

* **Redlock improves availability, not correctness.** A lock survives the loss of a minority
  of masters, but it is a lease: a paused or slow client can keep working after its lease
  ran out, and a master that restarts empty (no AOF, or ``appendfsync everysec`` losing the
  last second) or whose clock jumps can let a second client acquire while the first still
  believes it holds the lock. **Correctness needs fencing**: every grant carries a
  ``fencing_token`` and the protected resource must reject writes carrying a token lower than
  one it has already seen (`fenced_set` for resources in Redis; for SQL, make the update
  require ``last_token <= :token`` and store the token with the row).
* **Fencing tokens** are a quorum max+1 compare-and-set over the same masters (the scheme of
  ``brainix/pottery``'s ``NextID``, after http://antirez.com/news/102): each master keeps a
  counter, a grant reads the counters from at least a quorum, proposes ``max + 1`` and needs a
  quorum to accept it with a "set if greater" script. Tokens strictly increase for as long as
  a quorum answers and keeps its data; there can be gaps (a proposal that lost a race is
  skipped). Tokens are only as monotonic as the counters are durable: a master restarted
  empty, or a failover to a lagging replica, can roll its counter back. Run each master with
  ``appendfsync always`` (or restart a crashed master only after more than the longest lock
  TTL has passed) -- this is also what the Redlock spec asks for locks themselves.
* **Validity** is tracked locally on a monotonic clock (never ``time.time()``)::

      deadline = t_first_request_sent + ttl - (drift_factor * ttl + 2 ms)

  A lock is granted only with a quorum (``N // 2 + 1``) of masters *and* time left before that
  deadline. ``extend()`` is compare-and-PEXPIRE: it never recreates an expired key, needs a
  quorum and time left, and moves the deadline to ``t_extend_sent + ttl - drift``.
* **Hygiene**: lock values are 20 random bytes from `secrets` (hex), a new one per attempt;
  a failed attempt (and any attempt interrupted after it sent its SETs) releases on every
  master with compare-and-delete; retries wait a random, jittered delay. A master that raises
  a Redis error (connection refused, timeout, ...) simply counts as not answering.

Keys: the lock of resource ``R`` is ``redlock:{R}`` and its fencing counter ``redlock:{R}:fence``
(one hash tag, so both live in one Cluster slot). Clients built from URLs get a short socket
timeout and no redis-py retries; clients you pass in are used as they are, so give them a
small ``socket_timeout`` and ``retry=Retry(NoBackoff(), 0)`` or a dead master slows every call.

The rules live once, in ``_Core``, as generators that yield the network rounds they need;
`Redlock` and `AsyncRedlock` are thin shells that perform those rounds (one master after
the other, or all at once with ``asyncio.gather``).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Final, Generic, TypeAlias, TypeVar

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError
from redis.retry import Retry

from .errors import ConfigError, LockLost, LockNotAcquired
from .keys import check_name

__all__ = [
    "DEFAULT_NODE_TIMEOUT",
    "DEFAULT_RETRY_DELAY",
    "DEFAULT_TTL",
    "DRIFT_FACTOR",
    "VALUE_BYTES",
    "AsyncAcquisition",
    "AsyncHeldLock",
    "AsyncRedlock",
    "HeldLock",
    "Redlock",
    "async_fenced_set",
    "drift_allowance",
    "fence_key",
    "fenced_set",
    "lock_key",
    "quorum",
    "validity",
]

DEFAULT_TTL: Final = 10.0  #: seconds a lock lives on each master unless extended
DRIFT_FACTOR: Final = 0.01  #: share of the TTL set aside for clock drift between machines
DRIFT_FLOOR: Final = 0.002  #: seconds always set aside on top (the spec's "+ 2 ms")
DEFAULT_RETRY_DELAY: Final = 0.2  #: upper bound of the random wait between attempts, seconds
DEFAULT_NODE_TIMEOUT: Final = 0.1  #: socket connect/read timeout per master, seconds
VALUE_BYTES: Final = 20  #: random bytes in a lock value
_FENCE_ROUNDS: Final = 3  #: compare-and-set proposals tried per grant before giving up

_T = TypeVar("_T")
_C = TypeVar("_C", redis.Redis, redis.asyncio.Redis)  #: the client kind of a Redlock
Clock: TypeAlias = Callable[[], float]

_HELD: Final = "held"
_RELEASED: Final = "released"
_LOST: Final = "lost"


# --------------------------------------------------------------------------------------------
# Pure helpers: quorum and validity math, key names
# --------------------------------------------------------------------------------------------


def quorum(n: int) -> int:
    """Masters that must agree out of ``n``: a strict majority, ``n // 2 + 1``."""
    return n // 2 + 1


def drift_allowance(ttl: float, drift_factor: float = DRIFT_FACTOR) -> float:
    """Seconds set aside for clock drift on a ``ttl``-second lock: ``drift_factor*ttl + 2 ms``."""
    return drift_factor * ttl + DRIFT_FLOOR


def validity(ttl: float, elapsed: float, drift_factor: float = DRIFT_FACTOR) -> float:
    """Seconds a lock is still safe to use after ``elapsed`` seconds since the first request."""
    return ttl - elapsed - drift_allowance(ttl, drift_factor)


def lock_key(resource: str) -> str:
    """Key of the lock on ``resource`` on every master: ``redlock:{resource}``."""
    check_name("resource", resource)
    return "redlock:{" + resource + "}"


def fence_key(resource: str) -> str:
    """Key of the fencing counter of ``resource`` (same hash tag as its lock)."""
    return lock_key(resource) + ":fence"


def _ttl_ms(option: str, ttl: object, drift_factor: float) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise ConfigError(option, f"must be a number of seconds, got {type(ttl).__name__}")
    ms = int(ttl * 1000)
    if ms < 1 or validity(ms / 1000, 0.0, drift_factor) <= 0:
        raise ConfigError(
            option,
            f"{ttl!r} s leaves no validity after the drift allowance "
            f"({drift_factor} * ttl + {DRIFT_FLOOR * 1000:g} ms); use a longer TTL",
        )
    return ms


def _seconds(option: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(option, f"must be a number of seconds, got {type(value).__name__}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(option, f"must be {'>' if positive else '>='} 0 seconds, got {value!r}")
    return float(value)


def _as_int(reply: object) -> int | None:
    """An integer from a script reply (int, or digits as bytes/str); None if it is not one."""
    if isinstance(reply, bool):
        return None
    if isinstance(reply, int):
        return reply
    if isinstance(reply, (bytes, str)):
        try:
            return int(reply)
        except ValueError:
            return None
    return None


def _pair(reply: object) -> tuple[int, int] | None:
    """``(flag, number)`` from a ``{flag, number}`` script reply; None for a failed master."""
    if isinstance(reply, list) and len(reply) == 2:
        flag, number = _as_int(reply[0]), _as_int(reply[1])
        if flag is not None and number is not None:
            return flag, number
    return None


def _first_error(replies: Sequence[object]) -> BaseException | None:
    return next((r for r in replies if isinstance(r, BaseException)), None)


# --------------------------------------------------------------------------------------------
# Lua scripts (streamwork/lua/redlock_*.lua)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Lua:
    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> _Lua:
        source = (importlib.resources.files("streamwork") / "lua" / name).read_text("utf-8")
        return cls(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


_ACQUIRE: Final = _Lua.load("redlock_acquire.lua")
_FENCE: Final = _Lua.load("redlock_fence.lua")
_EXTEND: Final = _Lua.load("redlock_extend.lua")
_RELEASE: Final = _Lua.load("redlock_release.lua")
_FENCED_SET: Final = _Lua.load("redlock_fenced_set.lua")

_ScriptArg: TypeAlias = "str | bytes | int | float"


def _eval(client: redis.Redis, lua: _Lua, keys: Sequence[str], args: Sequence[_ScriptArg]) -> Any:
    try:
        return client.evalsha(lua.sha, len(keys), *keys, *args)
    except NoScriptError:  # a master restarted (or SCRIPT FLUSH): send the source once
        return client.eval(lua.source, len(keys), *keys, *args)


async def _aeval(
    client: redis.asyncio.Redis, lua: _Lua, keys: Sequence[str], args: Sequence[_ScriptArg]
) -> Any:
    try:
        return await client.evalsha(lua.sha, len(keys), *keys, *args)
    except NoScriptError:
        return await client.eval(lua.source, len(keys), *keys, *args)


# --------------------------------------------------------------------------------------------
# The protocol, without I/O: generators that yield the rounds the shells must perform
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Round:
    """Run ``lua`` on every master; the reply is one entry per master (an exception if failed)."""

    lua: _Lua
    keys: tuple[str, ...]
    args: tuple[_ScriptArg, ...]


@dataclass(frozen=True, slots=True)
class _Sleep:
    """Wait ``seconds`` before the next attempt; the reply is an empty list."""

    seconds: float


@dataclass(frozen=True)
class _Result(Generic[_T]):
    value: _T


_Request: TypeAlias = "_Round | _Sleep"
_Steps: TypeAlias = Generator[_Request, list[object], _T]


def _advance(
    steps: _Steps[_T], reply: list[object] | None, error: BaseException | None
) -> _Request | _Result[_T]:
    """Feed the protocol the outcome of its last request; get its next request or its result.

    ``error`` is thrown into it (so it can release what it may already hold, then re-raise).
    """
    try:
        if error is not None:
            return steps.throw(error)
        return next(steps) if reply is None else steps.send(reply)
    except StopIteration as stop:
        return _Result(stop.value)


@dataclass(slots=True)
class _Lease:
    """The state of one granted lock, shared by its sync and async handles."""

    resource: str
    key: str
    value: str
    token: int
    ttl: float
    deadline: float
    state: str = _HELD


@dataclass(frozen=True, slots=True)
class _Refusal:
    granted: int
    answered: int
    cause: BaseException | None


class _Core:
    """The Redlock rules for N masters. Every method is a generator of `_Round`/`_Sleep`."""

    def __init__(
        self,
        n: int,
        *,
        ttl: float,
        drift_factor: float,
        retry_delay: float,
        clock: Clock,
    ) -> None:
        if n < 1:
            raise ConfigError("masters", "need at least one Redis master (five is usual)")
        if isinstance(drift_factor, bool) or not isinstance(drift_factor, (int, float)):
            raise ConfigError("drift_factor", f"must be a number, got {drift_factor!r}")
        if not 0 <= drift_factor < 1:
            raise ConfigError("drift_factor", f"must be in [0, 1), got {drift_factor!r}")
        if not callable(clock):
            raise ConfigError("clock", "must be a callable returning monotonic seconds")
        self.n = n
        self.quorum = quorum(n)
        self.drift_factor = float(drift_factor)
        self.ttl_ms = _ttl_ms("ttl", ttl, self.drift_factor)
        self.retry_delay = _seconds("retry_delay", retry_delay)
        self.clock = clock
        self._rng = random.Random()

    def _jitter(self) -> float:
        """A random wait in [retry_delay/2, retry_delay], so contending clients desynchronise."""
        return self._rng.uniform(self.retry_delay / 2, self.retry_delay)

    def check_acquire(
        self, resource: str, ttl: float | None, blocking_timeout: float | None
    ) -> tuple[int, float | None]:
        """Validate acquire's arguments up front (so a bad one raises before any I/O)."""
        check_name("resource", resource)
        ttl_ms = self.ttl_ms if ttl is None else _ttl_ms("ttl", ttl, self.drift_factor)
        if blocking_timeout is not None:
            blocking_timeout = _seconds("blocking_timeout", blocking_timeout)
        return ttl_ms, blocking_timeout

    def acquire(self, resource: str, ttl_ms: int, blocking_timeout: float | None) -> _Steps[_Lease]:
        """Attempt until granted; refused -> retry after jitter until ``blocking_timeout``."""
        give_up_at = None if blocking_timeout is None else self.clock() + blocking_timeout
        while True:
            outcome = yield from self._attempt(resource, ttl_ms)
            if isinstance(outcome, _Lease):
                return outcome
            now = self.clock()
            if give_up_at is None or now >= give_up_at:
                raise LockNotAcquired(
                    resource, outcome.granted, outcome.answered, self.n, self.quorum
                ) from outcome.cause
            yield _Sleep(min(self._jitter(), give_up_at - now))

    def _attempt(self, resource: str, ttl_ms: int) -> _Steps[_Lease | _Refusal]:
        key, fence = lock_key(resource), fence_key(resource)
        value = secrets.token_hex(VALUE_BYTES)
        release = _Round(_RELEASE, (key,), (value,))
        ttl = ttl_ms / 1000
        started = self.clock()  # before the first SET is sent: validity counts from here
        deadline = started + validity(ttl, 0.0, self.drift_factor)
        try:
            replies = yield _Round(_ACQUIRE, (key, fence), (value, ttl_ms))
            answered = [p for p in map(_pair, replies) if p is not None]
            granted = sum(1 for flag, _ in answered if flag == 1)
            if granted >= self.quorum and self.clock() < deadline:
                proposal = 1 + max(counter for _, counter in answered)
                token = yield from self._next_token(fence, proposal)
                if token is not None and self.clock() < deadline:
                    return _Lease(resource, key, value, token, ttl, deadline)
        except GeneratorExit:
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, task cancelled) after SETs may have landed:
            # never leave a lock behind that nobody will use.
            yield release
            raise
        yield release  # refused, too slow, or no token: give back every master we got
        return _Refusal(granted, len(answered), _first_error(replies))

    def _next_token(self, fence: str, proposal: int) -> _Steps[int | None]:
        """Quorum max+1 compare-and-set of the fencing counter; None if no quorum accepts."""
        for _ in range(_FENCE_ROUNDS):
            replies = yield _Round(_FENCE, (fence,), (proposal,))
            answered = [p for p in map(_pair, replies) if p is not None]
            if sum(1 for flag, _ in answered if flag == 1) >= self.quorum:
                return proposal
            if len(answered) < self.quorum:
                return None
            # Lost a race (someone else got this number on some masters): go above them all.
            proposal = 1 + max(proposal, *(current for _, current in answered))
        return None

    def extend(self, lease: _Lease, ttl: float | None) -> _Steps[float]:
        """Compare-and-PEXPIRE on every master; on success return the new local deadline."""
        if lease.state != _HELD:
            raise LockLost(f"lock {lease.resource!r} was already {lease.state}", lease.resource)
        ttl_ms = _ttl_ms("ttl", lease.ttl if ttl is None else ttl, self.drift_factor)
        sent = self.clock()  # the new deadline counts from when the extension is sent
        if sent < lease.deadline:
            replies = yield _Round(_EXTEND, (lease.key,), (lease.value, ttl_ms))
            extended = sum(1 for r in replies if _as_int(r) == 1)
            deadline = sent + validity(ttl_ms / 1000, 0.0, self.drift_factor)
            if extended >= self.quorum and self.clock() < deadline:
                lease.deadline = deadline
                lease.ttl = ttl_ms / 1000
                return deadline
            reason = f"only {extended} of {self.n} masters still held it (quorum is {self.quorum})"
        else:
            reason = "its validity ran out before the extension was sent"
        lease.state = _LOST  # final: a lost lease is never revived
        yield _Round(_RELEASE, (lease.key,), (lease.value,))  # free the minority we still hold
        raise LockLost(
            f"lock {lease.resource!r} lost: {reason}. Stop writing under fencing token "
            f"{lease.token}; acquire it again to continue.",
            lease.resource,
        )

    def release(self, lease: _Lease) -> _Steps[bool]:
        """Compare-and-delete on every master; True if a quorum still held our value."""
        if lease.state != _HELD:
            return False
        lease.state = _RELEASED
        replies = yield _Round(_RELEASE, (lease.key,), (lease.value,))
        return sum(1 for r in replies if _as_int(r) == 1) >= self.quorum


# --------------------------------------------------------------------------------------------
# Handles on a granted lock
# --------------------------------------------------------------------------------------------


class _LeaseView:
    """Read-only view of a granted lock (shared by `HeldLock` and `AsyncHeldLock`)."""

    __slots__ = ("_clock", "_lease")

    def __init__(self, lease: _Lease, clock: Clock) -> None:
        self._lease = lease
        self._clock = clock

    @property
    def resource(self) -> str:
        return self._lease.resource

    @property
    def key(self) -> str:
        """The lock's key on every master."""
        return self._lease.key

    @property
    def fencing_token(self) -> int:
        """Strictly increasing per resource (while a quorum keeps its data); pass it along
        with every write so the resource can reject holders that are no longer current."""
        return self._lease.token

    @property
    def ttl(self) -> float:
        """TTL of the last grant or extension, seconds."""
        return self._lease.ttl

    @property
    def valid_for(self) -> float:
        """Seconds left before the local (monotonic) deadline; 0 once released or lost."""
        if self._lease.state != _HELD:
            return 0.0
        return max(0.0, self._lease.deadline - self._clock())

    @property
    def held(self) -> bool:
        """True while neither released nor lost and the deadline has not passed."""
        return self.valid_for > 0

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.resource!r} token={self.fencing_token} "
            f"{self._lease.state} valid_for={self.valid_for:.3f}s>"
        )


class HeldLock(_LeaseView):
    """A lock granted by `Redlock`; a context manager that releases it on exit."""

    __slots__ = ("_redlock",)

    def __init__(self, redlock: Redlock, lease: _Lease) -> None:
        super().__init__(lease, redlock.clock)
        self._redlock = redlock

    def extend(self, ttl: float | None = None) -> float:
        """Reset the lock's TTL (default: the last one) on every master that still holds it.

        Returns the new `valid_for`. Raises `LockLost` -- final, after giving back the
        masters it still held -- when fewer than a quorum extended it or no time is left.
        Never recreates an expired key.
        """
        self._redlock._run(self._redlock._core.extend(self._lease, ttl))
        return self.valid_for

    def release(self) -> bool:
        """Delete the lock on every master still holding our value (never someone else's).

        Returns True if a quorum still held it, False if it had expired, been taken over,
        been released already or too few masters answered. Never raises for those.
        """
        return self._redlock._run(self._redlock._core.release(self._lease))

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class AsyncHeldLock(_LeaseView):
    """A lock granted by `AsyncRedlock`; an async context manager that releases it on exit."""

    __slots__ = ("_redlock",)

    def __init__(self, redlock: AsyncRedlock, lease: _Lease) -> None:
        super().__init__(lease, redlock.clock)
        self._redlock = redlock

    async def extend(self, ttl: float | None = None) -> float:
        """As `HeldLock.extend`."""
        await self._redlock._run(self._redlock._core.extend(self._lease, ttl))
        return self.valid_for

    async def release(self) -> bool:
        """As `HeldLock.release`."""
        return await self._redlock._run(self._redlock._core.release(self._lease))

    async def __aenter__(self) -> AsyncHeldLock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()


# --------------------------------------------------------------------------------------------
# I/O shells
# --------------------------------------------------------------------------------------------


def _check_masters(masters: object) -> list[object]:
    if isinstance(masters, (str, bytes)) or not isinstance(masters, Sequence):
        raise ConfigError("masters", "must be a list of redis:// URLs or Redis clients")
    urls = [m for m in masters if isinstance(m, str)]
    if len(set(urls)) != len(urls):
        raise ConfigError("masters", "lists the same URL twice; masters must be independent")
    return list(masters)


class _RedlockBase(Generic[_C]):
    """What `Redlock` and `AsyncRedlock` share: checking the masters, building clients from
    URLs (socket timeouts of ``node_timeout``, no redis-py retries: a master that does not
    answer in time counts as down), the quorum rules, the clock."""

    _client_type: ClassVar[Any]  #: redis.Redis or redis.asyncio.Redis

    def _no_retry(self) -> Any:
        """redis-py's retry policy that never retries, for this client kind."""
        raise NotImplementedError

    def __init__(
        self,
        masters: Sequence[str | _C],
        *,
        ttl: float = DEFAULT_TTL,
        drift_factor: float = DRIFT_FACTOR,
        retry_delay: float = DEFAULT_RETRY_DELAY,
        node_timeout: float = DEFAULT_NODE_TIMEOUT,
        clock: Clock = time.monotonic,
    ) -> None:
        checked = _check_masters(masters)
        self._core = _Core(
            len(checked), ttl=ttl, drift_factor=drift_factor, retry_delay=retry_delay, clock=clock
        )
        timeout = _seconds("node_timeout", node_timeout, positive=True)
        self._clients: list[_C] = []
        self._owned: list[_C] = []
        for master in checked:
            if isinstance(master, str):
                client = self._client_type.from_url(
                    master,
                    socket_timeout=timeout,
                    socket_connect_timeout=timeout,
                    retry=self._no_retry(),
                )
                self._owned.append(client)
            elif isinstance(master, self._client_type):
                client = master
            else:
                kind = f"{self._client_type.__module__}.{self._client_type.__name__}"
                raise ConfigError("masters", f"expected a URL or {kind}, got {master!r}")
            self._clients.append(client)

    @property
    def clock(self) -> Clock:
        return self._core.clock

    @property
    def quorum(self) -> int:
        return self._core.quorum


class Redlock(_RedlockBase[redis.Redis]):
    """Distributed lock over N independent Redis masters (blocking I/O, thread-safe).

    Redlock improves availability, not correctness: a lock outlives the loss of a minority
    of masters, but a paused client, a master restarted empty or a clock jump can let two
    holders overlap. Correctness needs fencing -- pass ``held.fencing_token`` with every
    write and have the resource reject stale tokens (see `fenced_set`).

    ``masters``: URLs (``redis://host:port/db``) or ``redis.Redis`` clients, one per master.
    ``ttl``: seconds a lock lives unless extended. ``retry_delay``: upper bound of the random
    wait between attempts when ``acquire(blocking_timeout=...)``. ``node_timeout``: socket
    timeout for clients built from URLs. ``clock``: monotonic seconds (inject for tests).
    """

    _client_type = redis.Redis

    def _no_retry(self) -> Any:
        return Retry(NoBackoff(), 0)

    def acquire(
        self,
        resource: str,
        *,
        blocking_timeout: float | None = None,
        ttl: float | None = None,
    ) -> HeldLock:
        """Take the lock on ``resource`` or raise `LockNotAcquired`.

        ``blocking_timeout=None`` tries once; a number keeps retrying, after random waits of
        up to ``retry_delay``, until that many seconds have passed. ``ttl`` overrides the
        lock's default TTL for this grant. Use the result as a context manager to release.
        """
        ttl_ms, blocking_timeout = self._core.check_acquire(resource, ttl, blocking_timeout)
        lease = self._run(self._core.acquire(resource, ttl_ms, blocking_timeout))
        return HeldLock(self, lease)

    def close(self) -> None:
        """Close the clients this object built from URLs (not the ones passed in)."""
        for client in self._owned:
            client.close()

    def __enter__(self) -> Redlock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, steps: _Steps[_T]) -> _T:
        step = _advance(steps, None, None)
        while not isinstance(step, _Result):
            reply: list[object] | None = None
            error: BaseException | None = None
            try:
                reply = self._perform(step)
            except BaseException as exc:
                error = exc
            step = _advance(steps, reply, error)
        return step.value

    def _perform(self, request: _Request) -> list[object]:
        if isinstance(request, _Sleep):
            time.sleep(request.seconds)
            return []
        return [self._call(client, request) for client in self._clients]

    @staticmethod
    def _call(client: redis.Redis, request: _Round) -> object:
        try:
            result: object = _eval(client, request.lua, request.keys, request.args)
        except (RedisError, OSError) as exc:  # this master does not answer
            return exc
        return result


class AsyncRedlock(_RedlockBase[redis.asyncio.Redis]):
    """`Redlock` for asyncio (redis.asyncio), contacting all masters concurrently.

    Redlock improves availability, not correctness; correctness needs fencing (see
    `Redlock`). ``await lock.acquire(r)`` returns an `AsyncHeldLock`;
    ``async with lock.acquire(r) as held:`` releases it on exit. If the task is cancelled
    during an attempt, the attempt releases what it may hold before the cancellation
    propagates.
    """

    _client_type = redis.asyncio.Redis

    def _no_retry(self) -> Any:
        return AsyncRetry(NoBackoff(), 0)

    def acquire(
        self,
        resource: str,
        *,
        blocking_timeout: float | None = None,
        ttl: float | None = None,
    ) -> AsyncAcquisition:
        """As `Redlock.acquire`; await the result, or use it with ``async with``."""
        ttl_ms, blocking_timeout = self._core.check_acquire(resource, ttl, blocking_timeout)
        return AsyncAcquisition(self, resource, ttl_ms, blocking_timeout)

    async def aclose(self) -> None:
        """Close the clients this object built from URLs (not the ones passed in)."""
        for client in self._owned:
            await client.aclose()

    async def __aenter__(self) -> AsyncRedlock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _run(self, steps: _Steps[_T]) -> _T:
        step = _advance(steps, None, None)
        while not isinstance(step, _Result):
            reply: list[object] | None = None
            error: BaseException | None = None
            try:
                reply = await self._perform(step)
            except BaseException as exc:
                error = exc
            step = _advance(steps, reply, error)
        return step.value

    async def _perform(self, request: _Request) -> list[object]:
        if isinstance(request, _Sleep):
            await asyncio.sleep(request.seconds)
            return []
        return list(await asyncio.gather(*(self._call(c, request) for c in self._clients)))

    @staticmethod
    async def _call(client: redis.asyncio.Redis, request: _Round) -> object:
        try:
            result: object = await _aeval(client, request.lua, request.keys, request.args)
        except (RedisError, OSError) as exc:  # this master does not answer
            return exc
        return result


class AsyncAcquisition(Awaitable[AsyncHeldLock]):
    """What `AsyncRedlock.acquire` returns: await it, or ``async with`` it to auto-release."""

    __slots__ = ("_blocking_timeout", "_held", "_redlock", "_resource", "_ttl_ms")

    def __init__(
        self, redlock: AsyncRedlock, resource: str, ttl_ms: int, blocking_timeout: float | None
    ) -> None:
        self._redlock = redlock
        self._resource = resource
        self._ttl_ms = ttl_ms
        self._blocking_timeout = blocking_timeout
        self._held: AsyncHeldLock | None = None

    async def _acquire(self) -> AsyncHeldLock:
        core = self._redlock._core
        lease = await self._redlock._run(
            core.acquire(self._resource, self._ttl_ms, self._blocking_timeout)
        )
        return AsyncHeldLock(self._redlock, lease)

    def __await__(self) -> Generator[Any, None, AsyncHeldLock]:
        return self._acquire().__await__()

    async def __aenter__(self) -> AsyncHeldLock:
        self._held = await self._acquire()
        return self._held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._held is not None:
            await self._held.release()


# --------------------------------------------------------------------------------------------
# Resource-side fencing (L3)
# --------------------------------------------------------------------------------------------


def _check_fenced(key: str, token: int) -> None:
    if not isinstance(key, str) or not key:
        raise ConfigError("key", "must be a non-empty str")
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ConfigError("token", f"must be an int >= 0 (a fencing token), got {token!r}")


def fenced_set(client: redis.Redis, key: str, token: int, value: _ScriptArg) -> bool:
    """Write ``value`` to the resource at ``key`` unless a higher fencing token wrote before.

    ``key`` is a hash with fields ``token`` (highest token seen) and ``value``; read it with
    ``HGET key value``. Returns True if written (``token`` >= the highest seen; the same
    holder may write again), False if rejected as stale. Atomic (one Lua script); Redis
    errors propagate. The SQL equivalent is ``UPDATE ... SET value = :v, last_token = :t
    WHERE id = :id AND last_token <= :t`` and checking the row count.
    """
    _check_fenced(key, token)
    return _as_int(_eval(client, _FENCED_SET, (key,), (token, value))) == 1


async def async_fenced_set(
    client: redis.asyncio.Redis, key: str, token: int, value: _ScriptArg
) -> bool:
    """As `fenced_set`, for redis.asyncio clients."""
    _check_fenced(key, token)
    return _as_int(await _aeval(client, _FENCED_SET, (key,), (token, value))) == 1
