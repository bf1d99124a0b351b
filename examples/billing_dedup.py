"""Once-only billing with a fencing token enforced by the database (SQLite here).

The worker charges each order once even when the order is enqueued twice or a delivery is
reclaimed. The store keeps the highest fencing token it has seen per order and rejects a
write that carries a lower one, so a worker that paused past its lease (GC pause, VM
freeze) cannot overwrite the work of the worker that took the job over.

Run: python examples/billing_dedup.py [REDIS_URL]
"""

import sqlite3
import sys
import threading

import streamwork as sw
from streamwork.testing import RedisServer

DB = sqlite3.connect(":memory:", check_same_thread=False)
DB.execute("CREATE TABLE charges (order_id TEXT PRIMARY KEY, amount INT, token INT)")
DB_LOCK = threading.Lock()


def charge(order_id: str, amount: int, token: int) -> bool:
    """Record a charge unless a holder with a newer token already wrote this order."""
    with DB_LOCK, DB:
        cur = DB.execute(
            "INSERT INTO charges (order_id, amount, token) VALUES (?, ?, ?) "
            "ON CONFLICT(order_id) DO UPDATE SET amount = excluded.amount, token = excluded.token "
            "WHERE charges.token < excluded.token",
            (order_id, amount, token),
        )
        return cur.rowcount == 1


class Billing(sw.StreamWorker):
    stream = "orders"
    group = "billing"
    dedup = True  # done-marker + lease + fencing token (the default)
    seen = 0

    def handle(self, msg: sw.Message) -> None:  # a plain def runs in the thread pool
        msg.check()  # raises sw.LockLost if our lease was lost meanwhile
        assert msg.fencing_token is not None
        if not charge(msg.key, msg.payload["amount_cents"], msg.fencing_token):
            raise sw.DeadLetter("a newer holder already charged this order")
        type(self).seen += 1
        if type(self).seen == 3:
            self.stop()


def main(url: str) -> None:
    with sw.Producer.from_url(url) as producer:
        for order_id, amount in [("o-1", 1200), ("o-2", 800), ("o-3", 4500)]:
            producer.send("orders", {"amount_cents": amount}, key=order_id)
        producer.send("orders", {"amount_cents": 1200}, key="o-1")  # a client retry: same key
    Billing.from_url(url, concurrency=4).run()
    rows = DB.execute("SELECT order_id, amount, token FROM charges ORDER BY order_id").fetchall()
    for order_id, amount, token in rows:
        print(f"{order_id}: charged {amount} cents once (fencing token {token})")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with RedisServer() as server:
            main(server.url)
