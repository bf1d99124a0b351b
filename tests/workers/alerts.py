"""The worker tests/test_alerts.py runs as `streamwork run tests.workers.alerts:AlertsWorker`:
every outcome the alert rules look at, quickly. Payload keys: ``fail_until`` (raise while
attempt < it: retried, then acked), ``dead`` (raise DeadLetter), ``always_fail`` (retried
until max_deliveries, then dead-lettered). A short visibility timeout makes a delivery
abandoned by another consumer reclaimable after one second.
"""

from __future__ import annotations

from typing import Any

import streamwork as sw

STREAM = "alerts"
GROUP = "alerting"


class AlertsWorker(sw.StreamWorker):
    stream = STREAM
    group = GROUP
    concurrency = 4
    visibility_timeout = 1.0
    max_deliveries = 2
    retry_delay = 0.05
    retry_max_delay = 0.1
    read_block = 0.1
    drain_timeout = 5.0
    dedup = False

    async def handle(self, msg: sw.Message) -> None:
        p: dict[str, Any] = msg.payload if isinstance(msg.payload, dict) else {}
        if p.get("dead"):
            raise sw.DeadLetter("asked to")
        if p.get("always_fail"):
            raise RuntimeError(f"always fails (attempt {msg.attempt})")
        if msg.attempt < int(p.get("fail_until", 0)):
            raise RuntimeError(f"fails until attempt {p['fail_until']}")
