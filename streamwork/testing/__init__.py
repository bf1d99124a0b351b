"""A public test kit: private servers, running a worker until its stream is drained,
waiting without sleeps-as-assertions, ledgers, a `Message` for unit tests of a handler,
and a pytest plugin (``streamwork.testing.pytest_plugin``, registered when streamwork is
installed) whose fixtures put them together.

Use it in your own tests of streamwork workers::

    from streamwork.testing import Ledger, RedisServer, message, run_until_idle, wait_for
"""

from __future__ import annotations

from streamwork.testing.kit import (
    Ledger,
    LedgerReport,
    RedisServer,
    await_for,
    free_port,
    run_until_idle,
    stream_idle,
    wait_for,
)
from streamwork.testing.messages import MessageDouble, SentJob, SentJoin, message
from streamwork.testing.runs import WorkerRun, WorkerRunner

__all__ = [
    "Ledger", "LedgerReport", "MessageDouble", "RedisServer", "SentJob", "SentJoin", "WorkerRun",
    "WorkerRunner", "await_for", "free_port", "message", "run_until_idle", "stream_idle",
    "wait_for",
]
