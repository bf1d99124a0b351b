"""A three-step job chain for the chain fault tests: charge -> receipt -> ledger.

Each step records its effect with a staged write in its own stream's slot (HINCRBY of the
chain id in ``{<step>}:effects``), and sends the next step with ``msg.send``, so each
effect and each next job come with the step's completion, exactly once. The receipt step
runs with dedup off (no job records): its once-only effect rests on the completion script
alone. A payload's ``sleep`` (seconds) keeps jobs in flight long enough to be killed.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Final

import streamwork as sw
from streamwork._redis.connection import sync_client
from tests.workers.ledger import ClientWorker

#: the steps' streams; on a cluster each name hashes to its own slot (see test_chains_cluster)
CHARGE: Final = os.environ.get("SW_CHAIN_CHARGE", "charge")
RECEIPT: Final = os.environ.get("SW_CHAIN_RECEIPT", "receipt")
LEDGER: Final = os.environ.get("SW_CHAIN_LEDGER", "ledger")


def effects(stream: str) -> str:
    """The hash where step ``stream`` counts its effect per chain (in the stream's slot)."""
    return "{" + stream + "}:effects"


def runs(stream: str) -> str:
    """The hash where step ``stream`` counts its handler's runs per chain (not once-only:
    a run whose completion was lost to a kill counts too)."""
    return "{" + stream + "}:runs"


class _Step(ClientWorker):
    group = "chain"

    def client(self) -> Any:
        """A sync client on the worker's Redis, a Cluster's too."""
        if self._client is None:
            self._client = sync_client(self.url)
        return self._client

    concurrency = 4
    batch_size = 4
    visibility_timeout = 1.0
    reclaim_interval = 0.3
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    max_deliveries = 20
    dedup_window = 600.0


async def _pause(worker: ClientWorker, msg: sw.Message) -> None:
    worker.client().hincrby(runs(msg.stream), msg.payload["chain"], 1)
    pause = float(msg.payload.get("sleep", 0))
    if pause:
        await asyncio.sleep(pause)


class Charge(_Step):
    """Step 1: charges, then sends the receipt (its key derived from this job's)."""

    stream = CHARGE

    async def handle(self, msg: sw.Message) -> None:
        await _pause(self, msg)
        msg.stage("HINCRBY", [effects(CHARGE)], [msg.payload["chain"], 1])
        msg.send(RECEIPT, msg.payload)


class Receipt(_Step):
    """Step 2 (dedup off): mails the receipt, then sends the ledger entry with a key."""

    stream = RECEIPT
    dedup = False

    async def handle(self, msg: sw.Message) -> None:
        await _pause(self, msg)
        msg.stage("HINCRBY", [effects(RECEIPT)], [msg.payload["chain"], 1])
        msg.send(LEDGER, msg.payload, key="ledger-" + msg.payload["chain"])


class Ledger(_Step):
    """Step 3: books it (a plain def, run in the thread pool)."""

    stream = LEDGER

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        self.client().hincrby(runs(LEDGER), msg.payload["chain"], 1)
        msg.stage("HINCRBY", [effects(LEDGER)], [msg.payload["chain"], 1])
