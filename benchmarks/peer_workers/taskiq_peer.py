"""taskiq with taskiq-redis's ``RedisStreamBroker`` (XREADGROUP + XACK): the ``Receiver``
that ``taskiq worker`` runs, in-process, ``max_async_tasks=concurrency``; ``async`` task."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import redis.asyncio as aredis
from taskiq import TaskiqEvents, TaskiqState
from taskiq.receiver import Receiver
from taskiq_redis import RedisStreamBroker

from benchmarks.peer_workers._common import parse, started

ARGS = parse()
# consumer_id "0": the group also sees the jobs enqueued before the worker started
broker = RedisStreamBroker(ARGS.url, consumer_id="0")
CLIENT: list[aredis.Redis] = []


@broker.on_event(TaskiqEvents.WORKER_STARTUP)
async def on_startup(state: TaskiqState) -> None:
    CLIENT.append(aredis.Redis.from_url(ARGS.url))


@broker.task
async def incr() -> None:
    await CLIENT[0].incr(ARGS.counter)


async def main() -> None:
    await broker.startup()  # creates the group (at "0") before the jobs are enqueued
    for _ in range(ARGS.jobs):
        await incr.kiq()
    await broker.shutdown()
    started(f"taskiq Receiver(max_async_tasks={ARGS.concurrency}) on RedisStreamBroker "
            "(xread_count 100), async task, the CLI's other defaults (ack when saved)",
            "taskiq", "taskiq-redis", "redis", "hiredis")
    broker.is_worker_process = True
    with ThreadPoolExecutor() as pool:
        receiver = Receiver(broker, executor=pool, max_async_tasks=ARGS.concurrency)
        await receiver.listen(asyncio.Event())


if __name__ == "__main__":
    asyncio.run(main())
