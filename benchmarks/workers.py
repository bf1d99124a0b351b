"""The workers the bench serves: a no-op one (throughput) and one that records latency."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.measure import GROUP
from streamwork import Message, StreamWorker


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
        self.latencies.append(time.time() - msg.enqueued_at)
