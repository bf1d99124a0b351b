"""Extra worker classes for the foundation tests (in-process only).

The probes count how many handlers run at once and on which threads, and keep every
Message they were given, so tests can check concurrency limits and Message fields.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import streamwork as sw
from tests.workers.ledger import LedgerWorker


class AsyncProbeWorker(LedgerWorker):
    """Async handler: sleeps ``payload["sleep"]`` seconds, records itself, writes the ledger."""

    concurrency = 4

    def __init__(self, url: str | None = None, **options: Any) -> None:
        super().__init__(url, **options)
        self._probe_lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.threads: set[int] = set()
        self.messages: list[sw.Message] = []

    def _enter(self, msg: sw.Message) -> float:
        with self._probe_lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.threads.add(threading.get_ident())
            self.messages.append(msg)
        p = msg.payload
        return float(p.get("sleep", 0.0)) if isinstance(p, dict) else 0.0

    def _leave(self, msg: sw.Message) -> None:
        with self._probe_lock:
            self.active -= 1
        self.ledger().hincrby("ledger", msg.key, 1)

    async def handle(self, msg: sw.Message) -> None:
        pause = self._enter(msg)
        try:
            if pause:
                await asyncio.sleep(pause)
        finally:
            self._leave(msg)


class SyncProbeWorker(AsyncProbeWorker):
    """The same probe with a plain ``def handle`` (runs in the worker's thread pool)."""

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        pause = self._enter(msg)
        try:
            if pause:
                time.sleep(pause)
        finally:
            self._leave(msg)


class FirstAttemptSlowWorker(LedgerWorker):
    """Sleeps ``payload["sleep"]`` seconds on the first delivery only, then writes the ledger;
    a later delivery (after a reclaim) finishes at once."""

    async def handle(self, msg: sw.Message) -> None:
        self.ledger().rpush("attempt-times:" + msg.key, time.time())
        p = msg.payload
        if msg.attempt == 1 and isinstance(p, dict):
            await asyncio.sleep(float(p.get("sleep", 0.0)))
        self.ledger().hincrby("ledger", msg.key, 1)
