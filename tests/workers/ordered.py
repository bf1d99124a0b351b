"""Workers of the partition and ordered-mode tests, also run as ``streamwork run
tests.workers.ordered:OrderLog`` in child processes.

The handler's only effect is a staged ``RPUSH`` of the job's sequence number onto a list per
order key, under the partition's hash tag, applied atomically with the acknowledgement: the
list is an exact log of what took effect, in the order it did. Payload keys steer it:
``seq`` (the job's place among its order key's jobs), ``fail`` (fail the first N attempts),
``sleep`` (seconds in the handler).
"""

from __future__ import annotations

import asyncio

import streamwork as sw
from streamwork._wire.keys import StreamKeys


def log_key(partition_stream: str, order_key: str) -> str:
    """The effect log of ``order_key``'s jobs, in the slot of the partition they run on."""
    return f"{StreamKeys.for_stream(partition_stream).prefix}:log:{order_key}"


class OrderLog(sw.StreamWorker):
    """Ordered, 6 partitions, short timings so a dead owner's partitions move on fast."""

    stream = "orders"
    group = "loggers"
    partitions = 6
    ordered = True
    concurrency = 8
    batch_size = 20
    visibility_timeout = 1.5
    retry_delay = 0.02
    retry_max_delay = 0.1
    max_deliveries = 6
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 2.0
    dedup_window = 60.0

    async def handle(self, msg: sw.Message) -> int:
        p = msg.payload
        if msg.attempt <= int(p.get("fail", 0)):
            raise RuntimeError(f"{msg.key} fails on attempt {msg.attempt}")
        if p.get("dead"):
            raise sw.DeadLetter("asked to")
        pause = float(p.get("sleep", 0.0))
        if pause:
            await asyncio.sleep(pause)
        msg.stage("RPUSH", [log_key(msg.stream, msg.order_key)], [p["seq"]])
        return int(p["seq"])
