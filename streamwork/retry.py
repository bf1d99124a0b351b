"""Backoff policies: job retry delays, and the reconnect policy for Redis outages.

Both come from tenacity's wait strategies, so their shapes are the well-known ones.
"""

from __future__ import annotations

from typing import Final

import redis.exceptions
import tenacity
from tenacity.wait import wait_base

#: transport failures that a retry may cure (the server restarting, a dropped socket)
TRANSIENT: Final = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    ConnectionError,
    TimeoutError,
    OSError,
)

JITTER_FRACTION: Final = 0.25  #: retry jitter is up to this fraction of retry_delay


class _State:
    """The one attribute tenacity's wait strategies read."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


def job_wait(retry_delay: float, retry_max_delay: float) -> wait_base:
    """Exponential backoff with jitter: ``retry_delay * 2**(n-1)`` plus up to 25% of
    ``retry_delay``, capped at ``retry_max_delay``."""
    return tenacity.wait_exponential(
        multiplier=retry_delay, min=retry_delay, max=retry_max_delay
    ) + tenacity.wait_random(0, retry_delay * JITTER_FRACTION)


def retry_delay_for(attempt: int, retry_delay: float, retry_max_delay: float) -> float:
    """Seconds to wait before re-running a job whose delivery ``attempt`` just failed."""
    delay = job_wait(retry_delay, retry_max_delay)(_State(max(attempt, 1)))  # type: ignore[arg-type]
    return float(min(delay, retry_max_delay))


def reconnect_wait() -> wait_base:
    """Wait between reconnect attempts: 50 ms doubling to 2 s, with jitter."""
    return tenacity.wait_exponential(multiplier=0.05, max=2.0) + tenacity.wait_random(0, 0.05)


def reconnect_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive transport errors."""
    return float(reconnect_wait()(_State(max(failures, 1))))  # type: ignore[arg-type]
