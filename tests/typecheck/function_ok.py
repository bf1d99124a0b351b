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


@sw.batch_worker("rows", group="loader", payload_type=Invoice, batch_max=500, batch_wait=0.1)
async def load(msgs: list[sw.Message[Invoice]]) -> list[int | Exception]:
    assert_type(msgs[0].payload, Invoice)
    return [m.payload.amount_cents for m in msgs]


class Loader(sw.StreamWorker[Invoice]):
    stream = "rows"
    group = "loader"
    batch_max = 200

    async def handle_batch(self, msgs: list[sw.Message[Invoice]]) -> list[int]:
        return [m.payload.order_id for m in msgs]


def use_batch() -> None:
    load.from_url().run()
    assert_type(load.fn, Callable[[list[sw.Message[Invoice]]],
                                  Coroutine[Any, Any, list[int | Exception]]])
    classes: list[type[sw.StreamWorker[Invoice]]] = [load, Loader]
    print(classes)
