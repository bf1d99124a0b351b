"""Limits across workers: rate_limit, a token bucket shared by the group; and
concurrency_key / concurrency_per_key, a cap on jobs in flight per key. Jobs over a limit
wait without using up attempts."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import redis
import redis.asyncio

import streamwork as sw
from streamwork.testing import run_until_idle, wait_for
from tests.workers.limits import STARTS, STREAM


def test_rate_limit_holds_across_three_processes(redis_url: str, r: redis.Redis,
                                                 spawn_worker: Any) -> None:
    """3 worker processes at concurrency 32 with rate_limit 50/s: over 6 s they start
    within 10 % of 50 jobs a second, every job on its first attempt."""
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * 600)
    for _ in range(3):
        spawn_worker("tests.workers.limits:Paced", redis_url)

    def starts() -> list[tuple[float, int]]:
        return [(float(t), int(a)) for t, a in
                (x.decode().split(":") for x in r.lrange(STARTS, 0, -1))]

    # measure from the 20th start (every process is up) over the next 6 s
    wait_for(lambda: len(starts()) >= 20, timeout=30, message="the workers did not start")
    first = starts()[19][0]
    wait_for(lambda: starts()[-1][0] >= first + 6.5, timeout=30,
             message="not 6.5 s of starts")
    got = starts()
    window = [t for t, _ in got if first <= t < first + 6.0]
    rate = len(window) / 6.0
    assert 45.0 <= rate <= 55.0, f"{rate:.1f} jobs/s over 6 s, not within 10 % of 50/s"
    assert {a for _, a in got} == {1}, "a job over the limit must not use up an attempt"


class PerAccount(sw.StreamWorker):
    """Counts, in Redis, the jobs of each account in flight across every worker."""

    stream, group = "charges", "billing"
    concurrency = 8
    concurrency_per_key = 2
    read_block = 0.05
    visibility_timeout = 2.0

    def concurrency_key(self, msg: sw.Message) -> str:
        return str(msg.payload["account"])

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.peaks: Counter[str] = Counter()
        self.client: Any = None

    async def handle(self, msg: sw.Message) -> None:
        if self.client is None:
            self.client = redis.asyncio.Redis.from_url(self.url)
        account = str(msg.payload["account"])
        now = await self.client.incr(f"inflight:{account}")
        self.peaks[account] = max(self.peaks[account], now)
        try:
            await asyncio.sleep(0.02)
        finally:
            await self.client.decr(f"inflight:{account}")

    async def on_stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()


async def test_concurrency_per_key_is_never_exceeded(redis_url: str, r: redis.Redis) -> None:
    """Three workers at concurrency 8, 3 accounts x 20 jobs, concurrency_per_key 2: no
    account ever has 3 jobs in flight, each reaches 2, and no attempt is used up."""
    with sw.Producer.from_url(redis_url) as p:
        p.send_many("charges", [{"account": i % 3} for i in range(60)])
    workers = [PerAccount.from_url(redis_url, consumer=f"w{i}") for i in range(3)]
    tasks = [asyncio.create_task(w.serve()) for w in workers[1:]]
    try:
        await run_until_idle(workers[0], r, timeout=60)
    finally:
        for w in workers[1:]:
            w.stop()
        await asyncio.gather(*tasks)
    peaks: Counter[str] = Counter()
    for w in workers:
        for account, n in w.peaks.items():
            peaks[account] = max(peaks[account], n)
    assert dict(peaks) == {"0": 2, "1": 2, "2": 2}
    assert sum(w.counts["acked"] for w in workers) == 60
    assert sum(w.counts["retried"] for w in workers) == 0
    assert not r.keys("{charges}:sem:*"), "every hold is given back"


def test_bad_limits_are_refused(redis_url: str) -> None:
    for bad in ("50", "0/s", "-1/s", "50/day", "fast"):
        with pytest.raises(sw.ConfigError, match="rate_limit"):
            PerAccount.from_url(redis_url, rate_limit=bad)
    with pytest.raises(sw.ConfigError, match="concurrency_per_key"):
        PerAccount.from_url(redis_url, concurrency_per_key=0)
    with pytest.raises(sw.ConfigError, match="concurrency_key"):
        PerAccount.from_url(redis_url, concurrency_key="account")
