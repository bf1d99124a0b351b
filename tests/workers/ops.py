"""Workers of the operations tests (tests/test_processes.py, tests/test_health.py), run as
``streamwork run tests.workers.ops:OpsWorker [tests.workers.ops:OtherOpsWorker]``.

Dedup on; a handler's only effect is a staged ``HINCRBY`` on its stream's ledger
(``{<stream>}:ledger``, the stream's hash tag, so the staged write may touch it), applied
in the script that acknowledges the job: a ledger count of 2 means a job ran twice, 0 that
it was lost. A payload's ``sleep`` (seconds) holds the job that long first; its
``hold_until`` (a key name) holds it until the test sets that key (at most `HOLD_MAX`), so
a test can look at a drain with a job in flight for as long as it needs; its
``block_until`` does the same with a blocking wait, holding the whole event loop (a
handler that forgets to await), which /livez must report.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis
import redis.asyncio

import streamwork as sw
from streamwork._wire.keys import StreamKeys

STREAM = "ops"
OTHER_STREAM = "ops-other"
HOLD_MAX = 30.0  #: s a held job waits for its key at most


def ledger_key(stream: str) -> str:
    """The ledger of ``stream`` (job key -> times applied), under its hash tag."""
    return StreamKeys.for_stream(stream).prefix + ":ledger"


class OpsWorker(sw.StreamWorker):
    """Short timings: a SIGKILLed process's jobs are reclaimed within seconds."""

    stream = STREAM
    group = "ops"
    concurrency = 4
    visibility_timeout = 2.0
    max_deliveries = 20  # deliveries lost to a killed process must not end dead-lettered
    dedup = True
    dedup_window = 600.0
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 10.0

    _redis: Any = None

    async def on_start(self) -> None:
        self._redis = redis.asyncio.Redis.from_url(self.url)

    async def on_stop(self) -> None:
        await self._redis.aclose()

    async def handle(self, msg: sw.Message) -> None:
        payload: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
        if payload.get("sleep"):
            await asyncio.sleep(float(payload["sleep"]))
        if payload.get("hold_until"):
            deadline = time.monotonic() + HOLD_MAX
            while not await self._redis.exists(payload["hold_until"]):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{payload['hold_until']!r} never set")
                await asyncio.sleep(0.02)
        if payload.get("block_until"):
            with redis.Redis.from_url(self.url) as client:
                deadline = time.monotonic() + HOLD_MAX
                while not client.exists(payload["block_until"]) and time.monotonic() < deadline:
                    time.sleep(0.02)  # on purpose: the event loop stops meanwhile
        msg.stage("HINCRBY", [ledger_key(msg.stream)], [msg.key, 1])


class OtherOpsWorker(OpsWorker):
    """The same on a second stream and group, to share a process with OpsWorker."""

    stream = OTHER_STREAM
    group = "ops-other"
    concurrency = 2
