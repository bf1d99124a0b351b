"""The job retry policy: how long a failed job waits before it runs again (tenacity's
wait strategies, so the shape is the well-known one). The reconnect policy for Redis
outages belongs to connections and lives in connection.py."""

from __future__ import annotations

import math
from typing import Final

import tenacity
from tenacity.wait import wait_base

JITTER_FRACTION: Final = 0.25  #: retry jitter is up to this fraction of retry_delay


class _State:
    """The one attribute tenacity's wait strategies read."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


def job_jitter(retry_delay: float, retry_max_delay: float) -> float:
    """Width of the random part of a job's retry delay: a quarter of ``retry_delay``, but
    never wider than the cap itself."""
    return max(0.0, min(JITTER_FRACTION * retry_delay, retry_max_delay))


def job_wait(retry_delay: float, retry_max_delay: float) -> wait_base:
    """Exponential backoff with jitter: ``retry_delay * 2**(n-1)`` plus up to 25% of
    ``retry_delay``, never over ``retry_max_delay``.

    The jitter is kept at the cap: the exponential part is capped ``J`` (the jitter width)
    below ``retry_max_delay`` and the jitter added on top, so delays past the cap spread
    over ``[retry_max_delay - J, retry_max_delay]`` instead of all landing on the cap at
    the same instant."""
    jitter = job_jitter(retry_delay, retry_max_delay)
    return tenacity.wait_exponential(
        multiplier=retry_delay, max=max(0.0, retry_max_delay - jitter)
    ) + tenacity.wait_random(0, jitter)


def retry_delay_for(attempt: int, retry_delay: float, retry_max_delay: float, *,
                    explicit: float | None = None) -> float:
    """Seconds to wait before re-running a job whose delivery ``attempt`` just failed.

    ``explicit`` is a delay the handler asked for (``Retry(delay=...)``): used as it is,
    but never longer than ``retry_max_delay``, so a retried job always comes back within
    the redelivery horizon that ``dedup_window`` is checked against (its done record is
    still there). Without it (or if it is NaN, or no number at all: a handler's own Retry
    subclass may set anything) the backoff of :func:`job_wait` applies."""
    if explicit is not None:
        try:
            seconds = float(explicit)
        except Exception:  # whatever the user's object raises
            seconds = math.nan
        if not math.isnan(seconds):
            return float(min(max(seconds, 0.0), retry_max_delay))
    delay = job_wait(retry_delay, retry_max_delay)(_State(max(attempt, 1)))  # type: ignore[arg-type]
    # the sum of the two parts is at most the cap but for float rounding (one ulp)
    return float(min(delay, retry_max_delay))
