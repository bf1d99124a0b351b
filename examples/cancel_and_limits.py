"""Cancel and limits: python examples/cancel_and_limits.py [REDIS_URL].

``rate_limit`` caps how fast the group starts jobs, across all its workers; ``concurrency_key``
with ``concurrency_per_key`` caps the jobs in flight per key; ``producer.cancel`` stops a job
from running (or tells a running one, through ``msg.cancelled``).
"""

import sys
import time

import streamwork as sw
from streamwork.testing import RedisServer


class Calls(sw.StreamWorker):
    stream = "api-calls"
    group = "callers"
    rate_limit = "20/s"  # the partner API allows 20 calls a second, whoever makes them
    concurrency_per_key = 1  # one call per customer at a time

    def concurrency_key(self, msg: sw.Message) -> str:
        return str(msg.payload["customer"])

    handled = 0

    async def handle(self, msg: sw.Message) -> None:
        print(f"{time.monotonic() - START:5.2f}s call for customer {msg.payload['customer']}")
        self.handled += 1
        if self.handled == 10:  # every call but the cancelled one
            self.stop()


START = time.monotonic()


def main(url: str) -> None:
    with sw.Producer.from_url(url) as producer:
        producer.send_many("api-calls", [{"customer": i % 3} for i in range(9)],
                           keys=[f"call-{i}" for i in range(9)])
        producer.send("api-calls", {"customer": 9}, key="call-refund")
        producer.send("api-calls", {"customer": 0}, key="call-last")
        # changed our mind before it ran: it never will
        print("cancel:", producer.cancel("api-calls", "call-refund", group="callers",
                                         reason="refund withdrawn"))
        Calls.from_url(url, read_block=0.1).run()
        st = producer.status("api-calls", "call-refund")
        print(f"call-refund is {st.state} ({st.reason})")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with RedisServer() as server:
            main(server.url)
