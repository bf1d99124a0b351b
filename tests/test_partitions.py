"""Partitioned streams and ordered mode on one server: names and routing, the producer's
sends and status across partitions, a worker over many partitions (shared handler slots,
a subset), ordered mode (per-key order with retries and a dead letter, rebalancing between
workers, a SIGKILLed owner) and bad input."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import zlib
from collections import defaultdict
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork.testing import await_for, run_until_idle
from tests.helpers.ordered_campaign import expected_logs, run_campaign

STREAM, GROUP = "orders", "billing"


def _redis_cli_ranges(masters: int) -> list[tuple[int, int]]:
    """The slot range of each master as ``redis-cli --cluster create`` assigns them
    (redis-cli.c: ``last = lround(cursor + slots_per_node - 1)``)."""
    per, first, cursor, out = 16384 / masters, 0, 0.0, []
    for i in range(masters):
        last = 16383 if i == masters - 1 else math.floor(cursor + per - 1 + 0.5)
        out.append((first, last))
        first, cursor = last + 1, cursor + per
    return out


@pytest.mark.parametrize(("masters", "partitions"), [(2, 6), (3, 6), (3, 3), (6, 6), (5, 10)])
def test_partitions_land_evenly_on_redis_cli_masters(masters: int, partitions: int) -> None:
    """For any stream name, when the master count divides P, each master of a cluster made
    by redis-cli holds exactly P / masters partitions (the rounding of its slot ranges
    never pushes a partition onto a neighbour)."""
    ranges = _redis_cli_ranges(masters)
    for n in range(300):
        names = partition_names(f"orders{n}", partitions)
        owners = [next(m for m, (lo, hi) in enumerate(ranges)
                       if lo <= key_slot(name.encode()) <= hi) for name in names]
        assert owners == [i * masters // partitions for i in range(partitions)], (n, owners)


def test_partition_names_are_pinned_and_spread_over_slot_ranges() -> None:
    """The layout other languages rely on: names, slot ranges and the crc32 routing."""
    names = partition_names("orders", 6)
    assert names == ("orders#0.40", "orders#1.21", "orders#2.50", "orders#3.0", "orders#4.9",
                     "orders#5.62")
    for i, name in enumerate(names):
        assert i * 16384 // 6 <= key_slot(name.encode()) < (i + 1) * 16384 // 6
        assert StreamKeys.for_stream(name).tag == "{" + name + "}"
    assert partition_names("orders", 1) == ("orders",)
    assert zlib.crc32(b"order-7") == 164682458 and partition_of("order-7", 6) == 2


@pytest.mark.parametrize("bad", [
    {"partitions": 0}, {"partitions": 1025}, {"partitions": "6"}, {"partitions": {"x": 0}},
    {"partitions": {"{tagged}:x": 4}},
])
def test_bad_producer_partitions(redis_url: str, bad: dict[str, Any]) -> None:
    with pytest.raises(sw.ConfigError) as err:
        sw.Producer.from_url(redis_url, **bad)
    assert "partitions" in str(err.value) or "stream" in str(err.value)


def test_bad_sends_enqueue_nothing(redis_url: str, r: redis.Redis) -> None:
    """A tagged name cannot be partitioned, order keys must be non-empty str, one per job."""
    with sw.Producer.from_url(redis_url, partitions=4) as p:
        with pytest.raises(sw.ConfigError, match="hash tag"):
            p.send("{orders}:eu", {})
        with pytest.raises(sw.ConfigError, match="order_key"):
            p.send(STREAM, {}, order_key="")
        with pytest.raises(sw.ConfigError, match="order_keys"):
            p.send_many(STREAM, [{}, {}], order_keys=["a"])
        with pytest.raises(sw.ConfigError, match="order_key"):
            p.send_many(STREAM, [{}, {}], order_keys=["a", 7])  # type: ignore[list-item]
    assert r.keys("*") == []
    with pytest.raises(sw.ConfigError, match="hash tag"):
        sw.StreamWorker.from_url(redis_url, stream="{orders}:eu", group=GROUP, partitions=2)
    with pytest.raises(sw.ConfigError, match="only_partitions"):
        sw.StreamWorker.from_url(redis_url, stream=STREAM, group=GROUP, partitions=2,
                                 only_partitions=[2])


def test_producer_routes_by_order_key_and_keeps_ids_in_order(redis_url: str,
                                                            r: redis.Redis) -> None:
    """send_many: each job lands in the partition of its order key (default: its key); the
    ids come back in the caller's order; a per-stream mapping leaves other streams whole."""
    names = partition_names(STREAM, 4)
    keys = [f"job-{i}" for i in range(120)]
    orders = [f"acct-{i % 9}" for i in range(120)]
    with sw.Producer.from_url(redis_url, partitions={STREAM: 4}) as p:
        ids = p.send_many(STREAM, [{"i": i} for i in range(120)], keys=keys, order_keys=orders)
        one = p.send(STREAM, {"i": 120}, key="solo")
        plain = p.send("mail", {"i": 0})
    # entry ids are unique per stream only: an entry is (partition, id)
    entries = {(name, eid.decode()): fields for name in names
               for eid, fields in r.xrange(name)}
    assert len(entries) == 121
    placed = [(names[partition_of(orders[i], 4)], eid) for i, eid in enumerate(ids)]
    assert all(where in entries for where in placed)
    assert len(set(placed)) == 120
    assert (names[partition_of("solo", 4)], one) in entries
    assert r.xlen("mail") == 1 and r.xrange("mail")[0][0].decode() == plain
    assert len({name for name, _ in placed}) > 1, "the order keys should spread"


