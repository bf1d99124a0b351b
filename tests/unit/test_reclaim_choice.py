"""Which idle deliveries the reclaimer takes back as a batch (pure: no Redis)."""

from __future__ import annotations

from typing import Any

from streamwork._worker.loops.reclaim import _first_deliveries


def _idle(*counts: int, mine: int = -1) -> list[dict[str, Any]]:
    return [{"message_id": f"{i}-0", "times_delivered": n,
             "consumer": b"me" if i == mine else b"dead-one"} for i, n in enumerate(counts)]


def test_first_deliveries_in_a_row_from_the_oldest() -> None:
    assert _first_deliveries(_idle(1, 1, 1), 5, "me") == (3, False)
    assert _first_deliveries(_idle(1, 1, 2, 1), 5, "me") == (2, False)


def test_a_suspect_first_means_no_batch() -> None:
    assert _first_deliveries(_idle(2, 1, 1), 5, "me")[0] == 0


def test_no_batch_when_max_deliveries_leaves_no_lone_try() -> None:
    """A batch's try is a job's 2nd delivery; should the batch die, the lone try is its
    3rd: with max_deliveries under 3 every reclaim is one at a time."""
    assert _first_deliveries(_idle(1, 1), 2, "me") == (0, False)
    assert _first_deliveries(_idle(1, 1), 3, "me") == (2, False)


def test_this_consumers_own_deliveries_are_said_so() -> None:
    """Its own idle deliveries may be finishing (outcome on its way): the sweep takes them
    as a batch only once it holds nothing (no longer one at a time: after a Redis outage
    longer than the visibility timeout, most idle deliveries are the worker's own)."""
    assert _first_deliveries(_idle(1, 1, 1, mine=1), 5, "me") == (3, True)
    assert _first_deliveries(_idle(1, 1, mine=0), 5, "me") == (2, True)
    assert _first_deliveries(_idle(1, 2, mine=1), 5, "me") == (1, False)
