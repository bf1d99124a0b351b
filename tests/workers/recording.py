"""Extra workers for the recovery, poison and dead-letter tests (in-process or
`streamwork run tests.workers.recording:NAME`), and ``calls`` to read what they recorded.

``RecordingWorker`` pushes ``"<attempt>:<unix time>"`` to ``calls:<key>`` and the fencing
token (0 without dedup) to ``tokens:<key>`` as soon as a handler starts (before any
behaviour, so failing attempts are recorded too), then acts on
extra payload keys before falling back to LedgerWorker's behaviour:

* ``retry_until`` - raise ``Retry(delay=payload["retry_delay"])`` while attempt < it;
* ``dead_unless`` - raise ``DeadLetter`` unless the Redis key of that name exists;
* ``first_sleep`` - sleep this long on attempt 1 only, then push ``int(msg.lock_lost)`` to
  ``lost:<key>`` once it is true or LOSS_NOTICE s have passed (a loss is told by the next
  heartbeat: a handler resumed from a stall can run before it);
* ``gate``        - attempts >= this wait until the Redis key ``open:<key>`` exists (at
  most GATE_TIMEOUT s; past it the attempt fails and is retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import streamwork as sw
from streamwork.testing import await_for
from tests.workers.ledger import LedgerWorker

GATE_TIMEOUT = 120.0  #: s a gated attempt waits for its gate (longer than any test using it)
LOSS_NOTICE = 10.0  #: s a first_sleep attempt waits for msg.lock_lost (many heartbeats)


class RecordingWorker(LedgerWorker):
    """LedgerWorker that records every attempt (with its time) before behaving."""

    async def handle(self, msg: sw.Message) -> None:
        p: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
        db = self.ledger()
        db.rpush("calls:" + msg.key, f"{msg.attempt}:{time.time()!r}")
        db.rpush("tokens:" + msg.key, msg.fencing_token or 0)
        if msg.attempt < int(p.get("retry_until", 0)):
            raise sw.Retry(delay=p.get("retry_delay"))
        if p.get("dead_unless") and not db.exists(p["dead_unless"]):
            raise sw.DeadLetter(f"{p['dead_unless']} is not set")
        if msg.attempt == 1 and p.get("first_sleep"):
            await asyncio.sleep(float(p["first_sleep"]))
            with contextlib.suppress(AssertionError):
                await await_for(lambda: msg.lock_lost, timeout=LOSS_NOTICE)
            db.rpush("lost:" + msg.key, int(msg.lock_lost))
        if p.get("gate") and msg.attempt >= int(p["gate"]):
            await await_for(lambda: db.exists("open:" + msg.key), timeout=GATE_TIMEOUT,
                            message=f"open:{msg.key} (the test's gate)")
        await super().handle(msg)


def calls(client: Any, key: str) -> list[tuple[int, float]]:
    """The (attempt, unix time) pairs RecordingWorker recorded for ``key``, in order."""
    out = []
    for raw in client.lrange("calls:" + key, 0, -1):
        attempt, _, ts = raw.decode().partition(":")
        out.append((int(attempt), float(ts)))
    return out
