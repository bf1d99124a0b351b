"""Type-checked by tests/test_function_worker.py (mypy --strict): ``@sw.worker`` carries
the function's payload type and result, and the decorated name is a worker class."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from typing_extensions import assert_type

import streamwork as sw


@dataclass
class Invoice:
    order_id: int
    amount_cents: int


def customer(msg: sw.Message[Invoice]) -> str:
    return str(msg.payload.order_id)


@sw.worker("invoices", group="billing", payload_type=Invoice, concurrency=32, timeout=None,
           lock_urls=None, visibility_timeout=5, concurrency_key=customer,
           schedules=[sw.Every(60, payload=Invoice(0, 0))])
async def bill(msg: sw.Message[Invoice]) -> int:
    assert_type(msg.payload, Invoice)
    return msg.payload.amount_cents


async def open_pool() -> None:
    pass


@sw.worker("emails", group="mailer", on_start=open_pool, on_stop=lambda: None)
def send_email(msg: sw.Message) -> None:
    assert_type(msg.payload, Any)


def use() -> None:
    typed: sw.StreamWorker[Invoice] = bill.from_url("redis://127.0.0.1:6379/0", concurrency=4)
    typed.run()
    assert_type(bill.fn, Callable[[sw.Message[Invoice]], Coroutine[Any, Any, int]])
    send_email.from_url().run()
    classes: list[type[sw.StreamWorker[Any]]] = [bill, send_email]
    print(classes, bill.stream, send_email.group)


async def serve() -> None:
    await bill.from_url().serve()
