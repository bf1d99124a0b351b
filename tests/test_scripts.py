"""Lua scripts called directly: batch ownership checks, token order, slot hygiene."""

from __future__ import annotations

import redis

from streamwork._redis import scripts
from streamwork._wire.keys import StreamKeys
from tests.helpers.slots import key_slot


def _held(r: redis.Redis, n: int, consumer: str = "me") -> list[bytes]:
    for i in range(n):
        r.xadd("s", {"d": str(i)})
    r.xgroup_create("s", "g", id="0")
    reply = r.xreadgroup("g", consumer, {"s": ">"}, count=n)
    return [eid for eid, _ in reply[0][1]]


def test_complete_acks_only_what_the_caller_owns_even_past_the_listing_limit(
    r: redis.Redis,
) -> None:
    """A batch spanning 500 of our pending entries (over the one-XPENDING listing limit)
    is still acked exactly for the owned ids; an id another consumer owns is refused."""
    ids = _held(r, 500)
    r.xclaim("s", "g", "other", 0, [ids[250]])
    batch = [ids[0], ids[250], ids[499]]
    res = scripts.SyncScripts(r).run(scripts.complete(
        StreamKeys.for_stream("s").group("g"), "me", 0, 0, b"", [],
        [batch, [0] * 3, [""] * 3, [""] * 3, [""] * 3, [""] * 3]))
    assert res == [1, 0, 1]
    pending = {row["message_id"]: row["consumer"] for row in
               r.xpending_range("s", "g", min="-", max="+", count=1000)}
    assert ids[0] not in pending and ids[499] not in pending
    assert pending[ids[250]] == b"other" and len(pending) == 498


def test_the_ownership_check_spans_ids_of_every_shape_in_any_order(r: redis.Redis) -> None:
    """The batch's id span is found without parsing ids: ids whose milliseconds or
    sequence parts differ in length (9-5 < 10-1 < 10-12 < 100-3), given out of order, are
    all found owned; one another consumer owns, and one outside our span, are not."""
    for entry_id in ("1-1", "9-5", "9-40", "10-1", "10-12", "100-3", "100-10", "2000-0"):
        r.xadd("s", {"d": "x"}, id=entry_id)
    r.xgroup_create("s", "g", id="0")
    r.xreadgroup("g", "me", {"s": ">"}, count=100)
    r.xclaim("s", "g", "other", 0, ["10-12"])
    batch = ["100-10", "9-40", "10-12", "9-5", "2000-0", "100-3", "10-1"]
    res = scripts.SyncScripts(r).run(scripts.complete(
        StreamKeys.for_stream("s").group("g"), "me", 0, 0, b"", [],
        [batch, [0] * 7, [""] * 7, [""] * 7, [""] * 7, [""] * 7]))
    assert res == [1, 1, 0, 1, 1, 1, 1]
    pending = {row["message_id"]: row["consumer"] for row in
               r.xpending_range("s", "g", min="-", max="+", count=100)}
    assert pending == {b"1-1": b"me", b"10-12": b"other"}


def test_claim_tokens_increase_in_batch_order_and_same_key_copies_are_busy(
    r: redis.Redis,
) -> None:
    """claim.lua grants increasing tokens; a second copy of a key in one batch is busy."""
    ids = _held(r, 3)
    g = StreamKeys.for_stream("s").group("g")
    res = scripts.SyncScripts(r).run(scripts.claim(
        g, "me", 10_000, "owner", "lease", [ids, [0] * 3, ["a", "b", "a"], [1] * 3, []]))
    assert res[0] > 0 and res[1] > res[0] and res[2] == -2
    assert r.get(g.job("a")).startswith(f"Howner:{res[0]}|1|".encode())  # held, not started
    # the record is this group's alone: another group takes the same key freely
    other = StreamKeys.for_stream("s").group("h")
    r.xgroup_create("s", "h", id="0")
    [[_, entries]] = r.xreadgroup("h", "me", {"s": ">"}, count=1)
    res = scripts.SyncScripts(r).run(scripts.claim(
        other, "me", 10_000, "owner", "lease", [[entries[0][0]], [0], ["a"], [1], []]))
    assert res[0] > 0


def test_claim_takes_the_records_of_deliveries_to_start_at_once_as_running(
    r: redis.Redis,
) -> None:
    """claim.lua's optional start column (a runner is idle for them): those records are
    taken as the running ones, as start.lua would make them; the others are held."""
    ids = _held(r, 2)
    g = StreamKeys.for_stream("s").group("g")
    res = scripts.SyncScripts(r).run(scripts.claim(
        g, "me", 10_000, "owner", "lease", [ids, [0] * 2, ["a", "b"], [1] * 2, [], [1, 0]]))
    assert res[0] > 0 and res[1] > res[0]
    assert r.get(g.job("a")).startswith(f"Rowner:{res[0]}|1|".encode())  # running
    assert r.get(g.job("b")).startswith(f"Howner:{res[1]}|1|".encode())  # held
    # start.lua finds the running one its own: the runner's start goes ahead
    started = scripts.SyncScripts(r).run(scripts.start(g, "me", 1, 10_000, [
        [ids[0]], [0], ["a"], [f"owner:{res[0]}"], [""], ["s"], [1], [0]]))
    assert started == [1]


def test_every_key_of_a_stream_shares_its_slot() -> None:
    """Every key a script touches for stream S hashes to S's slot (Redis Cluster)."""
    for stream in ("orders", "a:b", "{tag}:x", "日本"):
        k = StreamKeys.for_stream(stream)
        slot = key_slot(stream)
        g = k.group("billing")
        for key in (k.dead, k.delayed, k.fence, g.retry, g.retries, g.job("x")):
            assert key_slot(key) == slot, (stream, key)


def test_one_promote_call_serves_the_delayed_sends_and_the_retries(r: redis.Redis) -> None:
    """promote.lua moves the due members of each (ZSET, stream) pair it is given and says
    per pair when the next is due: a worker polls its delayed sends and its group's
    retries in one call (an idle worker serving many streams costs half as much)."""
    keys, g = StreamKeys.for_stream("s"), StreamKeys.for_stream("s").group("g")
    r.zadd(keys.delayed, {b"0:1-0:due-send": 1, b"0:2-0:later-send": 2**50})
    r.zadd(g.retries, {b"2:3-0:due-retry": 1})
    res = scripts.SyncScripts(r).run(scripts.promote(
        [(keys.delayed, keys.stream), (g.retries, g.retry)], 100))
    assert res[0] == 1 and res[1] > 0 and res[2:] == [1, -1]
    assert [f[b"d"] for _, f in r.xrange(keys.stream)] == [b"due-send"]
    [(_, retried)] = r.xrange(g.retry)
    assert retried[b"d"] == b"due-retry" and retried[b"a"] == b"2"
    assert r.zcard(keys.delayed) == 1 and r.zcard(g.retries) == 0
