"""The ``--fail-if`` language without Redis: parsing, and checking samples built by hand."""

from __future__ import annotations

import pytest

from streamwork._ops.stats import GroupStats, StreamStats
from streamwork._ops.thresholds import Threshold, check_thresholds, parse_threshold


def group(name: str, *, lag: int | None = 0, pending: int = 0,
          oldest: float | None = None) -> GroupStats:
    return GroupStats(name, 1, pending, oldest, lag, 0, "0-0")


def stream(name: str, *groups: GroupStats, dead: int = 0, delayed: int = 0,
           due: int = 0) -> StreamStats:
    return StreamStats(name, 0, None, "0-0", list(groups), delayed, due, dead)


@pytest.mark.parametrize(("text", "expected"), [
    ("lag>10000", Threshold("lag", ">", 10000.0)),
    (" pending >= 500 ", Threshold("pending", ">=", 500.0)),
    ("oldest-pending>2.5", Threshold("oldest-pending", ">", 2.5)),
    ("dead>0", Threshold("dead", ">", 0.0)),
    ("delayed>=1000", Threshold("delayed", ">=", 1000.0)),
    ("delayed-due>0", Threshold("delayed-due", ">", 0.0)),
])
def test_the_accepted_forms_parse(text: str, expected: Threshold) -> None:
    assert parse_threshold(text) == expected


@pytest.mark.parametrize("text", [
    "", "lag", "lag>", "lag<5", "lag=5", "lag>-1", "lag>1e3", "speed>1", "LAG>1", "lag>>1",
])
def test_anything_else_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="is not a threshold: use METRIC>N or METRIC>=N"):
        parse_threshold(text)


def test_crossed_and_str() -> None:
    above, at_least = Threshold("lag", ">", 10.0), Threshold("lag", ">=", 10.0)
    assert (above.crossed(10), above.crossed(10.5)) == (False, True)
    assert (at_least.crossed(9.9), at_least.crossed(10)) == (False, True)
    assert str(at_least) == "lag>=10" and str(Threshold("oldest-pending", ">", 2.5)) == (
        "oldest-pending>2.5")


def test_group_figures_name_the_worst_group_once_per_stream() -> None:
    s = stream("orders", group("audit", lag=5, pending=1), group("billing", lag=12000,
                                                                 pending=3))
    failures, warnings = check_thresholds([s], [parse_threshold("lag>10000"),
                                                parse_threshold("pending>=3")])
    assert failures == ["FAIL orders/billing: lag 12000 > 10000",
                        "FAIL orders/billing: pending 3 >= 3"]
    assert warnings == []


def test_stream_figures_and_ages() -> None:
    s = stream("orders", group("g", oldest=301.25), dead=2, delayed=7, due=1)
    failures, _ = check_thresholds([s], [parse_threshold(t) for t in (
        "dead>0", "delayed>=7", "delayed-due>1", "oldest-pending>300")])
    assert failures == ["FAIL orders: dead 2 > 0", "FAIL orders: delayed 7 >= 7",
                        "FAIL orders/g: oldest-pending 301.2s > 300s"]


def test_nothing_pending_counts_as_age_zero_and_no_groups_cross_nothing() -> None:
    assert check_thresholds([stream("s", group("g"))],
                            [parse_threshold("oldest-pending>=0")]) == (
        ["FAIL s/g: oldest-pending 0s >= 0s"], [])
    assert check_thresholds([stream("s")], [parse_threshold("lag>0")]) == ([], [])


def test_an_unknown_lag_is_a_warning_not_a_pass_or_a_failure() -> None:
    s = stream("s", group("blind", lag=None), group("seen", lag=3))
    assert check_thresholds([s], [parse_threshold("lag>2")]) == (
        ["FAIL s/seen: lag 3 > 2"],
        ["WARN s/blind: Redis cannot tell this group's lag; lag>2 not checked"])
