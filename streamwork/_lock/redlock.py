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

The rules live once, in `Core` (core.py), as generators that yield the network rounds they need;
`Redlock` and `AsyncRedlock` are thin shells that perform those rounds (one master after
the other, or all at once with ``asyncio.gather``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Generator, Sequence
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from streamwork._lock.core import (
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TTL,
    DRIFT_FACTOR,
    Clock,
    Core,
    Request,
    Result,
    Round,
    Sleep,
    Steps,
    advance,
    as_int,
    seconds,
)
from streamwork._lock.held import AsyncHeldLock, AsyncRun, HeldLock
from streamwork._redis import scripts, sentinel, tls_connections
from streamwork._redis.replies import LockReply
from streamwork._redis.tls import TlsError
from streamwork.errors import ConfigError

__all__ = [
    "AsyncAcquisition",
    "AsyncHeldLock",
    "AsyncRedlock",
    "HeldLock",
    "Redlock",
    "async_fenced_set",
    "fenced_set",
]

_T = TypeVar("_T")
_C = TypeVar("_C", redis.Redis, redis.asyncio.Redis)  #: the client kind of a Redlock


# --------------------------------------------------------------------------------------------
# I/O shells
# --------------------------------------------------------------------------------------------


def _check_masters(masters: object) -> list[object]:
    if isinstance(masters, (str, bytes)) or not isinstance(masters, Sequence):
        raise ConfigError("masters", "must be a list of Redis URLs (redis://, rediss://, "
                                     "unix://, redis+sentinel://) or Redis clients")
    urls = [m for m in masters if isinstance(m, str)]
    if len(set(urls)) != len(urls):
        raise ConfigError("masters", "lists the same URL twice; masters must be independent")
    return list(masters)


class _RedlockBase(Generic[_C]):
    """What `Redlock` and `AsyncRedlock` share: checking the masters, building clients from
    URLs (socket timeouts of ``node_timeout``, no redis-py retries: a master that does not
    answer in time counts as down), the quorum rules, the clock."""

    _client_type: ClassVar[Any]  #: redis.Redis or redis.asyncio.Redis
    _scripts_type: ClassVar[Any]  #: scripts.SyncScripts or scripts.AsyncScripts

    def _no_retry(self) -> Any:
        """redis-py's retry policy that never retries, for this client kind."""
        raise NotImplementedError

    def _from_url(self, url: str, options: dict[str, Any]) -> Any:
        """A client of the master ``url`` names (a sentinel URL: its service's primary)."""
        if sentinel.is_sentinel_url(url):
            build = sentinel.sync_client if self._client_type is redis.Redis \
                else sentinel.async_client
            return build(url, **options)
        if url.startswith("rediss://"):
            tls_class = (tls_connections.SyncConnection if self._client_type is redis.Redis
                         else tls_connections.AsyncConnection)
            options = {"connection_class": tls_class, **options}
        return self._client_type.from_url(url, **options)

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
        self._core = Core(
            len(checked), ttl=ttl, drift_factor=drift_factor, retry_delay=retry_delay, clock=clock
        )
        timeout = seconds("node_timeout", node_timeout, positive=True)
        self._clients: list[_C] = []
        self._owned: list[_C] = []
        for master in checked:
            if isinstance(master, str):
                options = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                           "retry": self._no_retry()}
                client = self._from_url(master, options)
                self._owned.append(client)
            elif isinstance(master, self._client_type):
                client = master
            else:
                kind = f"{self._client_type.__module__}.{self._client_type.__name__}"
                raise ConfigError("masters", f"expected a URL or {kind}, got {master!r}")
            self._clients.append(client)
        self._masters = [self._scripts_type(c) for c in self._clients]

    @property
    def clock(self) -> Clock:
        return self._core.clock

    @property
    def clients(self) -> tuple[_C, ...]:
        """The masters' clients, in order (built from the URLs, or as passed in)."""
        return tuple(self._clients)

    @property
    def quorum(self) -> int:
        """Masters that must agree: a strict majority."""
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
    _scripts_type = scripts.SyncScripts

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
        grant = self._run(self._core.acquire(resource, ttl_ms, blocking_timeout))
        return HeldLock(grant, self._core, self._run)

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

    def _run(self, steps: Steps[_T]) -> _T:
        step = advance(steps, None, None)
        while not isinstance(step, Result):
            reply: list[object] | None = None
            error: BaseException | None = None
            try:
                reply = self._perform(step)
            except BaseException as exc:
                error = exc
            step = advance(steps, reply, error)
        return step.value

    def _perform(self, request: Request) -> list[object]:
        if isinstance(request, Sleep):
            time.sleep(request.seconds)
            return []
        return [self._call(master, request) for master in self._masters]

    @staticmethod
    def _call(master: scripts.SyncScripts, request: Round) -> object:
        try:
            result: object = master.run(request.call)
        except TlsError:
            raise  # no outage: TLS cannot work as configured (a ConfigError saying why)
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
    _scripts_type = scripts.AsyncScripts

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
        return AsyncAcquisition(self._core, self._run, resource, ttl_ms, blocking_timeout)

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

    async def _run(self, steps: Steps[_T]) -> _T:
        step = advance(steps, None, None)
        while not isinstance(step, Result):
            reply: list[object] | None = None
            error: BaseException | None = None
            try:
                reply = await self._perform(step)
            except BaseException as exc:
                error = exc
            step = advance(steps, reply, error)
        return step.value

    async def _perform(self, request: Request) -> list[object]:
        if isinstance(request, Sleep):
            await asyncio.sleep(request.seconds)
            return []
        return list(await asyncio.gather(*(self._call(m, request) for m in self._masters)))

    @staticmethod
    async def _call(master: scripts.AsyncScripts, request: Round) -> object:
        try:
            result: object = await master.run(request.call)
        except TlsError:
            raise  # as in Redlock._call
        except (RedisError, OSError) as exc:  # this master does not answer
            return exc
        return result


