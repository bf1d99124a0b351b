"""dramatiq: its ``RedisBroker`` and threaded ``Worker`` (``worker_threads=concurrency``,
default middleware), in-process; the actor is a plain function (dramatiq's default model)."""

from __future__ import annotations

import threading

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

from benchmarks.peer_workers._common import parse, started

ARGS = parse()
broker = RedisBroker(url=ARGS.url)
dramatiq.set_broker(broker)
CLIENT = redis.Redis.from_url(ARGS.url)  # thread-safe: a connection pool


@dramatiq.actor(max_retries=0)
def incr() -> None:
    CLIENT.incr(ARGS.counter)


def main() -> None:
    for _ in range(ARGS.jobs):
        incr.send()
    started(f"dramatiq Worker(RedisBroker, worker_threads={ARGS.concurrency}), sync actor, "
            "default middleware", "dramatiq", "redis", "hiredis")
    worker = dramatiq.Worker(broker, worker_threads=ARGS.concurrency)
    worker.start()
    threading.Event().wait()  # until the harness ends the process


if __name__ == "__main__":
    main()
