"""Which idle deliveries the reclaimer takes back as a batch (pure: no Redis)."""

from __future__ import annotations

from typing import Any

from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.letgo import LetGo, first_deliveries


def _first_deliveries(idle: list[dict[str, Any]], max_deliveries: int, me: str,
                      let_go: LetGo | None = None) -> tuple[list[Any], bool]:
    return first_deliveries(idle, max_deliveries, me, 0, let_go or _let_go())


def _let_go(limit: int = 100, max_deliveries: int = 5, redis_down: bool = True) -> LetGo:
    """What a consumer remembers of deliveries it let go; ``redis_down``: whether Redis
    was unreachable as their leases ran out (an outage) or answered (a blocked loop)."""
    return LetGo(limit, max_deliveries, lambda: redis_down)


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


def _dropped(entry_id: str, count: int) -> Delivery:
    """A delivery this process held (delivered ``count`` times) and let go."""
    key = entry_id.encode()
    return Delivery(key, 0, None, b"", None, key, count=count)  # type: ignore[arg-type]


def test_own_deliveries_let_go_here_stay_innocent_through_outage_after_outage() -> None:
    """One this process read itself (a first delivery) and let go as its lease lapsed
    comes back in the batch; taken back, it is delivered twice, and let go again (a second
    outage) it still comes back in the batch: this process is alive, so it killed no one."""
    lg = _let_go()
    lg.remember(_dropped("1-0", 1))
    assert _first_deliveries(_idle(1, 1, mine=1), 5, "me", lg) == (["0-0", "1-0"], True)
    assert lg.taken_back(b"1-0", 2)  # the sweep claimed it back: delivered twice now
    lg.remember(_dropped("1-0", 2))  # ... and let it go again
    assert _first_deliveries(_idle(1, 2, mine=1), 5, "me", lg) == (["0-0", "1-0"], True)
    assert lg.taken_back(b"1-0", 3)
    lg.remember(_dropped("1-0", 3))
    assert _first_deliveries(_idle(1, 3, mine=1), 5, "me", lg) == (["0-0", "1-0"], True)


def test_a_claim_back_whose_reply_was_lost_keeps_it_innocent() -> None:
    """Redis went down as the sweep claimed it back: the count went up by one, the
    delivery is still this consumer's own, so still the one let go here."""
    lg = _let_go()
    lg.remember(_dropped("0-0", 1))
    assert lg.innocent(b"0-0", 2)
    assert lg.taken_back(b"0-0", 3)  # claimed back twice, the first reply lost


def test_suspects_stay_suspects() -> None:
    """Delivered twice before this process took it (a batch of a dead worker's, which
    may hold what killed it): let go here, it is still a suspect. Another consumer's idle
    delivery is never taken for one let go here, nor one whose count moved on."""
    lg = _let_go()
    lg.remember(_dropped("0-0", 2))  # reclaimed from a dead worker, then let go
    assert _first_deliveries(_idle(2, mine=0), 5, "me", lg) == ([], False)
    assert not lg.taken_back(b"0-0", 3)
    lg.remember(_dropped("1-0", 1))
    assert _first_deliveries(_idle(1, 2), 5, "me", lg) == (["0-0"], False)  # not mine
    assert _first_deliveries(_idle(1, 3, mine=1), 5, "me", lg) == (["0-0"], False)
    assert not lg.taken_back(b"1-0", 4)
    # taken back as a suspect (alone, not through taken_back): let go, still a suspect
    lg.remember(_dropped("1-0", 4))
    assert not lg.innocent(b"1-0", 4)


def test_max_deliveries_under_3_still_takes_everything_alone() -> None:
    lg = _let_go(max_deliveries=2)
    lg.remember(_dropped("0-0", 1))
    assert _first_deliveries(_idle(1, mine=0), 2, "me", lg) == ([], False)


def test_a_batch_never_takes_one_whose_lone_try_would_be_past_max_deliveries() -> None:
    """Should the batch die, each of it must still have a try of its own: an innocent
    delivered max_deliveries - 1 times is taken back alone."""
    lg = _let_go(max_deliveries=4)
    lg.remember(_dropped("0-0", 2))  # delivered twice before it came here: not innocent
    lg.remember(_dropped("1-0", 1))
    assert lg.taken_back(b"1-0", 2)
    lg.remember(_dropped("1-0", 2))
    assert _first_deliveries(_idle(1, 2, mine=1), 4, "me", lg) == (["0-0", "1-0"], True)
    assert lg.taken_back(b"1-0", 3)
    lg.remember(_dropped("1-0", 3))  # taken back once more it would be at 4, alone at 5
    assert _first_deliveries(_idle(1, 3, mine=1), 4, "me", lg) == (["0-0"], False)
    assert not lg.taken_back(b"1-0", 4)


def test_leases_that_ran_out_while_redis_answered_are_not_remembered() -> None:
    """A handler blocking the event loop lets every lease of its process run out while
    Redis answers: what blocked it may be among them, so they come back as suspects, one
    at a time, as before (taking them back together would block the batch again)."""
    lg = _let_go(redis_down=False)
    lg.remember(_dropped("1-0", 1))
    assert not lg.innocent(b"1-0", 1) and not lg.innocent(b"1-0", 2)
    assert _first_deliveries(_idle(1, 2, mine=1), 5, "me", lg) == (["0-0"], False)


def test_what_it_remembers_is_bounded() -> None:
    """The oldest are forgotten first (a forgotten one is merely taken back alone)."""
    lg = _let_go(limit=3)
    for i in range(5):
        lg.remember(_dropped(f"{i}-0", 1))
    assert [lg.innocent(f"{i}-0".encode(), 1) for i in range(5)] == [
        False, False, True, True, True]
