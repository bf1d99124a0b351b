"""Workers of tests/test_cancel_faults.py (``streamwork run tests.workers.cancel:Slow``).
Every handler start is recorded in a Redis list before the handler does anything else:
the ledger that tells how many times each job started."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

import streamwork as sw

STREAM, GROUP = "{cx}jobs", "payers"
RUNS = "{cx}runs"  #: "<key>:<attempt>" per handler start
EFFECTS = "{cx}effects"  #: staged with the ack: each job's once-only effect


def release_key(key: str) -> str:
    """The key that lets a held job's handler go on."""
    return f"{{cx}}release:{key}"


def fail_key(key: str) -> str:
    """The key that makes a held job's handler raise instead."""
    return f"{{cx}}fail:{key}"


class Slow(sw.StreamWorker):
    """Records its start, then holds each job until the test releases it (it then stages
    its effect and returns) or fails it (it raises)."""

    stream, group = STREAM, GROUP
    concurrency = 1
    read_block = 0.05
    visibility_timeout = 1.5
    retry_delay = 0.1
    retry_max_delay = 0.1
    drain_timeout = 0.5

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.ledger: Any = None

    async def handle(self, msg: sw.Message) -> None:
        if self.ledger is None:
            self.ledger = aioredis.Redis.from_url(self.url)
        await self.ledger.rpush(RUNS, f"{msg.key}:{msg.attempt}")
        while True:
            if await self.ledger.exists(fail_key(msg.key)):
                raise RuntimeError(f"told to fail {msg.key}")
            if await self.ledger.exists(release_key(msg.key)):
                break
            await asyncio.sleep(0.02)
        msg.stage("RPUSH", [EFFECTS], [msg.key])

    async def on_stop(self) -> None:
        if self.ledger is not None:
            await self.ledger.aclose()
