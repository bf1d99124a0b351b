"""Retention and hygiene: upkeep trims only entries every
group has read and acknowledged; entries a foreign XTRIM deleted while pending become
``deleted_while_pending`` dead letters; only idle consumers that own nothing are reaped."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from streamwork import Producer
from streamwork._redis import scripts
from streamwork._redis.scripts import AsyncScripts
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.consumer import Consumer
from streamwork._worker.core.loops.trimming import trim_stream
from streamwork._worker.core.loops.upkeep import upkeep_once
from streamwork._worker.features import FEATURES
from streamwork.testing import Ledger, await_for, run_until_idle
from tests.workers.ledger import LedgerWorker

STREAM, GROUP, OTHER, LAGGARD = "jobs", "testers", "auditors", "laggards"
KEYS = StreamKeys.for_stream(STREAM)


async def _upkeep(url: str, name: str = "upkeeper", join: bool = False,
                  **options: Any) -> tuple[int, int]:
    """One upkeep round (trim + reap) by a consumer of LedgerWorker built with ``options``
    (``join``: after joining its group, as a serving worker has: its priority levels too)."""
    worker = LedgerWorker.from_url(url, **options)
    consumer = Consumer(worker.handle, worker.config, url, name,
                        features=FEATURES)
    try:
        if join:
            await consumer._join()
        return await upkeep_once(consumer.ctx)
    finally:
        await consumer.redis.aclose()


def _ids(r: redis.Redis) -> list[bytes]:
    return [eid for eid, _ in r.xrange(STREAM)]


def _key(eid: bytes) -> tuple[int, int]:
    ms, seq = eid.split(b"-")
    return int(ms), int(seq)


def _pending_ids(r: redis.Redis, group: str) -> list[bytes]:
    return [row["message_id"] for row in
            r.xpending_range(STREAM, group, min="-", max="+", count=10_000)]


async def test_trim_never_removes_pending_or_unread_entries(r: redis.Redis,
                                                            redis_url: str) -> None:
    """Upkeep trims old acked entries, never a pending, unread or recent one, in any group."""
    rnd = random.Random(3)
    old_ms = int((time.time() - 3600) * 1000)
    old = [r.xadd(STREAM, {"d": b"x"}, id=f"{old_ms + i}-0") for i in range(200)]
    new = [r.xadd(STREAM, {"d": b"x"}) for _ in range(20)]
    for group in (GROUP, OTHER, LAGGARD):
        r.xgroup_create(STREAM, group, id="0")
    trimmed_while_pending = 0
    for _ in range(40):
        for group in (GROUP, OTHER):
            r.xreadgroup(group, rnd.choice(["c1", "c2"]), {STREAM: ">"},
                         count=rnd.randint(1, 12))
            oldest = _pending_ids(r, group)[:10]  # acks mostly in order, shuffled a little
            acked = rnd.sample(oldest, min(len(oldest), rnd.randint(0, 8)))
            if acked:
                r.xack(STREAM, group, *acked)
        # a slow group that acks at once: its unread entries, not a PEL, hold the trim back
        for eid, _ in r.xreadgroup(LAGGARD, "c1", {STREAM: ">"}, count=3)[0][1]:
            r.xack(STREAM, LAGGARD, eid)
        unsafe = {eid for g in (GROUP, OTHER, LAGGARD) for eid in _pending_ids(r, g)}
        for g in r.xinfo_groups(STREAM):
            last = g["last-delivered-id"]
            unsafe |= {eid for eid in old + new if _key(eid) > _key(last)}
        trimmed, _ = await _upkeep(redis_url, retention=60.0)
        left = set(_ids(r))
        assert unsafe <= left, f"trimmed pending/unread entries: {sorted(unsafe - left)[:5]}"
        if trimmed and any(_pending_ids(r, g) for g in (GROUP, OTHER)):
            trimmed_while_pending += 1
        # everything old below the oldest unsafe entry is gone, except at most the entry a
        # group read last (a conservative bound: it is kept as the MINID)
        floor = min(unsafe | set(new), key=_key)
        below = [eid for eid in left if _key(eid) < _key(floor)]
        assert len(below) <= 1, f"acknowledged old entries were not trimmed: {below}"
    assert trimmed_while_pending, "upkeep never trimmed while something was pending"

    for group in (GROUP, OTHER, LAGGARD):  # read and acknowledge everything
        r.xreadgroup(group, "c1", {STREAM: ">"}, count=1000)
        r.xack(STREAM, group, *_pending_ids(r, group))
    await _upkeep(redis_url, retention=60.0)
    assert _ids(r) == new, "all acknowledged old entries go, the ones within retention stay"
    trimmed, _ = await _upkeep(redis_url, retention=None)
    assert trimmed == 0 and _ids(r) == new, "retention=None never trims"


async def test_foreign_trim_of_pending_entries_becomes_dead_letters(
    r: redis.Redis, redis_url: str
) -> None:
    """Pending entries deleted by a foreign XTRIM become deleted_while_pending dead letters."""
    keys = [f"t-{i}" for i in range(100)]
    with Producer.from_url(redis_url) as p:
        ids = p.send_many(STREAM, [{} for _ in keys], keys=keys)
    r.xgroup_create(STREAM, GROUP, id="0")
    r.xreadgroup(GROUP, "crashed", {STREAM: ">"}, count=100)  # all pending on a dead consumer
    assert r.xtrim(STREAM, maxlen=10, approximate=False) == 90
    worker = LedgerWorker.from_url(redis_url, visibility_timeout=0.5, reclaim_interval=0.1)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: r.xpending(STREAM, GROUP)["pending"] == 0, timeout=30,
                        message="the PEL to be cleared")
        await await_for(lambda: r.xlen(KEYS.dead) == 90, message="90 dead letters")
    finally:
        worker.stop()
        await task
    assert worker.counts["deleted_while_pending"] == 90
    dead = [v for _, v in r.xrange(KEYS.dead)]
    assert {d[b"reason"] for d in dead} == {b"deleted_while_pending"}
    assert sorted(d[b"src_id"].decode() for d in dead) == sorted(ids[:90])
    assert Ledger(r).counts() == dict.fromkeys(keys[90:], 1)


async def test_reaper_removes_only_idle_consumers_that_own_nothing(
    r: redis.Redis, redis_url: str
) -> None:
    """The reaper deletes only consumers idle past the timeout that own no pending entry."""
    with Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{} for _ in range(5)])
    r.xgroup_create(STREAM, GROUP, id="0")
    r.xgroup_createconsumer(STREAM, GROUP, "idle-empty")
    r.xgroup_createconsumer(STREAM, GROUP, "me")
    r.xreadgroup(GROUP, "idle-busy", {STREAM: ">"}, count=3)
    held = _pending_ids(r, GROUP)
    assert len(held) == 3

    def idle_ms() -> dict[str, int]:
        return {c["name"].decode(): c["idle"] for c in r.xinfo_consumers(STREAM, GROUP)}

    await await_for(lambda: min(idle_ms().values()) > 1100, timeout=30,
                    message="the consumers to be idle for over 1 s")
    r.xgroup_createconsumer(STREAM, GROUP, "fresh-empty")

    _, reaped = await _upkeep(redis_url, name="me", consumer_idle_timeout=1.0, retention=None)
    assert reaped == 1
    assert set(idle_ms()) == {"idle-busy", "me", "fresh-empty"}
    assert _pending_ids(r, GROUP) == held, "reaping must not drop pending entries"
    assert {row["consumer"] for row in
            r.xpending_range(STREAM, GROUP, min="-", max="+", count=10)} == {b"idle-busy"}

    r.xack(STREAM, GROUP, *held)
    _, reaped = await _upkeep(redis_url, name="me", consumer_idle_timeout=1.0, retention=None)
    assert reaped == 1
    assert set(idle_ms()) == {"me", "fresh-empty"}


class _Recording(AsyncScripts):
    """The scripts, keeping every trim.lua reply (entries trimmed, more left)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.replies: list[tuple[int, int]] = []

    async def run(self, call: scripts.Call, client: Any = None) -> Any:
        reply = await super().run(call, client)
        if call.script == "trim":
            self.replies.append((int(reply[0]), int(reply[1])))
        return reply