class Tally(sw.StreamWorker):
    """Counts how many handlers run at once; returns the payload's i."""

    stream, group = STREAM, GROUP
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.05

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.now = self.peak = 0
        self.seen: list[str] = []

    async def handle(self, msg: sw.Message) -> int:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(0.003)
        finally:
            self.now -= 1
        self.seen.append(msg.key)
        return int(msg.payload["i"])


async def test_worker_serves_every_partition_within_its_concurrency(
        redis_url: str, r: redis.Redis) -> None:
    """4 partitions, concurrency 3: every job runs once, never more than 3 handlers at once
    (the consumers share the slots), and status/result find a job in any partition."""
    with sw.Producer.from_url(redis_url, partitions=4) as p:
        p.send_many(STREAM, [{"i": i} for i in range(200)], keys=[f"k{i}" for i in range(200)])
        w = Tally.from_url(redis_url, partitions=4, concurrency=3)
        await run_until_idle(w, r, timeout=60)
        assert sorted(w.seen) == sorted(f"k{i}" for i in range(200))
        assert w.peak == 3, "3 slots shared by 4 partitions: all used, never more"
        assert w.counts["acked"] == 200
        far = next(f"k{i}" for i in range(200) if partition_of(f"k{i}", 4) == 3)
        st = p.status(STREAM, far)
        assert (st.state, st.result, st.stream) == ("done", int(far[1:]), STREAM)
        assert p.result(STREAM, far, group=GROUP, timeout=5) == int(far[1:])
        assert p.status(STREAM, "nope").state == "unknown"


async def test_only_partitions_serves_that_subset(redis_url: str, r: redis.Redis) -> None:
    names = partition_names(STREAM, 4)
    with sw.Producer.from_url(redis_url, partitions=4) as p:
        p.send_many(STREAM, [{"i": i} for i in range(80)], keys=[f"k{i}" for i in range(80)])
    w = Tally.from_url(redis_url, partitions=4, only_partitions=[1, 3])
    await run_until_idle(w, r, timeout=30)
    assert {partition_of(k, 4) for k in w.seen} == {1, 3}
    assert len(w.seen) == sum(r.xlen(names[i]) for i in (1, 3))
    for i in (0, 2):
        assert r.xlen(names[i]) > 0 and not r.exists(StreamKeys.for_stream(names[i])
                                                      .group(GROUP).retry)


class Ordered(sw.StreamWorker):
    """Ordered; records (order key, seq, attempt, start, end) of every run."""

    stream, group = STREAM, GROUP
    ordered = True
    partitions = 2
    concurrency = 8
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.05
    visibility_timeout = 2.0

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.runs: list[tuple[str, int, int, float, float]] = []

    async def handle(self, msg: sw.Message) -> None:
        start = time.monotonic()
        p = msg.payload
        try:
            await asyncio.sleep(0.002)
            if msg.attempt <= p.get("fail", 0):
                raise RuntimeError("once more")
            if p.get("dead"):
                raise sw.DeadLetter("poison")
        finally:
            self.runs.append((msg.order_key, p["seq"], msg.attempt, start, time.monotonic()))


