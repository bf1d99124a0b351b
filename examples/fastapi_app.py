"""A FastAPI service that enqueues jobs and runs a worker inside its own event loop.

The worker starts in the app's lifespan and drains when the app shuts down.
Run: REDIS_URL=redis://127.0.0.1:6379/0 uvicorn examples.fastapi_app:app
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import streamwork as sw

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


class Receipts(sw.StreamWorker):
    stream = "receipts"
    group = "mailer"
    sent: list[str] = []

    async def handle(self, msg: sw.Message) -> None:
        await asyncio.sleep(0.001)  # render and mail the receipt
        self.sent.append(msg.key)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.producer = sw.AsyncProducer.from_url(REDIS_URL)
    app.state.worker = Receipts.from_url(REDIS_URL)
    serving = asyncio.create_task(app.state.worker.serve())
    try:
        yield
    finally:
        app.state.worker.stop()  # drain in-flight jobs, then return
        await serving
        await app.state.producer.aclose()


app = FastAPI(lifespan=lifespan)


@app.post("/orders/{order_id}/receipt")
async def send_receipt(order_id: str) -> dict[str, str]:
    """Enqueue a receipt; the key makes a double-clicked button mail it once."""
    entry_id = await app.state.producer.send(
        "receipts", {"order_id": order_id}, key=f"receipt-{order_id}")
    return {"entry_id": entry_id}


@app.get("/receipts/sent")
async def sent() -> list[str]:
    return Receipts.sent