def _old_stream(r: redis.Redis, n: int) -> list[bytes]:
    """``n`` entries an hour old, then 10 new ones; a group that read everything and left
    entry 15,050 pending, and one whose last read is entry 22,000: the safe MINID is
    entry 15,050, inside a stream node (nodes hold 100 entries)."""
    old_ms = int((time.time() - 3600) * 1000)
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(STREAM, {"d": b"x"}, id=f"{old_ms + i // 10}-{i % 10}")
    for _ in range(10):
        pipe.xadd(STREAM, {"d": b"x"})
    ids: list[bytes] = pipe.execute()
    r.xgroup_create(STREAM, GROUP, id="0")
    r.xreadgroup(GROUP, "c1", {STREAM: ">"})
    r.xack(STREAM, GROUP, *(eid for eid in ids if eid != ids[15_050]))
    r.xgroup_create(STREAM, OTHER, id=ids[22_000])
    return ids


async def test_a_large_trim_is_done_in_bounded_calls_with_the_same_result(
        r: redis.Redis, redis_url: str) -> None:
    """A stream with 15,050 trimmable entries is trimmed in calls of at most the chunk
    (1,000 here), each one short, and ends as one exact XTRIM to the safe MINID would leave
    it: everything from the oldest pending entry on, and nothing older; the next step has
    nothing left to do."""
    ids = _old_stream(r, 25_000)
    client = aioredis.Redis.from_url(redis_url)
    registry = _Recording(client)
    try:
        trimmed = await trim_stream(registry, STREAM, int((time.time() - 60) * 1000),
                                    chunk=1000)
        assert trimmed == 15_050
        assert _ids(r) == ids[15_050:], "not what one exact XTRIM to the safe MINID leaves"
        assert len(registry.replies) >= 16, registry.replies
        assert max(n for n, _ in registry.replies) <= 1000, registry.replies
        assert registry.replies[-1][1] == 0 and all(m for _, m in registry.replies[:-1])
        registry.replies.clear()
        assert await trim_stream(registry, STREAM, int(time.time() * 1000), chunk=1000) == 0
        assert registry.replies == [(0, 0)]
    finally:
        await client.aclose()
    # the upkeep loop's own step (default chunk) agrees once the entry is acknowledged
    r.xack(STREAM, GROUP, ids[15_050])
    r.xgroup_setid(STREAM, OTHER, id="$")
    trimmed, _ = await _upkeep(redis_url, retention=60.0)
    assert trimmed == 25_000 - 15_050
    assert _ids(r) == ids[-10:]


