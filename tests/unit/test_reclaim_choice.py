"""Which idle deliveries the reclaimer takes back as a batch (pure: no Redis)."""

from __future__ import annotations

from typing import Any

from streamwork._worker.loops.reclaim import _first_deliveries


def _idle(*counts: int, mine: int = -1) -> list[dict[str, Any]]:
    return [{"message_id": f"{i}-0", "times_delivered": n,
             "consumer": b"me" if i == mine else b"dead-one"} for i, n in enumerate(counts)]


def test_first_deliveries_in_a_row_from_the_oldest() -> None:
    assert _first_deliveries(_idle(1, 1, 1), 5, "me") == 3
    assert _first_deliveries(_idle(1, 1, 2, 1), 5, "me") == 2


def test_a_suspect_first_means_no_batch() -> None:
    assert _first_deliveries(_idle(2, 1, 1), 5, "me") == 0


def test_no_batch_when_max_deliveries_leaves_no_lone_try() -> None:
    """A batch's try is a job's 2nd delivery; should the batch die, the lone try is its
    3rd: with max_deliveries under 3 every reclaim is one at a time."""
    assert _first_deliveries(_idle(1, 1), 2, "me") == 0
    assert _first_deliveries(_idle(1, 1), 3, "me") == 2


def test_this_consumers_own_deliveries_are_never_taken_as_a_batch() -> None:
    """Its own idle deliveries may be finishing (outcome on its way): a batch stops there,
    and a sweep that starts with one takes the lone path (which waits until it holds
    nothing) instead."""
    assert _first_deliveries(_idle(1, 1, 1, mine=1), 5, "me") == 1
    assert _first_deliveries(_idle(1, 1, mine=0), 5, "me") == 0


def test_deliveries_handed_back_unrun_count_as_first_deliveries() -> None:
    """A worker stopped while its group was paused hands back what it never ran with its
    delivery count taken back to 0: such deliveries join a batch like first ones."""
    assert _first_deliveries(_idle(0, 1, 0), 5, "me") == 3
    assert _first_deliveries(_idle(0, 2, 1), 5, "me") == 1
