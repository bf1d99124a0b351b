"""The local half of once-only effect: keys this process completed recently.

Checked before Redis so a duplicate delivery of a job finished here moments ago is acked
without running a script. Entries live ``ttl`` seconds (always shorter than the Redis
done record's ``dedup_window``), at most ``maxsize`` of them.

Why not ``cachetools.TTLCache``: it allocates a GC-tracked link object per entry, and at
tens of thousands of completions per second those allocations set off full garbage
collections that stalled the event loop for 25-85 ms (measured by the benchmark harness,
``benchmarks/scenarios/latency_gc.py``). A dict of str -> float and two deques of str and
float allocate nothing the collector tracks.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import Any, Protocol

from streamwork._telemetry.logs import WORKER_LOGGER
from streamwork._text import describe
from streamwork.errors import ConfigError

log = logging.getLogger(WORKER_LOGGER)


class RecentKeys:
    """Job keys completed here within the last ``ttl`` seconds (at most ``maxsize``)."""

    __slots__ = ("_clock", "_keys", "_times", "_until", "maxsize", "ttl")

    def __init__(self, maxsize: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.maxsize = maxsize
        self.ttl = ttl
        self._clock = clock
        self._until: dict[str, float] = {}
        self._keys: deque[str] = deque()
        self._times: deque[float] = deque()

    def __contains__(self, key: object) -> bool:
        until = self._until.get(key)  # type: ignore[call-overload]
        return until is not None and until > self._clock()

    def __len__(self) -> int:
        return len(self._until)

    def clear(self) -> None:
        """Forget every key (Redis may have lost what they stand for)."""
        self._until.clear()
        self._keys.clear()
        self._times.clear()

    def add(self, key: str) -> None:
        """Remember ``key`` as completed now; forget what expired or overflows."""
        now = self._clock()
        until = now + self.ttl
        self._until[key] = until
        self._keys.append(key)
        self._times.append(until)
        keys, times, table = self._keys, self._times, self._until
        while keys and (times[0] <= now or len(table) > self.maxsize):
            old, when = keys.popleft(), times.popleft()
            if table.get(old) == when:
                del table[old]


class KeyCache(Protocol):
    """What the consumer needs of a local cache: "done here recently?" and "remember"."""

    def __contains__(self, key: object) -> bool: ...

    def add(self, key: str) -> None: ...

    def clear(self) -> None: ...


class MappingKeys:
    """A user's cache (any ``cachetools`` cache, or another mutable mapping) as a KeyCache:
    its own size and until rules decide what it forgets. Used from the worker's event loop
    thread only, so a cachetools cache needs no lock.

    It is user code: the first error it raises is logged and the cache is used no more
    (every key a miss, so the job records in Redis decide), since a cache that failed to
    take or forget a key can no longer be trusted."""

    __slots__ = ("broken", "mapping")

    def __init__(self, mapping: MutableMapping[str, Any]) -> None:
        self.mapping = mapping
        self.broken = False

    def __contains__(self, key: object) -> bool:
        if self.broken:
            return False
        try:
            return key in self.mapping
        except Exception as exc:
            self._failed("looking up a key", exc)
            return False

    def add(self, key: str) -> None:
        if not self.broken:
            try:
                self.mapping[key] = True
            except Exception as exc:
                self._failed("adding a key", exc)

    def clear(self) -> None:
        if not self.broken:
            try:
                self.mapping.clear()
            except Exception as exc:
                self._failed("clearing it", exc)

    def _failed(self, doing: str, exc: Exception) -> None:
        self.broken = True
        log.error("the local_cache raised %s while %s; it is used no more (Redis's job "
                  "records decide what is a duplicate)", describe(exc), doing)


def local_cache(option: object, maxsize: int, ttl: float) -> KeyCache | None:
    """The local cache a worker uses: ``option`` None -> the project's own RecentKeys
    (``maxsize``/``ttl``; none when either is 0); a mutable mapping such as
    ``cachetools.TTLCache(maxsize=100_000, ttl=60)`` -> that; ``False`` -> no local cache."""
    if option is None:
        return RecentKeys(maxsize, ttl) if maxsize and ttl else None
    if option is False:
        return None
    if isinstance(option, MutableMapping):
        return MappingKeys(option)
    raise ConfigError(
        "local_cache",
        f"must be None (the built-in cache), False (no cache) or a mutable mapping such as "
        f"cachetools.TTLCache(maxsize=100_000, ttl=60), got {type(option).__name__}")