async def test_trim_stays_bounded_when_stream_nodes_are_bigger_than_the_chunk(
        r: redis.Redis, redis_url: str) -> None:
    """With stream nodes of 5,000 entries (stream-node-max-entries) no node fits in a chunk
    of 1,000, so whole-node trimming cannot start: each call still removes at most the
    chunk, exactly, and the end is the same."""
    old = r.config_get("stream-node-max-*")
    r.config_set("stream-node-max-entries", 5000)
    r.config_set("stream-node-max-bytes", 0)  # no byte bound: 5,000 entries a node
    try:
        ids = _old_stream(r, 25_000)
    finally:
        for name, value in old.items():
            r.config_set(name, value)
    client = aioredis.Redis.from_url(redis_url)
    registry = _Recording(client)
    try:
        trimmed = await trim_stream(registry, STREAM, int((time.time() - 60) * 1000),
                                    chunk=1000)
    finally:
        await client.aclose()
    assert trimmed == 15_050
    assert _ids(r) == ids[15_050:]
    assert [n for n, _ in registry.replies] == [1000] * 15 + [50], registry.replies


async def test_a_level_stream_keeps_what_an_absent_group_has_not_read(
        r: redis.Redis, redis_url: str, spawn_worker: Any) -> None:
    """Two groups on one stream; one's workers are down while high-priority jobs arrive.
    The other group's worker (another process) runs them and its upkeep trims: the level
    stream keeps every job the absent group has not joined and read yet, and once that
    group's worker starts, it runs all of them (nothing lost to the retention)."""
    from streamwork._wire.priorities import sibling_streams

    high, _ = sibling_streams(KEYS)
    with Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * 3, keys=["warm-1", "warm-2", "warm-3"])
    # both groups exist on the stream itself (they ran before); only GROUP is up now
    for group in (GROUP, OTHER):
        r.xgroup_create(STREAM, group, id="0")
    runner = spawn_worker("tests.workers.ledger:LedgerWorker", redis_url, "--group", GROUP,
                          "--retention", "0", "--stream", STREAM)
    with Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * 3, keys=["urgent-1", "urgent-2", "urgent-3"],
                    priority="high")
    await await_for(lambda: r.exists(high) and any(
        g["name"] == GROUP.encode() and not g["pending"] and not g["lag"]
        for g in r.xinfo_groups(high)), timeout=30, message="GROUP ran the high jobs")
    # the running group's upkeep, as often as it likes: nothing of the level goes while
    # OTHER has not joined it
    for _ in range(3):
        await _upkeep(redis_url, join=True, retention=0.0, group=GROUP)
    assert r.xlen(high) == 3, "the level stream was trimmed under an absent group"
    runner.terminate()
    runner.wait(30)
    ledger = Ledger(r, "ledger")
    r.delete("ledger")
    await run_until_idle(LedgerWorker.from_url(redis_url, group=OTHER, stream=STREAM), r)
    report = ledger.report(["warm-1", "warm-2", "warm-3", "urgent-1", "urgent-2",
                            "urgent-3"])
    assert report.exactly_once, report
    # every group has joined and read it now: the level is trimmed as the stream is
    await _upkeep(redis_url, join=True, retention=0.0, group=OTHER)
    assert r.xlen(high) <= 1  # up to the last delivered entry, as on the stream itself
