"""Workers with schedules, for tests/test_schedules.py (in-process, or as
`streamwork run tests.workers.schedules:NAME`).

Each handler stages ``HINCRBY {S}:ledger <job key> 1``, so the ledger is written in the
same script as the job's done record and ack: exactly once per job key, crashes included.
"""

from __future__ import annotations

import asyncio
import os

import streamwork as sw

STREAM = os.environ.get("SW_TEST_STREAM", "ticks")
LEDGER = "{" + STREAM + "}:ledger"


class Ticker(sw.StreamWorker):
    """An ``Every(0.5)`` schedule; each tick's handler takes 0.2 s (so a SIGKILL often
    lands mid-handler) and records the tick in the ledger."""

    stream = STREAM
    group = "tickers"
    schedules = [sw.Every(0.5, payload={"what": "tick"})]
    concurrency = 4
    visibility_timeout = 1.0
    reclaim_interval = 0.25
    read_block = 0.1
    retry_delay = 0.05
    retry_max_delay = 0.5
    drain_timeout = 5.0

    async def handle(self, msg: sw.Message) -> None:
        await asyncio.sleep(0.2)
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])


class Weekly(sw.StreamWorker):
    """A weekly schedule (ticks on Thursdays 00:00 UTC, the epoch's weekday): no tick falls
    due while a test runs, so only catch_up decides what is enqueued."""

    stream = "weekly"
    group = "catchers"
    schedules = [sw.Every(7 * 86400, name="weekly")]
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> None:
        msg.stage("HINCRBY", ["{weekly}:ledger"], [msg.key, 1])


class EverySecond(sw.StreamWorker):
    """A six-field cron that ticks every second, in a time zone with DST, and a second
    schedule (every 3600 s) that does not fall due during a test."""

    stream = "crons"
    group = "croners"
    schedules = [sw.Cron("* * * * * *", tz="Europe/Berlin", name="each-second"),
                 sw.Every(3600, payload={"n": 1})]
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> None:
        msg.stage("HINCRBY", ["{crons}:ledger"], [msg.key, 1])
