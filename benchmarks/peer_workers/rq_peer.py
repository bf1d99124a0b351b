"""rq: ``SimpleWorker`` (jobs run in the worker process; rq's default ``Worker`` forks a
child per job). rq runs one job at a time per worker process: there is no concurrency
setting short of more processes, so ``--concurrency`` is not used."""

from __future__ import annotations

import redis
from rq import Queue, SimpleWorker

from benchmarks.peer_workers._common import parse, started

_CLIENT: list[redis.Redis] = []


def incr(url: str, counter: str) -> None:
    if not _CLIENT:
        _CLIENT.append(redis.Redis.from_url(url))
    _CLIENT[0].incr(counter)


def main() -> None:
    args = parse()
    conn = redis.Redis.from_url(args.url)
    queue = Queue("bench", connection=conn)
    for i in range(0, args.jobs, 500):
        n = min(500, args.jobs - i)
        queue.enqueue_many([Queue.prepare_data(incr, (args.url, args.counter))
                            for _ in range(n)])
    started("rq SimpleWorker (no fork per job), one job at a time", "rq", "redis", "hiredis")
    SimpleWorker([queue], connection=conn).work(burst=False, logging_level="WARNING")


if __name__ == "__main__":
    main()
