"""Arrival (streamwork._worker.core.arrival): a stream entry decoded and vetted into a Delivery,
or the reason it can never run. Pure, no Redis."""

from __future__ import annotations

from typing import Any

from streamwork._wire.codec import ATTEMPTS_FIELD, BODY_FIELD, encode_body
from streamwork._worker.config import WorkerConfig
from streamwork._worker.core.arrival import Arrival, Unfit
from streamwork._worker.core.delivery import MAIN, RETRY, Delivery, State

CFG = WorkerConfig(stream="jobs", group="g", max_deliveries=3)


def _fields(key: str = "k", payload: Any = None, attempts: int | None = None) -> list[bytes]:
    body = encode_body(key, {"n": 1} if payload is None else payload)
    fields = [BODY_FIELD, body]
    if attempts is not None:
        fields += [ATTEMPTS_FIELD, str(attempts).encode()]
    return fields


def test_an_entry_becomes_a_delivery() -> None:
    got = Arrival(CFG, "c1", State.QUEUED).vet(b"5-1", _fields(), MAIN, 1)
    assert isinstance(got, Delivery)
    assert got.state is State.QUEUED and got.ref == b"5-1" and got.limit == CFG.timeout
    m = got.msg
    assert (m.id, m.key, m.payload, m.attempt, m.group, m.consumer) == \
        ("5-1", "k", {"n": 1}, 1, "g", "c1")


def test_a_retry_entry_counts_the_attempts_used_before() -> None:
    got = Arrival(CFG, "c1", State.WAITING).vet(b"7-0", _fields(attempts=1), RETRY, 1)
    assert isinstance(got, Delivery)
    assert got.msg.attempt == 2 and got.ref == b"r7-0" and got.state is State.WAITING


def test_an_entry_deleted_while_pending_is_unfit() -> None:
    got = Arrival(CFG, "c1", State.QUEUED).vet(b"5-1", None, MAIN, 2)
    assert got == Unfit(2, "deleted_while_pending", "",
                        "the entry was deleted from the stream while pending")


def test_an_undecodable_body_is_unfit_and_counted() -> None:
    got = Arrival(CFG, "c1", State.QUEUED).vet(b"5-1", [BODY_FIELD, b"\xc1"], MAIN, 1)
    assert isinstance(got, Unfit)
    assert got.error_type == "DecodeError" and got.counter == "undecodable"


def test_over_max_deliveries_is_unfit() -> None:
    got = Arrival(CFG, "c1", State.QUEUED).vet(b"5-1", _fields(), MAIN, 4)
    assert isinstance(got, Unfit)
    assert (got.attempts, got.reason, got.error_type, got.job_key) == \
        (3, "max_deliveries", "DeliveryLimit", "k")


def test_a_job_the_done_cache_knows_is_skipped() -> None:
    assert Arrival(CFG, "c1", State.QUEUED, known={"k"}).vet(b"5-1", _fields(), MAIN, 1) is None


def test_a_payload_the_converter_refuses_is_unfit() -> None:
    from streamwork._wire.payloads import InvalidPayload

    def refuse(payload: Any) -> Any:
        raise InvalidPayload("not an order")

    got = Arrival(CFG, "c1", State.QUEUED, convert=refuse).vet(b"5-1", _fields(), MAIN, 1)
    assert isinstance(got, Unfit)
    assert (got.reason, got.error_type, got.detail, got.counter) == \
        ("payload:invalid", "InvalidPayload", "not an order", "invalid_payload")
