"""Must NOT type-check (tests/test_function_worker.py expects mypy to report each line)."""

from __future__ import annotations

from dataclasses import dataclass

import streamwork as sw


@dataclass
class Invoice:
    order_id: int
    amount_cents: int


@dataclass
class Order:
    order_id: int


# error: the function takes Order payloads, the worker converts to Invoice
@sw.worker("invoices", group="billing", payload_type=Invoice)
async def bill(msg: sw.Message[Order]) -> None: ...


# error: a misspelt option
@sw.worker("invoices", group="billing", concurency=4)
async def misspelt(msg: sw.Message) -> None: ...


# error: an option of the wrong type
@sw.worker("invoices", group="billing", concurrency="4")
async def wrong_type(msg: sw.Message) -> None: ...


# error: not a function of the message
@sw.worker("invoices", group="billing")
async def not_a_message(n: int) -> None: ...


@sw.worker("invoices", group="billing", payload_type=Invoice)
async def typed(msg: sw.Message[Invoice]) -> int:
    return msg.payload.amount  # error: Invoice has no attribute "amount"
