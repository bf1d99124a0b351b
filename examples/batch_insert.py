"""A batch handler: one INSERT of many rows per call (SQLite here), each job its own outcome.

``handle_batch`` gets up to ``batch_max`` messages at once and writes their rows with one
``executemany`` in one transaction. A row that does not validate gets an exception in the
returned list: that job alone is retried, then dead-lettered; the others are acknowledged.
The INSERT is idempotent per job key (``ON CONFLICT DO NOTHING``), so a call run again after
a crash writes nothing twice.

Run: python examples/batch_insert.py [REDIS_URL]
"""

import asyncio
import sqlite3
import sys
import threading

import redis

import streamwork as sw
from streamwork.testing import RedisServer, run_until_idle

DB = sqlite3.connect(":memory:", check_same_thread=False)
DB.execute("CREATE TABLE readings (job_key TEXT PRIMARY KEY, sensor TEXT, celsius REAL)")
DB_LOCK = threading.Lock()


class LoadReadings(sw.StreamWorker):
    stream = "readings"
    group = "loader"
    batch_max = 500  # rows per INSERT at most
    batch_wait = 0.05  # s to wait for more rows once there is one
    concurrency = 2  # calls in flight
    max_deliveries = 2
    retry_delay = 0.05
    calls: list[int] = []

    def handle_batch(self, msgs: list[sw.Message]) -> list[object]:  # a plain def: threads
        type(self).calls.append(len(msgs))
        outcomes: list[object] = []
        rows = []
        for m in msgs:
            celsius = m.payload.get("celsius")
            if not isinstance(celsius, (int, float)):
                outcomes.append(ValueError(f"reading {m.key} has no temperature"))
                continue
            rows.append((m.key, m.payload["sensor"], celsius))
            outcomes.append(None)  # succeeded (no result to keep)
        with DB_LOCK, DB:
            DB.executemany("INSERT INTO readings VALUES (?, ?, ?) "
                           "ON CONFLICT(job_key) DO NOTHING", rows)
        return outcomes


def main(url: str) -> None:
    with sw.Producer.from_url(url) as producer:
        producer.send_many("readings", [{"sensor": f"s{i % 7}", "celsius": 20 + i % 5}
                                        for i in range(1200)],
                           keys=[f"r-{i}" for i in range(1200)])
        producer.send("readings", {"sensor": "s9"}, key="r-broken")
        client = redis.Redis.from_url(url)
        asyncio.run(run_until_idle(LoadReadings.from_url(url), client))  # serve, then stop
        client.close()
        try:
            producer.result("readings", "r-broken")
        except sw.JobFailed as failed:
            print(f"r-broken dead-lettered alone: {failed}")
    (count,) = DB.execute("SELECT COUNT(*) FROM readings").fetchone()
    calls = LoadReadings.calls
    print(f"{count} rows inserted in {len(calls)} calls (largest {max(calls)} rows)")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with RedisServer() as server:
            main(server.url)
