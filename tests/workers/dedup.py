"""Workers for the once-only tests: effects go through staged writes or a fenced store."""

from __future__ import annotations

import asyncio
import os

import streamwork as sw
from streamwork._lock.redlock import fenced_set
from tests.workers.ledger import ClientWorker

STREAM = os.environ.get("SW_TEST_STREAM", "jobs")


class _Base(ClientWorker):
    stream = STREAM
    group = "billing"
    concurrency = 8
    visibility_timeout = 1.0
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    reclaim_interval = 0.2
    dedup = True
    dedup_window = 600.0


class StagedLedgerWorker(_Base):
    """Applies its effect (ledger HINCRBY) only through msg.stage: exactly once."""

    async def handle(self, msg: sw.Message) -> None:
        self.client().rpush("granted", msg.fencing_token or 0)
        pause = float(msg.payload.get("sleep", 0)) if isinstance(msg.payload, dict) else 0.0
        if pause:
            await asyncio.sleep(pause)
        msg.stage("HINCRBY", ["ledger"], [msg.key, 1])
        msg.stage("RPUSH", ["committed"], [f"{msg.key}:{msg.fencing_token}"])


class FencedStoreWorker(_Base):
    """Writes to a store that rejects stale fencing tokens (streamwork._lock.redlock.fenced_set)."""

    async def handle(self, msg: sw.Message) -> None:
        r = self.client()
        r.rpush("started", f"{os.getpid()}:{msg.fencing_token}")
        await asyncio.sleep(float(msg.payload.get("sleep", 0)))
        ok = fenced_set(r, "store:" + msg.key, msg.fencing_token or 0, str(os.getpid()))
        r.rpush("writes", f"{os.getpid()}:{msg.fencing_token}:{int(ok)}")
