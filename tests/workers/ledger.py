"""Worker classes the tests run, in-process or as `streamwork run tests.workers.ledger:NAME`.

Each records its effect in the ``ledger`` hash of the Redis it serves (HINCRBY key 1), so
tests can check nothing was lost and nothing applied twice. Payload keys steer behaviour:
``sleep`` (seconds in the handler), ``fail_until`` (raise while attempt < it), ``dead``
(raise DeadLetter), ``exit`` (os._exit(1) in the handler, every time), ``always_fail``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import redis

import streamwork as sw

STREAM = os.environ.get("SW_TEST_STREAM", "jobs")


class ClientWorker(sw.StreamWorker):
    """A test worker with one lazily opened sync client on its own Redis, closed on stop."""

    _client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = redis.Redis.from_url(self.url)
        return self._client

    def on_stop(self) -> None:  # type: ignore[override]
        if self._client is not None:
            self._client.close()
            self._client = None


class LedgerWorker(ClientWorker):
    """Async handler; the ledger write happens after the behaviour steps."""

    stream = STREAM
    group = "testers"
    concurrency = 8
    visibility_timeout = 2.0
    max_deliveries = 5
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    drain_timeout = 10.0
    dedup = False

    def ledger(self) -> Any:
        return self.client()

    def behave(self, msg: sw.Message) -> float:
        p: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
        if p.get("exit"):
            os._exit(1)
        if p.get("dead"):
            raise sw.DeadLetter("asked to")
        if p.get("always_fail"):
            raise RuntimeError(f"always fails (attempt {msg.attempt})")
        if msg.attempt < int(p.get("fail_until", 0)):
            raise RuntimeError(f"fails until attempt {p['fail_until']}")
        self.ledger().rpush("attempt-times:" + msg.key, time.time())
        return float(p.get("sleep", 0.0))

    async def handle(self, msg: sw.Message) -> None:
        pause = self.behave(msg)
        if pause:
            await asyncio.sleep(pause)
        self.ledger().hincrby("ledger", msg.key, 1)


class SyncLedgerWorker(LedgerWorker):
    """The same with a plain ``def handle`` (runs in the thread pool)."""

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        pause = self.behave(msg)
        if pause:
            time.sleep(pause)
        self.ledger().hincrby("ledger", msg.key, 1)


class DedupLedgerWorker(LedgerWorker):
    """LedgerWorker with once-only effect on."""

    dedup = True
    dedup_window = 600.0
