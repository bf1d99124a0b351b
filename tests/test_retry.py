"""Job retry backoff (streamwork._worker.core.retry.retry_delay_for): exponential, jittered, capped.

Pure: no Redis, no clock. Randomness is checked over many draws; the bounds asserted are
exact, the spreads asserted fail with probability below 1e-40.
"""

from __future__ import annotations

import math

import pytest

from streamwork._worker.core.retry import JITTER_FRACTION, retry_delay_for

DRAWS = 1000


def _draws(attempt: int, retry_delay: float, retry_max_delay: float) -> list[float]:
    return [retry_delay_for(attempt, retry_delay, retry_max_delay) for _ in range(DRAWS)]


@pytest.mark.parametrize("attempt", [10, 50, 1100, 10**6])
def test_delays_past_the_cap_never_exceed_it_and_keep_their_jitter(attempt: int) -> None:
    """Far past the cap every delay is <= retry_max_delay, yet they are not all the cap:
    they spread over [cap - J, cap] (J = retry_delay / 4), so retries do not all fire at
    the same instant."""
    cap, jitter = 300.0, 1.0 * JITTER_FRACTION
    delays = _draws(attempt, 1.0, cap)
    assert all(cap - jitter <= d <= cap for d in delays), (min(delays), max(delays))
    assert len(set(delays)) > DRAWS // 2, "the jitter was clipped away at the cap"
    assert min(delays) < cap - 0.9 * jitter and max(delays) > cap - 0.1 * jitter


@pytest.mark.parametrize(("retry_delay", "retry_max_delay"),
                         [(1.0, 300.0), (0.05, 0.5), (2.0, 2.5), (4.0, 5.0)])
def test_first_retry_is_retry_delay_plus_up_to_a_quarter(retry_delay: float,
                                                         retry_max_delay: float) -> None:
    """When the cap allows it (cap >= 1.25 x retry_delay), the first retry waits
    retry_delay plus a jitter of up to 25% of it."""
    delays = _draws(1, retry_delay, retry_max_delay)
    assert all(retry_delay <= d <= retry_delay * 1.25 for d in delays)
    assert len(set(delays)) > DRAWS // 2


def test_delays_double_below_the_cap() -> None:
    """Below the cap attempt n waits retry_delay * 2**(n-1) plus the jitter."""
    for attempt in range(1, 9):
        base = 0.5 * 2 ** (attempt - 1)
        delays = _draws(attempt, 0.5, 1000.0)
        assert all(base <= d <= base + 0.5 * JITTER_FRACTION for d in delays), attempt


def test_near_the_cap_the_jitter_is_taken_below_it() -> None:
    """Where the exponential part comes within J of the cap it stops at cap - J, and the
    jitter is added below the cap, never above it."""
    # 1 * 2**8 = 256 <= 300 - 0.25: untouched
    assert all(256.0 <= d <= 256.25 for d in _draws(9, 1.0, 300.0))
    # 256 is within J of a 256.1 cap: the exponential part stops at 255.85
    delays = _draws(9, 1.0, 256.1)
    assert all(255.85 <= d <= 256.1 for d in delays)
    assert min(delays) < 255.9 and max(delays) > 256.05
    # a cap tighter than retry_delay * 1.25: the first retry spreads over [cap - J, cap]
    delays = _draws(1, 1.0, 1.1)
    assert all(0.85 <= d <= 1.1 for d in delays)
    assert min(delays) < 0.9 and max(delays) > 1.05


def test_jitter_is_never_wider_than_the_cap() -> None:
    """A cap below J (possible for callers outside WorkerConfig) bounds the jitter too."""
    delays = _draws(3, 1.0, 0.1)
    assert all(0.0 <= d <= 0.1 for d in delays)
    assert len(set(delays)) > DRAWS // 2


def test_zero_retry_delay_retries_at_once() -> None:
    assert {retry_delay_for(a, 0.0, 0.0) for a in (1, 5, 100)} == {0.0}
    assert {retry_delay_for(a, 0.0, 10.0) for a in (1, 5, 100)} == {0.0}


def test_attempt_below_one_counts_as_the_first() -> None:
    assert all(1.0 <= retry_delay_for(a, 1.0, 300.0) <= 1.25 for a in (0, -3))


def test_explicit_delay_is_used_as_is_up_to_the_cap() -> None:
    """Retry(delay=x): x exactly, whatever the attempt, but never over retry_max_delay (a
    later delivery would find its done-marker expired); negative counts as 0."""
    for explicit in (0.0, 0.001, 2.5, 299.999, 300.0):
        assert retry_delay_for(7, 1.0, 300.0, explicit=explicit) == explicit
    for explicit in (300.5, 1e9, math.inf):
        assert retry_delay_for(1, 1.0, 300.0, explicit=explicit) == 300.0
    assert retry_delay_for(1, 1.0, 300.0, explicit=-1.0) == 0.0
    assert isinstance(retry_delay_for(1, 1.0, 300.0, explicit=3), float)


def test_nan_explicit_delay_falls_back_to_the_backoff() -> None:
    delays = [retry_delay_for(1, 1.0, 300.0, explicit=math.nan) for _ in range(100)]
    assert all(1.0 <= d <= 1.25 for d in delays)


def test_explicit_none_is_the_backoff() -> None:
    delays = [retry_delay_for(50, 1.0, 300.0, explicit=None) for _ in range(DRAWS)]
    assert all(299.75 <= d <= 300.0 for d in delays)
    assert len(set(delays)) > 1
