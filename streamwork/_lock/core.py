"""The Redlock rules, without I/O: quorum and validity math, and the protocol as generators
that yield the network rounds they need (`Redlock` / `AsyncRedlock` in redlock.py perform them).
See redlock.py for what Redlock gives and what it does not."""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeAlias, TypeVar

from streamwork._redis import scripts
from streamwork._redis.replies import LockReply
from streamwork._wire.keys import check_name, redlock_fence_key, redlock_key
from streamwork.errors import ConfigError, LockLost, LockNotAcquired

DEFAULT_TTL: Final = 10.0  #: seconds a lock lives on each master unless extended
DRIFT_FACTOR: Final = 0.01  #: share of the TTL set aside for clock drift between machines
DRIFT_FLOOR: Final = 0.002  #: seconds always set aside on top (the spec's "+ 2 ms")
DEFAULT_RETRY_DELAY: Final = 0.2  #: upper bound of the random wait between attempts, seconds
DEFAULT_NODE_TIMEOUT: Final = 0.1  #: socket connect/read timeout per master, seconds
VALUE_BYTES: Final = 20  #: random bytes in a lock value
_FENCE_ROUNDS: Final = 3  #: compare-and-set proposals tried per grant before giving up

_T = TypeVar("_T")
Clock: TypeAlias = Callable[[], float]

HELD: Final = "held"
RELEASED: Final = "released"
LOST: Final = "lost"


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


def checked_ttl_ms(option: str, ttl: object, drift_factor: float) -> int:
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


