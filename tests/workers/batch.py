"""A batch handler for the crash test, run as ``streamwork run
tests.workers.batch:BatchLedgerWorker``: each call records its size and fencing tokens,
sleeps (so SIGKILLs land mid-batch), then stages one ledger HINCRBY per message, applied
with that message's acknowledgement."""

from __future__ import annotations

import asyncio
import os

import streamwork as sw
from tests.workers.dedup import _Base

STREAM = os.environ.get("SW_TEST_STREAM", "batched")


class BatchLedgerWorker(_Base):
    """The once-only test workers' options (dedup on, short visibility), batched."""

    stream = STREAM
    group = "batchers"
    concurrency = 4
    batch_max = 50
    batch_wait = 0.01

    async def handle_batch(self, msgs: list[sw.Message]) -> None:
        client = self.client()
        client.rpush("granted", *[m.fencing_token or 0 for m in msgs])
        client.rpush("batch-sizes", len(msgs))
        pause = max(float(m.payload.get("sleep", 0)) for m in msgs)
        if pause:
            await asyncio.sleep(pause)
        for m in msgs:
            m.stage("HINCRBY", ["ledger"], [m.key, 1])
