"""streamwork._ops.stats on a real server: figures match XINFO/XPENDING, discovery, rates."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator

import pytest
import redis

import streamwork as sw
from streamwork._ops.rates import compute_rates
from streamwork._ops.stats import discover_streams, sample, stream_stats
from streamwork._producer.shells import Producer
from streamwork._redis import connection
from streamwork._wire.keys import StreamKeys, is_dead_letter_stream
from streamwork.errors import StreamNotFound
from streamwork.testing import await_for, wait_for

STREAM = "orders"


def prepare(redis_url: str, r: redis.Redis) -> None:
    """orders: 10 jobs; billing read 6 (c-a 4, c-b 2), acked 1 of c-a's -> pending 5, lag 4;
    audit never read (lag 10); 3 delayed (2 due, 1 in 10 min); 2 dead letters."""
    with Producer.from_url(redis_url) as producer:
        producer.send_many(STREAM, [{"order_id": i} for i in range(10)],
                           keys=[f"order-{i}" for i in range(10)])
        producer.send(STREAM, {"retry": 1}, key="due-1", delay=0)
        producer.send(STREAM, {"retry": 2}, key="due-2", delay=0)
        producer.send(STREAM, {"retry": 3}, key="later", delay=600)
    r.xgroup_create(STREAM, "billing", "0", mkstream=True)
    r.xgroup_create(STREAM, "audit", "0")
    got = r.xreadgroup("billing", "c-a", {STREAM: ">"}, count=4)
    r.xreadgroup("billing", "c-b", {STREAM: ">"}, count=2)
    r.xack(STREAM, "billing", got[0][1][0][0])
    r.xadd("{orders}:dead", {"reason": "declined"})
    r.xadd("{orders}:dead", {"reason": "declined"})


def wait_idle(r: redis.Redis, ms: int) -> None:
    """Wait until billing's every pending delivery and every consumer has been idle for at
    least ``ms`` milliseconds, as the server counts it."""
    def idle() -> bool:
        rows = r.xpending_range(STREAM, "billing", "-", "+", 100)
        consumers = r.xinfo_consumers(STREAM, "billing")
        return (all(row["time_since_delivered"] >= ms for row in rows)
                and all(c["idle"] >= ms for c in consumers))

    wait_for(idle, message=f"billing's deliveries and consumers idle for {ms} ms")


@pytest.fixture(name="client")
def _client(redis_url: str) -> Iterator[redis.Redis]:
    """A client built the way the CLI builds it (bytes replies)."""
    client: redis.Redis = connection.sync_client(redis_url)
    yield client
    client.close()


def test_stream_stats_match_xinfo_and_xpending(redis_url: str, r: redis.Redis,
                                               client: redis.Redis) -> None:
    """Every figure equals what XINFO/XPENDING/ZCOUNT/XLEN report for the prepared stream."""
    prepare(redis_url, r)
    wait_idle(r, 250)
    s = stream_stats(client, STREAM)
    info = r.xinfo_stream(STREAM)
    assert (s.length, s.entries_added) == (10, 10) == (info["length"], info["entries-added"])
    assert s.first_id == info["first-entry"][0].decode()
    assert s.last_id == info["last-generated-id"].decode()
    assert (s.delayed_total, s.delayed_due, s.dead) == (3, 2, 2)
    assert [g.name for g in s.groups] == ["audit", "billing"]
    by_name = {g["name"].decode(): g for g in r.xinfo_groups(STREAM)}
    billing, audit = s.group("billing"), s.group("audit")
    assert billing is not None and audit is not None
    assert (billing.lag, billing.pending, billing.entries_read, billing.consumers) == (4, 5, 6, 2)
    assert billing.lag == by_name["billing"]["lag"]
    assert billing.last_delivered_id == by_name["billing"]["last-delivered-id"].decode()
    assert (audit.lag, audit.pending, audit.consumers, audit.oldest_pending_age_s) == (
        10, 0, 0, None)
    assert billing.top_consumers == [("c-a", 3), ("c-b", 2)]
    [oldest] = r.xpending_range(STREAM, "billing", "-", "+", 1)
    assert billing.oldest_pending_id == oldest["message_id"].decode()
    assert billing.oldest_pending_age_s is not None and billing.oldest_pending_age_s >= 0.25
    assert [(c.name, c.pending) for c in billing.consumer_list] == [("c-a", 3), ("c-b", 2)]
    assert all(c.idle_s >= 0.25 for c in billing.consumer_list)
    doc = json.loads(json.dumps(s.as_json()))
    assert doc["groups"][1]["top_consumers"][0] == {"name": "c-a", "pending": 3}


def test_missing_stream_and_wrong_type_are_clear_errors(redis_url: str, r: redis.Redis,
                                                        client: redis.Redis) -> None:
    """A missing stream names it and points at `streamwork inspect` with no argument."""
    with pytest.raises(StreamNotFound, match=r"'nope' does not exist.*streamwork inspect"):
        stream_stats(client, "nope")
    r.set("plain", "1")
    with pytest.raises(StreamNotFound, match="is a string, not a stream"):
        stream_stats(client, "plain")


def test_discovery_lists_streams_but_not_dead_letter_streams(redis_url: str, r: redis.Redis,
                                                            client: redis.Redis) -> None:
    """SCAN TYPE stream finds every stream; `{S}:dead` ones are left out, other names kept."""
    prepare(redis_url, r)
    r.xadd("{eu}payments", {"d": b"x"})
    r.xadd("{eu}payments:dead", {"reason": "x"})
    r.xadd("audit:dead", {"d": b"x"})  # a user's stream: not of the {S}:dead form
    r.set("not-a-stream", "1")
    assert discover_streams(client) == ["audit:dead", "orders", "{eu}payments"]
    assert "{orders}:dead" in discover_streams(client, include_dead=True)
    assert is_dead_letter_stream("{orders}:dead") and is_dead_letter_stream("{eu}x:dead")
    assert not is_dead_letter_stream("orders:dead") and not is_dead_letter_stream("orders")
    assert [s.stream for s in sample(client, ["orders", "gone"])] == ["orders"]


async def test_a_groups_retries_count_as_delayed_and_its_retry_stream_stays_hidden(
        redis_url: str, r: redis.Redis, client: redis.Redis) -> None:
    """A retry waiting in one group's retry ZSET shows in `delayed` (and not as a stream of
    its own), and a retry delivery held from the group's retry stream counts as pending."""
    class Fails(sw.StreamWorker):
        stream, group = STREAM, "billing"
        retry_delay = retry_max_delay = 600.0

        async def handle(self, msg: sw.Message) -> None:
            raise RuntimeError("not yet")

    with Producer.from_url(redis_url) as producer:
        producer.send(STREAM, {}, key="k")
    worker = Fails.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.counts["retried"] == 1, message="one retry scheduled")
    finally:
        worker.stop()
        await task
    stats = stream_stats(client, STREAM)
    assert (stats.delayed_total, stats.delayed_due) == (1, 0)
    assert stats.group("billing").retries_waiting == 1  # type: ignore[union-attr]
    # the retry comes due: moved to the group's retry stream, read there and held
    g = StreamKeys.for_stream(STREAM).group("billing")
    [(member, _)] = r.zrange(g.retries, 0, -1, withscores=True)
    r.zadd(g.retries, {member: 0})
    assert discover_streams(client) == [STREAM]
    r.xadd(g.retry, {"d": b"x"})
    r.xreadgroup("billing", "c", {g.retry: ">"})
    stats = stream_stats(client, STREAM)
    assert stats.group("billing").pending == 1  # type: ignore[union-attr]
    assert stats.delayed_due == 1
    assert discover_streams(client) == [STREAM], "a group's retry stream is not a stream to list"


