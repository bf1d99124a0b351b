"""The worker of the fault matrix (tests/faults/test_fault_matrix.py), in-process or as
``streamwork run tests.workers.faults:FaultLedgerWorker``.

Its only effect is a staged ``HINCRBY {faults}:ledger <job key> 1``, applied by Redis in
the same script that acknowledges the job and writes its done record: with ``dedup`` on,
each job key's effect lands exactly once or not at all, so the ledger shows lost jobs
(count 0) and jobs applied twice (count > 1). ``sleep`` in a payload holds the delivery
that many seconds first, so a test can arrange deliveries held at the moment of a fault.
"""

from __future__ import annotations

import asyncio

import streamwork as sw

STREAM = "faults"
LEDGER = "{faults}:ledger"  # the stream's hash tag: staged writes may only touch its slot


class FaultLedgerWorker(sw.StreamWorker):
    """Records each job once in the ledger hash, through msg.stage."""

    stream = STREAM
    group = "matrix"
    concurrency = 8
    visibility_timeout = 2.0
    max_deliveries = 5
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 10.0
    dedup = True
    dedup_window = 600.0  # >= max_deliveries * (visibility_timeout + retry_max_delay)

    async def handle(self, msg: sw.Message) -> None:
        payload = msg.payload if isinstance(msg.payload, dict) else {}
        pause = float(payload.get("sleep", 0.0))
        if pause:
            await asyncio.sleep(pause)
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])
