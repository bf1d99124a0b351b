"""How figures are written, the same in the CLI and on the dashboard (no Redis)."""

from __future__ import annotations

import time

import pytest

from streamwork._ops.format import fmt_age, fmt_count, fmt_rate, fmt_when


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"), (0, "0.0s"), (0.42, "0.4s"), (9.96, "10.0s"), (10, "10s"), (59.9, "59s"),
    (60, "1m00s"), (247, "4m07s"), (3599, "59m59s"), (3600, "1h00m"), (7380, "2h03m"),
    (86399, "23h59m"), (86400, "1d00h"), (273600, "3d04h"),
])
def test_ages(seconds: float | None, shown: str) -> None:
    assert fmt_age(seconds) == shown


def test_counts_and_rates() -> None:
    assert [fmt_count(v) for v in (None, 0, 7, 12345, 1234567)] == [
        "?", "0", "7", "12,345", "1,234,567"]
    assert [fmt_rate(v) for v in (None, 0.0, 0.04, 12.345, 1234.5)] == [
        "-", "0.0", "0.0", "12.3", "1,234.5"]


def test_times_are_local() -> None:
    assert fmt_when(None) == "-"
    ts = 1_700_000_000.7
    assert fmt_when(ts) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
