"""The Python side of the Node.js demo: a streamwork worker for the jobs demo.mjs sends.

Each job's result says what the worker saw (its payload's Python types, its priority and
time limit), so the Node side reads it back from the job record. A job whose payload says
``"kind": "fail"`` is dead-lettered. Runs until Ctrl-C or SIGTERM::

    REDIS_URL=redis://127.0.0.1:6379/0 python worker.py
"""

from __future__ import annotations

from typing import Any

import streamwork as sw


class NodeJobs(sw.StreamWorker):
    stream = "node-jobs"
    group = "py"
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> dict[str, Any]:
        if msg.payload.get("kind") == "fail":
            raise sw.DeadLetter("asked to fail")
        # counted with the acknowledgement: a key sent twice counts once
        msg.stage("HINCRBY", ["{node-jobs}:runs"], [msg.key, 1])
        return {"kind": msg.payload["kind"], "priority": msg.priority,
                "timeout": msg.options.get("timeout"), "order_key": msg.order_key,
                "types": {k: type(v).__name__ for k, v in sorted(msg.payload.items())},
                "payload": msg.payload}


if __name__ == "__main__":
    NodeJobs.from_url().run()
