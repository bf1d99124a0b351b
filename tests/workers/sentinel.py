"""The worker of the Sentinel tests (tests/test_sentinel.py), run as ``streamwork run
tests.workers.sentinel:SentinelLedger --url redis+sentinel://...``.

Dedup on; the handler's only effect is a staged ``HINCRBY`` on the stream's ledger (job key
-> times applied), applied atomically with the acknowledgement on the primary: a failover
loses a job's effect together with its done record and its acknowledgement, or none of
them, and a count of 2 would mean a job ran twice.
"""

from __future__ import annotations

import streamwork as sw
from streamwork._wire.keys import StreamKeys

STREAM = GROUP = "sentinel-jobs"
LEDGER = StreamKeys.for_stream(STREAM).prefix + ":ledger"


class SentinelLedger(sw.StreamWorker):
    """Short timings, so that a failover of a few seconds is ridden out quickly."""

    stream = STREAM
    group = GROUP
    concurrency = 16
    batch_size = 50
    visibility_timeout = 2.0
    max_deliveries = 20  # a delivery lost to the failover must not end in the dead letters
    dedup = True
    dedup_window = 3600.0
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 5.0

    async def handle(self, msg: sw.Message) -> None:
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])
