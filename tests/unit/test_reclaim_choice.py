"""Which idle deliveries the reclaimer takes back as a batch (pure: no Redis)."""

from __future__ import annotations

from typing import Any

from streamwork._worker.loops.reclaim import _first_deliveries


def _idle(*counts: int, mine: int = -1) -> list[dict[str, Any]]:
    return [{"message_id": f"{i}-0", "times_delivered": n,
             "consumer": b"me" if i == mine else b"dead-one"} for i, n in enumerate(counts)]


def test_every_first_delivery_of_the_list_is_in_the_batch() -> None:
    assert _first_deliveries(_idle(1, 1, 1), 5, "me") == (["0-0", "1-0", "2-0"], False)
    assert _first_deliveries(_idle(1, 1, 2, 1), 5, "me") == (["0-0", "1-0", "3-0"], False)


def test_suspects_before_them_do_not_stop_the_batch() -> None:
    """A suspect (delivered twice) is left for the lone path; the deliveries made once
    after it still come back as a batch."""
    assert _first_deliveries(_idle(2, 1, 1), 5, "me") == (["1-0", "2-0"], False)
    assert _first_deliveries(_idle(2, 3), 5, "me") == ([], False)


def test_no_batch_when_max_deliveries_leaves_no_lone_try() -> None:
    """A batch's try is a job's 2nd delivery; should the batch die, the lone try is its
    3rd: with max_deliveries under 3 every reclaim is one at a time."""
    assert _first_deliveries(_idle(1, 1), 2, "me") == ([], False)
    assert _first_deliveries(_idle(1, 1), 3, "me") == (["0-0", "1-0"], False)


def test_this_consumers_own_deliveries_are_said_so() -> None:
    """Its own idle deliveries may be finishing (outcome on its way): the sweep takes them
    as a batch only once it holds nothing (no longer one at a time: after a Redis outage
    longer than the visibility timeout, most idle deliveries are the worker's own)."""
    assert _first_deliveries(_idle(1, 1, 1, mine=1), 5, "me")[1] is True
    assert _first_deliveries(_idle(1, 2, mine=1), 5, "me") == (["0-0"], False)


def test_deliveries_handed_back_unrun_count_as_first_deliveries() -> None:
    """A worker stopped while its group was paused hands back what it never ran with its
    delivery count taken back to 0: such deliveries join a batch like first ones."""
    assert _first_deliveries(_idle(0, 1, 0), 5, "me") == (["0-0", "1-0", "2-0"], False)
    assert _first_deliveries(_idle(0, 2, 1), 5, "me") == (["0-0", "2-0"], False)
