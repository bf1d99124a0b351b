"""The failure decision (streamwork._worker.core.failure): what becomes of a job whose handler
raised, and the row fail.lua gets for it. Pure, no Redis."""

from __future__ import annotations

import dataclasses

import pytest

import streamwork as sw
from streamwork._redis.replies import FailAction
from streamwork._worker.config import WorkerConfig
from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.failure import (
    HandlerTimeout,
    Verdict,
    decide,
    described,
    fail_row,
    failure,
    overran,
)
from streamwork._worker.core.retry import JITTER_FRACTION

CFG = WorkerConfig(stream="jobs", group="g", max_deliveries=3, retry_delay=1.0,
                   retry_max_delay=60.0)


def _msg(attempt: int = 1) -> sw.Message:
    return sw.Message("1-1", "jobs", "k", {"x": 1}, attempt, 0.0, {})


def test_a_failure_is_retried_after_the_backoff() -> None:
    verdict = decide(ValueError("boom"), _msg(1), False, CFG)
    assert verdict.action is FailAction.RETRY and verdict.reason == "retry"
    assert 1.0 <= verdict.delay <= 1.0 + JITTER_FRACTION


def test_the_backoff_grows_with_the_attempt() -> None:
    verdict = decide(ValueError("boom"), _msg(2), False, CFG)
    assert 2.0 <= verdict.delay <= 2.0 + JITTER_FRACTION


def test_a_retry_asks_for_its_own_delay_capped() -> None:
    assert decide(sw.Retry(delay=7), _msg(), False, CFG) == Verdict(FailAction.RETRY, "retry", 7.0)
    assert decide(sw.Retry(delay=1e9), _msg(), False, CFG).delay == 60.0


def test_the_last_attempt_is_dead_lettered() -> None:
    assert decide(ValueError("boom"), _msg(3), False, CFG) == \
        Verdict(FailAction.DEAD, "max_deliveries")
    assert decide(ValueError("boom"), _msg(3), True, CFG) == Verdict(FailAction.DEAD, "timeout")


def test_a_timeout_before_the_last_attempt_is_retried_as_a_timeout() -> None:
    verdict = decide(HandlerTimeout("late"), _msg(1), True, CFG)
    assert verdict.action is FailAction.RETRY and verdict.reason == "timeout"


def test_dead_letter_asked_for_is_not_retried() -> None:
    assert decide(sw.DeadLetter("bad input"), _msg(1), False, CFG) == \
        Verdict(FailAction.DEAD, "dead_letter: bad input")


@pytest.mark.parametrize("exc", [ValueError("boom"), sw.Retry(delay=1), sw.DeadLetter("x")])
def test_a_cancelled_job_ends_cancelled_whatever_it_raised(exc: Exception) -> None:
    msg = _msg(3)
    msg._cancelled = True
    assert decide(exc, msg, True, CFG) == Verdict(FailAction.CANCEL, "cancelled")


def test_the_failure_record_and_its_fail_row() -> None:
    msg = _msg(2)
    d = Delivery(b"1-1", 0, msg, b"body", None, b"1-1")
    d.lease_id = "owner:7"
    try:
        raise ValueError("boom")
    except ValueError as exc:
        f = failure(d, exc, Verdict(FailAction.RETRY, "retry", 1.5), 12.5)
    assert (f.action, f.delay_ms, f.attempts, f.reason) == (FailAction.RETRY, 1500, 2, "retry")
    assert f.error_type == "ValueError" and f.detail.startswith("boom\n")
    assert "Traceback" in f.traceback and f.took_ms == 12.5
    assert described(f) == "ValueError: boom"
    row = fail_row(f)
    assert row[:8] == [b"1-1", 0, "r", 1500, 2, "k", "owner:7", b""]
    assert row[-2] == b"body" and row[-1]  # the body to dead-letter, the record's error


def test_a_failure_without_a_delivery_names_no_lease() -> None:
    msg = _msg()
    d = Delivery(b"1-1", 0, msg, b"", None, b"1-1")
    f = dataclasses.replace(failure(d, ValueError("x"), Verdict(FailAction.DEAD, "r"), 0.0),
                            delivery=None, job_key="")
    row = fail_row(f)
    assert row[2] == "d" and row[6:8] == ["", b""] and row[-1] == ""


def test_the_time_out_error_says_what_happened_to_the_handler() -> None:
    assert "cancelled" in str(overran(2.0, True))
    assert "abandoned" in str(overran(2.0, False)) and "2 s" in str(overran(2.0, False))