class AsyncAcquisition(Awaitable[AsyncHeldLock]):
    """What `AsyncRedlock.acquire` returns: await it, or ``async with`` it to auto-release."""

    __slots__ = ("_blocking_timeout", "_core", "_held", "_resource", "_run", "_ttl_ms")

    def __init__(
        self, core: Core, run: AsyncRun, resource: str, ttl_ms: int,
        blocking_timeout: float | None,
    ) -> None:
        self._core = core
        self._run = run
        self._resource = resource
        self._ttl_ms = ttl_ms
        self._blocking_timeout = blocking_timeout
        self._held: AsyncHeldLock | None = None

    async def _acquire(self) -> AsyncHeldLock:
        grant = await self._run(
            self._core.acquire(self._resource, self._ttl_ms, self._blocking_timeout)
        )
        return AsyncHeldLock(grant, self._core, self._run)

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


def fenced_set(client: redis.Redis, key: str, token: int, value: scripts.Arg) -> bool:
    """Write ``value`` to the resource at ``key`` unless a higher fencing token wrote before.

    ``key`` is a hash with fields ``token`` (highest token seen) and ``value``; read it with
    ``HGET key value``. Returns True if written (``token`` >= the highest seen; the same
    holder may write again), False if rejected as stale. Atomic (one Lua script); Redis
    errors propagate. The SQL equivalent is ``UPDATE ... SET value = :v, last_token = :t
    WHERE id = :id AND last_token <= :t`` and checking the row count.
    """
    _check_fenced(key, token)
    reply = scripts.SyncScripts(client).run(scripts.fenced_set(key, token, value))
    return as_int(reply) == LockReply.GRANTED


async def async_fenced_set(
    client: redis.asyncio.Redis, key: str, token: int, value: scripts.Arg
) -> bool:
    """As `fenced_set`, for redis.asyncio clients."""
    _check_fenced(key, token)
    reply = await scripts.AsyncScripts(client).run(scripts.fenced_set(key, token, value))
    return as_int(reply) == LockReply.GRANTED