def seconds(option: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(option, f"must be a number of seconds, got {type(value).__name__}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(option, f"must be {'>' if positive else '>='} 0 seconds, got {value!r}")
    return float(value)


def as_int(reply: object) -> int | None:
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


def pair(reply: object) -> tuple[int, int] | None:
    """``(flag, number)`` from a ``{flag, number}`` script reply; None for a failed master."""
    if isinstance(reply, list) and len(reply) == 2:
        flag, number = as_int(reply[0]), as_int(reply[1])
        if flag is not None and number is not None:
            return flag, number
    return None


def first_error(replies: Sequence[object]) -> BaseException | None:
    return next((r for r in replies if isinstance(r, BaseException)), None)


# --------------------------------------------------------------------------------------------
# The protocol, without I/O: generators that yield the rounds the shells must perform
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Round:
    """Run ``call`` on every master; the reply is one entry per master (an exception if
    failed)."""

    call: scripts.Call


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` before the next attempt; the reply is an empty list."""

    seconds: float


@dataclass(frozen=True)
class Result(Generic[_T]):
    value: _T


Request: TypeAlias = "Round | Sleep"
Steps: TypeAlias = Generator[Request, list[object], _T]


def advance(
    steps: Steps[_T], reply: list[object] | None, error: BaseException | None
) -> Request | Result[_T]:
    """Feed the protocol the outcome of its last request; get its next request or its result.

    ``error`` is thrown into it (so it can release what it may already hold, then re-raise).
    """
    try:
        if error is not None:
            return steps.throw(error)
        return next(steps) if reply is None else steps.send(reply)
    except StopIteration as stop:
        return Result(stop.value)


@dataclass(slots=True)
class Grant:
    """The state of one granted lock (what Redlock hands out: key, value, fencing token,
    local deadline), shared by its sync and async handles."""

    resource: str
    key: str
    value: str
    token: int
    ttl: float
    deadline: float
    state: str = HELD


@dataclass(frozen=True, slots=True)
class _Refusal:
    granted: int
    answered: int
    cause: BaseException | None


class Core:
    """The Redlock rules for N masters. Every method is a generator of `Round`/`Sleep`."""

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
        self.ttl_ms = checked_ttl_ms("ttl", ttl, self.drift_factor)
        self.retry_delay = seconds("retry_delay", retry_delay)
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
        ttl_ms = self.ttl_ms if ttl is None else checked_ttl_ms("ttl", ttl, self.drift_factor)
        if blocking_timeout is not None:
            blocking_timeout = seconds("blocking_timeout", blocking_timeout)
        return ttl_ms, blocking_timeout

    def acquire(self, resource: str, ttl_ms: int, blocking_timeout: float | None) -> Steps[Grant]:
        """Attempt until granted; refused -> retry after jitter until ``blocking_timeout``."""
        give_up_at = None if blocking_timeout is None else self.clock() + blocking_timeout
        while True:
            outcome = yield from self._attempt(resource, ttl_ms)
            if isinstance(outcome, Grant):
                return outcome
            now = self.clock()
            if give_up_at is None or now >= give_up_at:
                raise LockNotAcquired(
                    resource, outcome.granted, outcome.answered, self.n, self.quorum
                ) from outcome.cause
            yield Sleep(min(self._jitter(), give_up_at - now))

    def _attempt(self, resource: str, ttl_ms: int) -> Steps[Grant | _Refusal]:
        key, fence = redlock_key(resource), redlock_fence_key(resource)
        value = secrets.token_hex(VALUE_BYTES)
        release = Round(scripts.redlock_release(key, value))
        ttl = ttl_ms / 1000
        started = self.clock()  # before the first SET is sent: validity counts from here
        deadline = started + validity(ttl, 0.0, self.drift_factor)
        try:
            replies = yield Round(scripts.redlock_acquire(key, fence, value, ttl_ms))
            answered = [p for p in map(pair, replies) if p is not None]
            granted = sum(1 for flag, _ in answered if flag == LockReply.GRANTED)
            if granted >= self.quorum and self.clock() < deadline:
                proposal = 1 + max(counter for _, counter in answered)
                token = yield from self._next_token(fence, proposal)
                if token is not None and self.clock() < deadline:
                    return Grant(resource, key, value, token, ttl, deadline)
        except GeneratorExit:
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, task cancelled) after SETs may have landed:
            # never leave a lock behind that nobody will use.
            yield release
            raise
        yield release  # refused, too slow, or no token: give back every master we got
        return _Refusal(granted, len(answered), first_error(replies))

    def _next_token(self, fence: str, proposal: int) -> Steps[int | None]:
        """Quorum max+1 compare-and-set of the fencing counter; None if no quorum accepts."""
        for _ in range(_FENCE_ROUNDS):
            replies = yield Round(scripts.redlock_fence(fence, proposal))
            answered = [p for p in map(pair, replies) if p is not None]
            if sum(1 for flag, _ in answered if flag == LockReply.GRANTED) >= self.quorum:
                return proposal
            if len(answered) < self.quorum:
                return None
            # Lost a race (someone else got this number on some masters): go above them all.
            proposal = 1 + max(proposal, *(current for _, current in answered))
        return None

    def extend(self, grant: Grant, ttl: float | None) -> Steps[float]:
        """Compare-and-PEXPIRE on every master; on success return the new local deadline."""
        if grant.state != HELD:
            raise LockLost(f"lock {grant.resource!r} was already {grant.state}", grant.resource)
        ttl_ms = checked_ttl_ms("ttl", grant.ttl if ttl is None else ttl, self.drift_factor)
        sent = self.clock()  # the new deadline counts from when the extension is sent
        if sent < grant.deadline:
            replies = yield Round(scripts.redlock_extend(grant.key, grant.value, ttl_ms))
            extended = sum(1 for r in replies if as_int(r) == LockReply.GRANTED)
            deadline = sent + validity(ttl_ms / 1000, 0.0, self.drift_factor)
            if extended >= self.quorum and self.clock() < deadline:
                grant.deadline = deadline
                grant.ttl = ttl_ms / 1000
                return deadline
            reason = f"only {extended} of {self.n} masters still held it (quorum is {self.quorum})"
        else:
            reason = "its validity ran out before the extension was sent"
        grant.state = LOST  # final: a lost grant is never revived
        # free the minority we still hold
        yield Round(scripts.redlock_release(grant.key, grant.value))
        raise LockLost(
            f"lock {grant.resource!r} lost: {reason}. Stop writing under fencing token "
            f"{grant.token}; acquire it again to continue.",
            grant.resource,
        )

    def release(self, grant: Grant) -> Steps[bool]:
        """Compare-and-delete on every master; True if a quorum still held our value."""
        if grant.state != HELD:
            return False
        grant.state = RELEASED
        replies = yield Round(scripts.redlock_release(grant.key, grant.value))
        return sum(1 for r in replies if as_int(r) == LockReply.GRANTED) >= self.quorum


