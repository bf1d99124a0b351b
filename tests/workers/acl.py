"""The worker of the ACL tests (tests/test_acl.py), run as ``streamwork run
tests.workers.acl:Orders`` under the ACL user its URL names.

It serves stream ``orders`` as group ``billing`` (the stream of the security guide's rules)
with job records, so every script of the read/claim/complete path runs. A payload with
``hang`` sleeps on its first attempt until the process is killed (a delivery to reclaim),
and finishes at once on a later one; ``fail`` raises every time (retries, then a dead
letter); ``join`` makes it a join's callback, whose result is the sum of its children's.
Its result is the payload's ``n``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import streamwork as sw

STREAM, GROUP = "orders", "billing"


class Orders(sw.StreamWorker):
    stream, group = STREAM, GROUP
    dedup = True
    read_block = 0.1
    visibility_timeout = 1.5
    reclaim_every = 0.2
    max_deliveries = 2
    retry_delay = 0.02
    retry_max_delay = 0.05
    drain_timeout = 1.0

    async def handle(self, msg: sw.Message) -> Any:
        p = msg.payload if isinstance(msg.payload, dict) else {}
        if p.get("fail"):
            raise ValueError("card declined")
        if p.get("hang") and msg.attempt == 1:
            await asyncio.sleep(600)
        if p.get("join"):  # a join's callback: the sum of its children's results
            return sum(c.result for c in await msg.join_results() if c.ok)
        return p.get("n")


class Limited(Orders):
    """Orders with the features that bring their own keys and scripts: a rate limit, a
    cap per concurrency key (the payload's ``customer``), a schedule ticking every second,
    retention (upkeep trims) and quick reaping of idle consumers."""

    rate_limit = "1000/s"
    concurrency_per_key = 2
    schedules = [sw.Every(1, payload={"n": -1}, name="tick")]
    retention = 0.0
    consumer_idle_timeout = 1.0

    def concurrency_key(self, msg: sw.Message) -> str:
        p = msg.payload if isinstance(msg.payload, dict) else {}
        return str(p.get("customer", "none"))


class Partitioned(Orders):
    """Orders split into 2 partitions, one job in flight per order key."""

    partitions = 2
    ordered = True


class Staging(Orders):
    """Orders whose handler stages an RPUSH onto ``{orders}:seen`` (a key of the stream's
    own patterns, with a command the worker's rules do not grant)."""

    async def handle(self, msg: sw.Message) -> Any:
        msg.stage("RPUSH", ["{orders}:seen"], [msg.key])
        return await super().handle(msg)
