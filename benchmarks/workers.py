"""The workers the bench serves: a no-op one (throughput) and one that records latency."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.measure import GROUP
from streamwork import DeadLetter, Message, StreamWorker


class NoopWorker(StreamWorker):
    """A worker whose handler does nothing: the cost measured is streamwork's own."""

    stream = "bench"
    group = GROUP

    async def handle(self, msg: Message) -> None:
        return None


class LatencyWorker(StreamWorker):
    """Records enqueue -> handler start (seconds) of every job it runs."""

    stream = "bench"
    group = GROUP

    def __init__(self, url: str | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self.latencies: list[float] = []

    async def handle(self, msg: Message) -> None:
        # the producer puts its send time in the payload at full resolution; the body's
        # enqueue time (msg.enqueued_at) is truncated to whole milliseconds
        payload = msg.payload
        sent = payload.get("sent_at") if isinstance(payload, dict) else None
        self.latencies.append(time.time() - (sent if sent is not None else msg.enqueued_at))


class DeadLetterWorker(StreamWorker):
    """Sends every job to the dead letters at once (the memory of a dead letter)."""

    stream = "bench"
    group = GROUP

    async def handle(self, msg: Message) -> None:
        raise DeadLetter("bench: dead-lettered on purpose")
