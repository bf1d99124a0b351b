"""The worker of the network-fault tests (tests/faults/test_network.py), run as
``streamwork run tests.workers.network:NetWorker --url <a forwarder's URL>``.

Dedup on; a handler's only effects are staged writes, applied with the acknowledgement: the
ledger (job key -> times applied, which must end at 1 for every job) and the jobs applied
per process (``BY_PID``, so the test sees when a partitioned worker is back to work). It
writes nothing to Redis directly, so a network fault reaches it only through the framework.
Short timings: a partition longer than the visibility timeout is cheap to make.
"""

from __future__ import annotations

import asyncio
import os

import streamwork as sw

STREAM = GROUP = "net"
LEDGER = "{net}:ledger"  #: job key -> times applied (staged, same hash tag as STREAM)
BY_PID = "{net}:by-pid"  #: pid -> jobs applied by that process


class NetWorker(sw.StreamWorker):
    stream = STREAM
    group = GROUP
    concurrency = 4
    batch_size = 4
    visibility_timeout = 3.0
    #: deliveries are counted again after every partition: never dead-letter here
    max_deliveries = 100
    dedup = True
    dedup_window = 3600.0
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 2.0

    async def handle(self, msg: sw.Message) -> None:
        p = msg.payload if isinstance(msg.payload, dict) else {}
        pause = float(p.get("sleep", 0.0))
        if pause:
            await asyncio.sleep(pause)
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])
        msg.stage("HINCRBY", [BY_PID], [str(os.getpid()), 1])
