"""Workers for the job-record tests (tests/test_job_records.py), in-process or as
``streamwork run tests.workers.records:RecordsWorker``.

Every run of a handler is recorded per group: ``runs:<group>:<key>`` gets the attempt
number (RPUSH, before the behaviour steps), and ``ledger:<group>`` counts the runs that
succeeded (HINCRBY). Payload keys steer behaviour, each naming the group it applies to:
``fail_once_in`` (raise on attempt 1), ``dead_in`` (raise DeadLetter until the test sets
``fixed:<key>``), ``always_fail_in`` (raise every time), ``big`` (return that many bytes
of text). ``handle()`` returns a dict naming the key, group, attempt and process.
"""

from __future__ import annotations

import os
from typing import Any

import streamwork as sw
from tests.workers.ledger import ClientWorker

STREAM = os.environ.get("SW_TEST_STREAM", "orders")


def runs_key(group: str, key: str) -> str:
    return f"runs:{group}:{key}"


def ledger_name(group: str) -> str:
    return f"ledger:{group}"


class RecordsWorker(ClientWorker):
    stream = STREAM
    group = "billing"
    concurrency = 4
    visibility_timeout = 2.0
    max_deliveries = 3
    retry_delay = 0.05
    retry_max_delay = 0.2
    read_block = 0.05
    reclaim_interval = 0.2
    drain_timeout = 5.0
    dedup = True
    dedup_window = 600.0

    def behave(self, msg: sw.Message) -> dict[str, Any]:
        p: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
        r = self.client()
        group = msg.group
        r.rpush(runs_key(group, msg.key), msg.attempt)
        if p.get("dead_in") == group and not r.exists("fixed:" + msg.key):
            raise sw.DeadLetter("card stolen")
        if p.get("always_fail_in") == group:
            raise RuntimeError(f"always fails (attempt {msg.attempt})")
        if p.get("fail_once_in") == group and msg.attempt == 1:
            raise RuntimeError("card declined")
        r.hincrby(ledger_name(group), msg.key, 1)
        result: dict[str, Any] = {"key": msg.key, "group": group, "attempt": msg.attempt,
                                  "pid": os.getpid()}
        if p.get("big"):
            result["blob"] = "x" * int(p["big"])
        return result

    async def handle(self, msg: sw.Message) -> dict[str, Any]:  # type: ignore[override]
        return self.behave(msg)
