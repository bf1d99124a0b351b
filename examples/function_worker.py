"""One function, one worker: python examples/function_worker.py [REDIS_URL].

``@sw.worker`` makes a worker of a function, for a stream whose handler is a few lines: the
decorated name is a ``StreamWorker`` subclass named after the function, so
``send_receipt.from_url(url).run()`` and ``streamwork run examples.function_worker:send_receipt``
work as they do for a class. It takes the options a worker class takes, as keywords.
"""

import asyncio
import sys
from dataclasses import dataclass
from typing import Any

import streamwork as sw
from streamwork.testing import RedisServer


@dataclass
class Receipt:
    order_id: int
    email: str


@sw.worker("receipts", group="mailer", payload_type=Receipt, concurrency=32, max_deliveries=3)
async def send_receipt(msg: sw.Message[Receipt]) -> str:
    """Mail one order's receipt (printed here); the return value is the job's result."""
    receipt = msg.payload  # a Receipt (typed for mypy too)
    print(f"mailing the receipt of order {receipt.order_id} to {receipt.email}")
    return f"sent to {receipt.email}"


@sw.worker("thumbnails", group="images", concurrency=4)
def make_thumbnail(msg: sw.Message) -> str:
    """A plain def runs in the worker's thread pool, so blocking code is fine here."""
    path: str = msg.payload["path"]
    return path.replace(".png", ".thumb.png")


async def main(url: str) -> None:
    workers: list[sw.StreamWorker[Any]] = [send_receipt.from_url(url, read_block=0.1),
                                           make_thumbnail.from_url(url, read_block=0.1)]
    serving = [asyncio.create_task(w.serve()) for w in workers]
    async with sw.AsyncProducer.from_url(url) as producer:
        await producer.send("receipts", Receipt(order_id=7, email="ada@example.com"),
                            key="receipt-7")
        await producer.send("thumbnails", {"path": "/img/cat.png"}, key="thumb-cat")
        print("receipt-7:", await producer.result("receipts", "receipt-7"))
        print("thumb-cat:", await producer.result("thumbnails", "thumb-cat"))
    for w in workers:
        w.stop()
    await asyncio.gather(*serving)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with RedisServer() as server:
            asyncio.run(main(server.url))
