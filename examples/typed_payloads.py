"""Typed payloads: python examples/typed_payloads.py [REDIS_URL].

The handler gets an ``Invoice`` instance; a payload that does not validate is dead-lettered
at once (reason ``payload:invalid``, see ``streamwork dlq list invoices``), never retried.
"""

import sys
from dataclasses import dataclass

import streamwork as sw
from streamwork.testing import RedisServer


@dataclass
class Invoice:
    order_id: int
    amount_cents: int
    currency: str = "EUR"


class Billing(sw.StreamWorker[Invoice]):
    stream = "invoices"
    group = "billing"
    payload_type = Invoice  # a dataclass, a msgspec.Struct or a pydantic model

    async def handle(self, msg: sw.Message[Invoice]) -> int:
        invoice = msg.payload  # an Invoice (typed for mypy too)
        print(f"billing order {invoice.order_id}: {invoice.amount_cents} {invoice.currency}")
        if invoice.order_id == 3:
            self.stop()
        return invoice.amount_cents


def main(url: str) -> None:
    with sw.Producer.from_url(url) as producer:
        producer.send("invoices", Invoice(order_id=1, amount_cents=2500), key="inv-1")
        producer.send("invoices", {"order_id": "two", "amount_cents": 1}, key="inv-2")
        producer.send("invoices", Invoice(order_id=3, amount_cents=990), key="inv-3")
        worker = Billing.from_url(url, read_block=0.1)
        worker.run()  # until self.stop()
        print(f"dead-lettered as payload:invalid: {worker.counts['dead_lettered']}")
        print(f"inv-1 is {producer.status('invoices', 'inv-1').state}, "
              f"result {producer.result('invoices', 'inv-1')}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with RedisServer() as server:
            main(server.url)
