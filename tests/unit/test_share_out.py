"""share_out (streamwork._worker.partitioned): which partitions each live member owns.
Pure, no Redis."""

from __future__ import annotations

from streamwork._worker.partitioned import share_out


def test_partitions_are_dealt_round_robin_in_sorted_member_order() -> None:
    assert share_out(["b/*", "a/*"], 5) == {"a/*": [0, 2, 4], "b/*": [1, 3]}


def test_every_member_computes_the_same_map_whatever_the_order() -> None:
    members = ["w3:x/*", "w1:y/*", "w2:z/*"]
    assert share_out(members, 7) == share_out(list(reversed(members)), 7)


def test_a_member_takes_only_the_partitions_its_suffix_lists() -> None:
    # 0: both may, neither owns any: the first; 1: "b" owns fewer; 2, 3: only "b" may
    assert share_out(["a/0,1", "b/*"], 4) == {"a/0,1": [0], "b/*": [1, 2, 3]}
    assert share_out(["a/2,3", "b/0"], 4) == {"a/2,3": [2, 3], "b/0": [0]}


def test_a_partition_nobody_may_take_stays_unowned() -> None:
    owned = share_out(["a/0", "b/1"], 3)
    assert owned == {"a/0": [0], "b/1": [1]}


def test_no_members_own_nothing() -> None:
    assert share_out([], 4) == {}


def test_more_members_than_partitions_leave_some_idle() -> None:
    owned = share_out(["a/*", "b/*", "c/*"], 2)
    assert owned == {"a/*": [0], "b/*": [1], "c/*": []}
