"""Workers of the failure-log tests, also run as ``streamwork run
tests.workers.failing:Failing`` in child processes.

Every handler fails; the payload's ``raise`` says how: ``type`` (TypeError naming
``order``), ``long`` (ValueError of ``n`` characters), ``unprintable`` (an exception whose
``__str__`` raises), ``unreprable`` (``__str__`` and ``__repr__`` both raise), ``slow``
(sleeps past any time limit).
"""

from __future__ import annotations

import asyncio
from typing import Any

import streamwork as sw

STREAM, GROUP = "logged", "log-tests"


class Unprintable(Exception):
    """``str()`` of it raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


class Unreprable(Unprintable):
    """``str()`` and ``repr()`` of it raise."""

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ is broken")


def charge_order(p: dict[str, Any]) -> None:
    """The failing step (a named frame the dead letter's traceback must show)."""
    kind = p.get("raise", "type")
    if kind == "type":
        raise TypeError(f"unsupported operand for order {p.get('order', 7)}")
    if kind == "long":
        raise ValueError("x" * int(p["n"]))
    if kind == "unprintable":
        raise Unprintable("hidden")
    if kind == "unreprable":
        raise Unreprable()


class Failing(sw.StreamWorker):
    """Async handler that always fails; 3 deliveries, short retry delays."""

    stream, group = STREAM, GROUP
    dedup = False
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.05
    max_deliveries = 3

    async def handle(self, msg: sw.Message) -> None:
        if msg.payload.get("raise") == "slow":
            await asyncio.sleep(60)
        charge_order(msg.payload)


class SyncFailing(Failing):
    """The same with a plain ``def`` handler (runs on a pool thread)."""

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        charge_order(msg.payload)