async def test_ordered_one_at_a_time_in_order_through_retries_and_a_dead_letter(
        redis_url: str, r: redis.Redis) -> None:
    """Per order key: runs never overlap, each job starts only after the one before it
    ended (retries included: they happen in place), and a dead-lettered job lets the next
    run. Different keys do run side by side."""
    with sw.Producer.from_url(redis_url, partitions=2) as p:
        jobs = [(k, s) for s in range(15) for k in range(6)]
        p.send_many(STREAM, [{"seq": s, "fail": 2 if s % 5 == 1 else 0,
                              "dead": (k, s) == (2, 7)} for k, s in jobs],
                    keys=[f"{k}-{s}" for k, s in jobs], order_keys=[f"o{k}" for k, _ in jobs])
    w = Ordered.from_url(redis_url)
    await run_until_idle(w, r, timeout=60)
    by_key: dict[str, list[tuple[int, int, float, float]]] = defaultdict(list)
    for key, seq, attempt, start, end in w.runs:
        by_key[key].append((seq, attempt, start, end))
    assert sorted(by_key) == [f"o{k}" for k in range(6)]
    for key, runs in by_key.items():
        runs.sort(key=lambda x: x[2])  # by start time
        assert [s for s, *_ in runs] == sorted(s for s, *_ in runs), key  # in order
        for before, after in itertools.pairwise(runs):
            assert after[2] >= before[3], f"{key}: overlapping runs {before} {after}"
        assert {s for s, *_ in runs} == set(range(15))
    assert w.counts["retried"] == 6 * 3 * 2 and w.counts["dead_lettered"] == 1
    overlap = any(a[3] < b[4] and b[3] < a[4] for a in w.runs for b in w.runs
                  if a[0] != b[0])
    assert overlap, "different order keys should run side by side"


async def test_ordered_workers_share_partitions_and_rebalance(redis_url: str,
                                                             r: redis.Redis) -> None:
    """Two ordered workers split 4 partitions 2 and 2; when one stops (handing its
    partitions back), the other takes all 4."""
    a = Ordered.from_url(redis_url, partitions=4, consumer="a", visibility_timeout=0.6)
    b = Ordered.from_url(redis_url, partitions=4, consumer="b", visibility_timeout=0.6)
    ta = asyncio.create_task(a.serve())
    try:
        await await_for(lambda: a.partitions_served == [0, 1, 2, 3], timeout=10)
        tb = asyncio.create_task(b.serve())
        await await_for(lambda: len(a.partitions_served) == 2 == len(b.partitions_served),
                        timeout=15)
        assert sorted(a.partitions_served + b.partitions_served) == [0, 1, 2, 3]
        owners = {r.get(StreamKeys.for_stream(n).group(GROUP).owner)
                  for n in partition_names(STREAM, 4)}
        assert len(owners) == 2 and None not in owners
        b.stop()
        await tb
        await await_for(lambda: a.partitions_served == [0, 1, 2, 3], timeout=15)
    finally:
        a.stop()
        await ta
    assert r.zcard(StreamKeys.for_stream(STREAM).group(GROUP).members) == 0
    assert not any(r.exists(StreamKeys.for_stream(n).group(GROUP).owner)
                   for n in partition_names(STREAM, 4))


def test_ordered_three_processes_one_sigkilled(redis_url: str, r: redis.Redis,
                                               spawn_worker: Any) -> None:
    """3 worker processes, retries, a dead letter, one process SIGKILLed mid-run: every
    order key's effect log is exactly its jobs, in order, once each."""
    out = run_campaign(redis_url, r, spawn_worker)
    assert out["logs"] == expected_logs()
    assert out["alive"] == [True, True]
    assert out["dead"] == 1


async def test_a_different_partition_count_is_refused(redis_url: str, r: redis.Redis) -> None:
    """The first partitioned producer records the count in {S}:partitions; a producer or a
    worker with another count (an unpartitioned worker too) is refused with what to do,
    and nothing is enqueued by the refused producer."""
    with sw.Producer.from_url(redis_url, partitions=4) as p:
        p.send(STREAM, {"i": 1})
    assert r.get(StreamKeys.for_stream(STREAM).partitions) == b"4"
    before = sum(r.xlen(n) for n in partition_names(STREAM, 4))
    with sw.Producer.from_url(redis_url, partitions=6) as p6, \
            pytest.raises(sw.ConfigError, match="split into 4 partitions"):
        p6.send_many(STREAM, [{"i": 2}, {"i": 3}])
    with sw.Producer.from_url(redis_url) as p1, \
            pytest.raises(sw.ConfigError, match="split into 4 partitions"):
        p1.send(STREAM, {"i": 4})
    assert not any(r.exists(n) for n in partition_names(STREAM, 6))
    assert not r.exists(STREAM)
    assert sum(r.xlen(n) for n in partition_names(STREAM, 4)) == before
    for options in ({"partitions": 6}, {"partitions": 1}):
        w = Tally.from_url(redis_url, **options)
        with pytest.raises(sw.WorkerFailed, match="split into 4 partitions"):
            await asyncio.wait_for(w.serve(), 10)
    w = Tally.from_url(redis_url, partitions=4)
    await run_until_idle(w, r, timeout=20)
    assert w.seen and len(w.seen) == before
