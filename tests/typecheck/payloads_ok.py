"""Type-checked by tests/test_typed_payloads.py (mypy --strict): a typed worker's handler
sees ``msg.payload`` as its payload type, an untyped one as Any."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from typing_extensions import assert_type

import streamwork as sw


@dataclass
class Invoice:
    order_id: int
    amount_cents: int


class Billing(sw.StreamWorker[Invoice]):
    stream = "orders"
    group = "billing"
    payload_type = Invoice

    async def handle(self, msg: sw.Message[Invoice]) -> int:
        assert_type(msg.payload, Invoice)
        return msg.payload.amount_cents


class Untyped(sw.StreamWorker):
    stream = "orders"
    group = "any"

    async def handle(self, msg: sw.Message) -> None:
        assert_type(msg.payload, Any)


def send(p: sw.Producer) -> str:
    return p.send("orders", Invoice(7, 250), key="invoice-7")
