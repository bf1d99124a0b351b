"""Rates over the last minutes, for the dashboard's sparklines: kept in memory only.

A :class:`Sampler` thread takes a :func:`~streamwork._dashboard.data.snapshot` every
``interval_s`` seconds (the first page's read, if it comes first, is the first sample) and
hands it to a :class:`RateHistory`, which turns each pair of
consecutive samples of a stream into produced/s and acked/s per group
(:func:`streamwork._ops.rates.compute_rates`, as ``streamwork top`` does) and keeps the last
``window_s`` seconds of them. Nothing is written to Redis; a restart starts afresh.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamwork._ops.rates import StreamRates, compute_rates
from streamwork._ops.stats import StreamStats

__all__ = ["RateHistory", "Sampler"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Series:
    last: StreamStats
    rates: deque[StreamRates]


class RateHistory:
    """The last ``points`` rates of every stream (thread-safe)."""

    def __init__(self, points: int) -> None:
        if points < 2:
            raise ValueError(f"points must be at least 2, got {points}")
        self.points = points
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}
        self._taken = False  #: whether a sample was taken (streams or none)

    def add(self, sample: Sequence[StreamStats], *, first: bool = False) -> None:
        """Take one sample of every stream; streams no longer in it are forgotten. With
        ``first``, only when none was taken yet (the first page's read is the first sample:
        the sampler does not read every stream again at the same moment)."""
        with self._lock:
            if first and self._taken:
                return
            self._taken = True
            kept: dict[str, _Series] = {}
            for s in sample:
                old = self._series.get(s.stream)
                rates = old.rates if old is not None else deque(maxlen=self.points)
                if old is not None:
                    rates.append(compute_rates(old.last, s))
                kept[s.stream] = _Series(s, rates)
            self._series = kept

    def _rates(self, stream: str) -> list[StreamRates]:
        with self._lock:
            found = self._series.get(stream)
            return list(found.rates) if found is not None else []

    def produced(self, stream: str) -> list[float | None]:
        """produced/s of ``stream``, oldest first."""
        return [r.produced_per_s for r in self._rates(stream)]

    def acked(self, stream: str, group: str) -> list[float | None]:
        """acked/s of ``group`` on ``stream``, oldest first."""
        return [r.acked_per_s.get(group) for r in self._rates(stream)]


class Sampler:
    """A daemon thread feeding ``history`` with ``take()`` every ``interval_s`` seconds;
    a failed sample (Redis down) is logged and skipped."""

    def __init__(self, take: Callable[[], Sequence[StreamStats]], history: RateHistory,
                 interval_s: float) -> None:
        self._take = take
        self.history = history
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="streamwork-dashboard-sampler",
                                        daemon=True)

    def _loop(self) -> None:
        # the first sample after one interval: the first page's read is the first sample
        # (RateHistory.add(first=True)), not a second read of every stream at the same moment
        while not self._stop.wait(self.interval_s):
            try:
                self.history.add(self._take())
            except Exception as exc:  # the page shows Redis errors; here only skip a point
                log.warning("dashboard sample failed: %s: %s", type(exc).__name__, exc)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
