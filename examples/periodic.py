"""Periodic jobs: `sw.Every` and `sw.Cron` on a worker. Each tick runs once, however many
workers carry the schedule (here three, as if three processes).

Run: python examples/periodic.py [REDIS_URL]   (sw.Cron needs the 'schedules' extra)
"""

import asyncio
import sys
from collections import Counter

import streamwork as sw
from streamwork.testing import RedisServer


class Reports(sw.StreamWorker):
    stream, group = "reports", "reporter"
    schedules = [
        sw.Every(1, payload={"report": "heartbeat"}),  # at every full second of Unix time
        sw.Cron("*/2 * * * * *", tz="Europe/Berlin",  # 6 fields: seconds first
                payload={"report": "digest"}, name="digest"),
    ]
    catch_up = "last"  # ticks missed while no worker ran: the latest runs once
    ran: Counter[str] = Counter()

    async def handle(self, msg: sw.Message) -> None:
        # msg.key is "<schedule name>:<tick time>", e.g. "digest:2026-11-30T16:20:02.000Z"
        self.ran[msg.key] += 1


async def main(url: str) -> None:
    workers = [Reports.from_url(url) for _ in range(3)]
    serving = [asyncio.create_task(w.serve()) for w in workers]
    await asyncio.sleep(4.2)
    for w in workers:
        w.stop()
    await asyncio.gather(*serving)
    for key, times in sorted(Reports.ran.items()):
        print(f"{key}  ran {times}x")
    assert Reports.ran and set(Reports.ran.values()) == {1}, "a tick ran twice"
    print(f"{len(Reports.ran)} ticks, each run once by one of 3 workers")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with RedisServer() as server:
            asyncio.run(main(server.url))
