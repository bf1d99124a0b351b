"""The worker of the nemesis campaign (tests/faults/test_nemesis.py), run as
``streamwork run tests.workers_nemesis:NemesisWorker``.

Dedup on; the handler's only effect is a staged write (``HINCRBY`` on a ledger under the
stream's hash tag), applied atomically with the acknowledgement, so every effect is exactly
once by construction. It writes nothing to Redis directly, so a fault on the server can only
reach it through the framework. Payload keys steer it: ``sleep`` (seconds in the handler),
``poison`` (``"raise"``: raises on every attempt; ``"exit"``: ``os._exit(POISON_EXIT)`` on
every attempt), ``final`` (also count the job under this process's pid, so the test can see
that every live process still serves).
"""

from __future__ import annotations

import asyncio
import os

import streamwork as sw

STREAM = GROUP = "nemesis"
LEDGER = "{nemesis}:ledger"  #: job key -> times applied (staged, same hash tag as STREAM)
SERVED_BY = "{nemesis}:final-by-pid"  #: pid -> jobs of the final batch it applied
POISON_EXIT = 42  #: exit code of a process killed by an "exit" poison job (told apart from
#: a worker that exits on its own, which `streamwork run` reports as 1)


class NemesisWorker(sw.StreamWorker):
    """Short timings, so that faults longer than a visibility timeout are cheap to make."""

    stream = STREAM
    group = GROUP
    concurrency = 4
    batch_size = 8
    visibility_timeout = 2.0
    max_deliveries = 4
    dedup = True
    dedup_window = 3600.0  # >= max_deliveries * (visibility_timeout + retry_max_delay) = 10 s
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 2.0

    async def handle(self, msg: sw.Message) -> None:
        p = msg.payload if isinstance(msg.payload, dict) else {}
        poison = p.get("poison")
        if poison == "raise":
            raise RuntimeError(f"poison job {msg.key} fails on every attempt ({msg.attempt})")
        if poison == "exit":
            os._exit(POISON_EXIT)
        pause = float(p.get("sleep", 0.0))
        if pause:
            await asyncio.sleep(pause)
        msg.stage("HINCRBY", [LEDGER], [msg.key, 1])
        if p.get("final"):
            msg.stage("HINCRBY", [SERVED_BY], [str(os.getpid()), 1])
