"""Typed payloads: a worker's payload_type (dataclass, msgspec.Struct, pydantic model)
turns payloads into instances before handle(); one that does not validate is dead-lettered
at once (reason payload:invalid, the validator's message, the original bytes), never
retried; producers send such instances; mypy sees msg.payload typed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pydantic
import pytest
import redis

import streamwork as sw
from streamwork._ops.deadletter import list_dead
from streamwork._wire.codec import BODY_FIELD
from streamwork.testing import run_until_idle

ROOT = Path(__file__).resolve().parent.parent
STREAM, GROUP = "invoices", "billing"


@dataclasses.dataclass
class InvoiceDC:
    order_id: int
    amount_cents: int
    note: str = ""


class InvoiceStruct(msgspec.Struct):
    order_id: int
    amount_cents: int
    note: str = ""


class InvoiceModel(pydantic.BaseModel):
    order_id: int
    amount_cents: int
    note: str = ""


KINDS = [InvoiceDC, InvoiceStruct, InvoiceModel]


class Typed(sw.StreamWorker[Any]):
    stream, group = STREAM, GROUP
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.05

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.got: list[Any] = []

    async def handle(self, msg: sw.Message[Any]) -> int:
        self.got.append(msg.payload)
        return int(msg.payload.amount_cents)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
async def test_valid_payloads_arrive_as_instances(redis_url: str, r: redis.Redis,
                                                  kind: type) -> None:
    """Maps and instances sent by the producer arrive as instances of payload_type."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"order_id": 1, "amount_cents": 250}, key="a")
        p.send(STREAM, kind(order_id=2, amount_cents=300, note="x"), key="b")
        p.send_many(STREAM, [kind(order_id=3, amount_cents=5), {"order_id": 4,
                                                                 "amount_cents": 6}],
                    keys=["c", "d"])
        w = Typed.from_url(redis_url, payload_type=kind)
        await run_until_idle(w, r, timeout=20)
        assert [type(x) for x in w.got] == [kind] * 4
        assert sorted((x.order_id, x.amount_cents, x.note) for x in w.got) == [
            (1, 250, ""), (2, 300, "x"), (3, 5, ""), (4, 6, "")]
        assert p.result(STREAM, "b", timeout=5) == 300


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
async def test_invalid_payloads_are_dead_lettered_at_once(redis_url: str, r: redis.Redis,
                                                          kind: type) -> None:
    """A payload that does not validate never reaches the handler, is not retried, and its
    dead letter carries reason payload:invalid, the validator's message and the bytes."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"order_id": "seven", "amount_cents": 1}, key="bad-type")
        p.send(STREAM, {"amount_cents": 1}, key="missing")
        p.send(STREAM, [1, 2], key="not-a-map")
        p.send(STREAM, {"order_id": 9, "amount_cents": 9}, key="good")
    sent = {f[BODY_FIELD]: None for _, f in r.xrange(STREAM)}
    w = Typed.from_url(redis_url, payload_type=kind)
    await run_until_idle(w, r, timeout=20)
    assert [x.order_id for x in w.got] == [9]
    assert w.counts["retried"] == 0 and w.counts["dead_lettered"] == 3
    dead = {e.key: e for e in list_dead(r, STREAM, 10)}
    assert sorted(k for k in dead if k) == ["bad-type", "missing", "not-a-map"]
    for e in dead.values():
        assert e.reason == "payload:invalid" and e.attempts == 1
        assert kind.__name__ in e.detail
        assert e.original[BODY_FIELD.decode()] in sent
    assert "order_id" in dead["bad-type"].detail
    with sw.Producer.from_url(redis_url) as p:
        st = p.status(STREAM, "bad-type", group=GROUP)
        assert (st.state, st.reason) == ("dead", "payload:invalid")


def test_bad_payload_type_is_refused(redis_url: str) -> None:
    with pytest.raises(sw.ConfigError, match="payload_type"):
        Typed.from_url(redis_url, payload_type=dict)


@pytest.mark.parametrize(("path", "ok"), [("payloads_ok.py", True), ("payloads_bad.py", False)])
def test_msg_payload_is_typed_for_mypy(path: str, ok: bool) -> None:
    """mypy --strict accepts a typed worker using its payload's fields (assert_type checks
    the type is the payload_type, and Any for an untyped worker) and rejects misuse."""
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          str(ROOT / "tests" / "typecheck" / path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=170, check=False)
    if ok:
        assert out.returncode == 0, out.stdout + out.stderr
    else:
        assert out.returncode == 1, out.stdout + out.stderr
        assert '"Invoice" has no attribute "amount_cents"' in out.stdout
        assert 'expression has type "int", variable has type "str"' in out.stdout
