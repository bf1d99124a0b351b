"""Workers whose user code raises what nobody expects, for tests/test_user_code.py (run
as `streamwork run tests.workers.usercode:NAME`).

Each typed handler records its run in the ``ledger`` hash (HINCRBY <job key> 1, straight
from the handler, so a job run twice shows 2). A payload with ``n == 0`` makes the
validator raise something no validation library expects: ZeroDivisionError from a
pydantic field validator, LookupError from a dataclass's ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pydantic

import streamwork as sw
from tests.workers.ledger import ClientWorker

STREAM = "typed-jobs"


class Order(pydantic.BaseModel):
    n: int

    @pydantic.field_validator("n")
    @classmethod
    def per_unit(cls, n: int) -> int:
        if 100 // n < 0:  # n == 0: ZeroDivisionError, which pydantic lets through
            raise ValueError("n must be positive")
        return n


@dataclasses.dataclass
class Line:
    n: int

    def __post_init__(self) -> None:
        if self.n == 0:
            raise LookupError(f"no price list has item {self.n}")


class _Typed(ClientWorker):
    stream = STREAM
    group = "typed"
    concurrency = 4
    batch_size = 8
    visibility_timeout = 1.0
    reclaim_interval = 0.2
    read_block = 0.1
    retry_delay = 0.05
    retry_max_delay = 0.2
    drain_timeout = 10.0

    async def handle(self, msg: sw.Message[Any]) -> None:
        self.client().hincrby("ledger", msg.key, 1)


class PydanticOrders(_Typed):
    payload_type = Order


class DataclassLines(_Typed):
    payload_type = Line


class StartFails(sw.StreamWorker):
    """Its on_start raises: the worker must not start, and say why."""

    stream, group = "user-code", "users"

    async def on_start(self) -> None:
        raise LookupError("no such database: billing")

    async def handle(self, msg: sw.Message) -> None:
        pass
