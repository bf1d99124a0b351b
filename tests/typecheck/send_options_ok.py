"""Must type-check (tests/test_job_options.py runs mypy --strict on it): every sender
called with each job option's type, and None for "not given"."""

from __future__ import annotations

import datetime as dt

import streamwork as sw

WHEN = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)


def produce(p: sw.Producer) -> list[str]:
    return [p.send("orders", {}, key="k", timeout=2.5, order_key="c", priority="high"),
            p.send("orders", {}, delay=30, maxlen=100),
            p.send("orders", {}, at=WHEN, headers={"tenant": "eu"}, timeout=None),
            *p.send_many("orders", [{}, {}], ["a", "b"], order_keys=["c", "d"], timeout=1,
                         priority="low", delay=None)]


async def produce_async(p: sw.AsyncProducer) -> list[str]:
    return [await p.send("orders", {}, timeout=2, at=WHEN),
            *await p.send_many("orders", [{}], order_keys=("c",), priority="normal")]


class Relay(sw.StreamWorker):
    stream = "in"
    group = "relay"

    async def handle(self, msg: sw.Message) -> None:
        msg.send("out", msg.payload, timeout=5.0, order_key=msg.order_key, priority="high")
        msg.send_many("out", [1, 2], keys=["a", "b"], order_keys=["x", "y"], delay=1.5)
        limit: float | None = msg.options.get("timeout")
        print(limit, msg.priority)
