"""What a Redis outage costs a worker, in one line: leases that lapse and jobs that vanish
while Redis is (or just was) unreachable come one per held job, by the dozen, and say
nothing the outage's own lines do not. The first gets a WARNING, the rest a DEBUG line
each, and once Redis has been back a while one WARNING sums them up."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from streamwork._telemetry.logs import WORKER_LOGGER

log = logging.getLogger(WORKER_LOGGER)


class Fold:
    """The deliveries one consumer gave up in the current outage, by counter."""

    __slots__ = ("_counts", "_down", "_lapsed", "_last", "_quiet")

    def __init__(self, down: Callable[[], bool],
                 lapsed: Callable[[float], bool] = lambda deadline: False,
                 quiet: float = 0.0) -> None:
        self._down = down  # whether Redis is, or just was, unreachable
        self._lapsed = lapsed  # whether a lease's deadline fell in an outage
        self._quiet = quiet  # s without another one before the outage's line is written
        self._counts: dict[str, int] = {}
        self._last = 0.0  # monotonic time of the last one folded

    def add(self, counter: str, line: str, extra: dict[str, Any],
            deadline: float = 0.0) -> bool:
        """Fold one given-up delivery (``line`` says why; ``deadline``: its lease's) into
        the outage it is due to: Redis is or just was down, or its lease ran out in an
        outage (found when its completion is refused, later on a slow machine). False
        (nothing logged) when it is due to none: the caller logs it alone."""
        if not (self._down() or (deadline and self._lapsed(deadline))):
            return False
        self._counts[counter] = self._counts.get(counter, 0) + 1
        self._last = time.monotonic()
        if sum(self._counts.values()) == 1:
            log.warning("%s (in an outage of Redis or of the lock quorum: the other jobs "
                        "this worker gives up meanwhile are counted, and summed up once it is "
                        "over)", line, extra=extra)
        else:
            log.debug("%s", line, extra=extra)
        return True

    def report(self, fields: Callable[..., dict[str, Any]]) -> None:
        """Once Redis has been back a while and nothing more was folded for ``quiet`` s:
        one line for what the outage cost, if any."""
        if not self._counts or self._down() or time.monotonic() - self._last < self._quiet:
            return
        lost, vanished = self._counts.get("lock_lost", 0), self._counts.get("vanished", 0)
        self._counts = {}
        log.warning("the Redis outage cost %d held job%s: %d lease%s lapsed (their jobs run "
                    "again here or elsewhere), %d vanished with Redis's data", lost + vanished,
                    "" if lost + vanished == 1 else "s", lost, "" if lost == 1 else "s",
                    vanished, extra=fields(count=lost + vanished))
