"""arq: its asyncio worker, ``max_jobs=concurrency``; the handler is ``async``."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aredis
from arq import Worker, create_pool
from arq.connections import RedisSettings

from benchmarks.peer_workers._common import parse, started

ARGS = parse()
#: arq polls its queue (a sorted set) and sleeps ``poll_delay`` between polls (default
#: 0.5 s, read up to ``queue_read_limit`` = 100 jobs per poll): the default caps a prefilled
#: queue at ~200 jobs/s whatever the handler. 0.01 s is arq at its best under this protocol
POLL_DELAY = 0.01


async def incr(ctx: dict[str, Any]) -> None:
    await ctx["bench"].incr(ARGS.counter)


async def on_startup(ctx: dict[str, Any]) -> None:
    ctx["bench"] = aredis.Redis.from_url(ARGS.url)


async def main() -> None:
    settings = RedisSettings.from_dsn(ARGS.url)
    pool = await create_pool(settings)
    for _ in range(ARGS.jobs):
        await pool.enqueue_job("incr")
    await pool.aclose()
    started(f"arq Worker(max_jobs={ARGS.concurrency}, poll_delay={POLL_DELAY}), async def "
            "handler; other options default (queue_read_limit 100, keep_result 3600 s)",
            "arq", "redis", "hiredis")
    worker = Worker(functions=[incr], redis_settings=settings, on_startup=on_startup,
                    max_jobs=ARGS.concurrency, poll_delay=POLL_DELAY, handle_signals=False)
    await worker.main()


if __name__ == "__main__":
    asyncio.run(main())
