"""Must NOT type-check (tests/test_typed_payloads.py expects mypy to report both lines)."""

from __future__ import annotations

from dataclasses import dataclass

import streamwork as sw


@dataclass
class Invoice:
    order_id: int


class Billing(sw.StreamWorker[Invoice]):
    stream = "orders"
    group = "billing"
    payload_type = Invoice

    async def handle(self, msg: sw.Message[Invoice]) -> None:
        print(msg.payload.amount_cents)  # error: Invoice has no attribute "amount_cents"
        name: str = msg.payload.order_id  # error: int is not str
        print(name)
