"""The worker of the cluster failover test (tests/test_cluster_failover.py), run as
``streamwork run tests.workers.failover:FailoverLedger --partitions 6``.

Dedup on; the handler's only effect is a staged write (``HINCRBY`` on a ledger under the
partition's hash tag), applied atomically with the acknowledgement on the partition's
master. A master's death therefore loses a job's effect together with its done record and
its acknowledgement, or none of them: a job whose effect was lost is redelivered and runs
again on the promoted replica, and a ledger count of 2 would mean a job ran twice. A
payload's ``sleep`` (seconds) makes the handler wait that long first.
"""

from __future__ import annotations

import asyncio

import streamwork as sw
from streamwork._wire.keys import StreamKeys

STREAM = GROUP = "failover"
PARTITIONS = 6


def ledger_key(partition_stream: str) -> str:
    """The ledger of one partition (job key -> times applied), under its hash tag."""
    return StreamKeys.for_stream(partition_stream).prefix + ":ledger"


class FailoverLedger(sw.StreamWorker):
    """Short timings, so that a failover of a few seconds is ridden out quickly."""

    stream = STREAM
    group = GROUP
    partitions = PARTITIONS
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
        pause = msg.payload.get("sleep", 0) if isinstance(msg.payload, dict) else 0
        if pause:
            await asyncio.sleep(float(pause))
        msg.stage("HINCRBY", [ledger_key(msg.stream)], [msg.key, 1])