def test_rates_from_two_real_samples(redis_url: str, r: redis.Redis,
                                     client: redis.Redis) -> None:
    """10 XADDs, 6 reads and 4 acks between samples -> produced 10, acked 4 per interval."""
    prepare(redis_url, r)
    before = stream_stats(client, STREAM)
    with Producer.from_url(redis_url) as producer:
        producer.send_many(STREAM, [{"n": i} for i in range(10)])
    got = r.xreadgroup("billing", "c-a", {STREAM: ">"}, count=6)
    r.xack(STREAM, "billing", *[entry_id for entry_id, _ in got[0][1][:4]])
    after = stream_stats(client, STREAM)
    rates = compute_rates(before, after, interval_s=2.0)
    assert rates.produced_per_s == 5.0
    assert rates.acked_per_s == {"audit": 0.0, "billing": 2.0}
    measured = compute_rates(before, after)  # interval from the server clock
    if after.taken_at_ms > before.taken_at_ms:
        assert measured.interval_s == (after.taken_at_ms - before.taken_at_ms) / 1000
        assert measured.produced_per_s == 10 / measured.interval_s
    # before Redis 7 (no entries-added) the length growth stands in
    old = [dataclasses.replace(x, entries_added=None) for x in (before, after)]
    assert compute_rates(old[0], old[1], interval_s=2.0).produced_per_s == 5.0
    assert compute_rates(old[0], old[0], interval_s=2.0).produced_per_s == 0.0
    zero = compute_rates(before, after, interval_s=0.0)
    assert zero.produced_per_s is None and zero.acked_per_s["billing"] is None
    assert json.dumps(rates.as_json())
