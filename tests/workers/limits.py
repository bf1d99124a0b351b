"""Workers of tests/test_limits.py (run as ``streamwork run tests.workers.limits:Paced``)."""

from __future__ import annotations

import time

import streamwork as sw

STREAM, GROUP = "paced", "callers"
STARTS = "{paced}:starts"  #: "<start time>:<attempt>" of every job, staged with its ack


class Paced(sw.StreamWorker):
    """No work but recording when each job started and on which attempt."""

    stream, group = STREAM, GROUP
    concurrency = 32
    rate_limit = "50/s"
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> None:
        msg.stage("RPUSH", [STARTS], [f"{time.time():.6f}:{msg.attempt}"])
