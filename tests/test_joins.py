"""Joins (fan-in): a callback enqueued exactly once, by the end of the last of its children,
with every child's outcome; on one Redis, through worker crashes and a Redis restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork.testing import run_until_idle

CHILDREN, CALLBACKS = "charges", "receipts"


class Charges(sw.StreamWorker):
    """Charges one item: fails (to the dead letters) when told to; returns the amount."""

    stream = CHILDREN
    group = "billing"
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.02
    max_deliveries = 2

    async def handle(self, msg: sw.Message) -> int:
        if msg.payload.get("fail"):
            raise ValueError(f"card declined for item {msg.payload['item']}")
        return int(msg.payload["amount"])


class Receipts(sw.StreamWorker):
    """The callback: records what it saw of the join."""

    stream = CALLBACKS
    group = "mail"
    read_block = 0.05

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[str, Any, tuple[sw.JoinChild, ...]]] = []

    async def handle(self, msg: sw.Message) -> None:
        self.seen.append((msg.key, msg.payload, await msg.join_results()))


async def test_the_callback_runs_once_after_all_children_with_their_outcomes(
        redis_url: str, r: redis.Redis) -> None:
    with sw.Producer.from_url(redis_url) as p:
        key = p.send_join([sw.Job(CHILDREN, {"item": i, "amount": 100 * i}) for i in range(3)],
                          then=sw.Job(CALLBACKS, {"order": 7}, key="receipt-7"))
        assert key == "receipt-7"
        st = p.join_status(CALLBACKS, key)
        assert (st.state, st.total, st.done, st.failed, st.pending) == ("open", 3, 0, 0, 3)
        receipts = Receipts.from_url(redis_url)
        await run_until_idle(receipts, r)
        assert receipts.seen == []  # nothing to run before the children end
        await run_until_idle(Charges.from_url(redis_url), r)
        st = p.join_status(CALLBACKS, key, results=True)
        assert (st.state, st.done, st.failed, st.pending) == ("fired", 3, 0, 0)
        assert [c.result for c in st.results] == [0, 100, 200]
        receipts = Receipts.from_url(redis_url)
        await run_until_idle(receipts, r)
    [(ran_key, payload, results)] = receipts.seen
    assert ran_key == "receipt-7" and payload == {"order": 7}
    assert [(c.index, c.key, c.state, c.result) for c in results] == [
        (0, "receipt-7:0", "done", 0), (1, "receipt-7:1", "done", 100),
        (2, "receipt-7:2", "done", 200)]


async def test_a_failed_child_is_handed_to_the_callback_or_dead_letters_it(
        redis_url: str, r: redis.Redis) -> None:
    with sw.Producer.from_url(redis_url) as p:
        p.send_join([sw.Job(CHILDREN, {"item": 1, "amount": 5}),
                     sw.Job(CHILDREN, {"item": 2, "amount": 6, "fail": True})],
                    then=sw.Job(CALLBACKS, {"order": 8}), key="run-8")
        p.send_join([sw.Job(CHILDREN, {"item": 3, "amount": 7, "fail": True})],
                    then=sw.Job(CALLBACKS, {"order": 9}), key="dead-9", on_failure="dead")
        await run_until_idle(Charges.from_url(redis_url), r)
        receipts = Receipts.from_url(redis_url)
        await run_until_idle(receipts, r)
        dead = p.join_status(CALLBACKS, "dead-9")
        assert (dead.state, dead.failed) == ("dead", 1) and dead.dead_letter_id
    [(key, _, results)] = receipts.seen
    assert key == "run-8"
    assert [c.state for c in results] == ["done", "dead"]
    assert "card declined for item 2" in results[1].error and not results[1].ok
    [letter] = r.xrange(StreamKeys.for_stream(CALLBACKS).dead)
    assert letter[1][b"reason"] == b"join_failed"


class FlakyReceipts(Receipts):
    """A callback that fails its first attempt: retried, its join results read again."""

    stream = CALLBACKS
    retry_delay = 0.01
    retry_max_delay = 0.02

    async def handle(self, msg: sw.Message) -> None:
        results = await msg.join_results()
        if msg.attempt == 1:
            raise RuntimeError("mail server down")
        self.seen.append((msg.key, msg.payload, results))


async def test_cancelled_duplicate_expired_children_and_a_join_of_one(
        redis_url: str, r: redis.Redis) -> None:
    """A child cancelled before it ran, one whose key had run already (a duplicate: its
    done record's result counts), one that expired, and a join of a single child: every
    callback runs once with each child's outcome; a callback that fails is retried and
    sees the same results."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(CHILDREN, {"item": 0, "amount": 42}, key="ran-before")
        await run_until_idle(Charges.from_url(redis_url), r)
        p.pause(CHILDREN, "billing")
        p.send_join([sw.Job(CHILDREN, {"item": 1, "amount": 1}, key="to-cancel"),
                     sw.Job(CHILDREN, {"item": 2, "amount": 2}, key="ran-before"),
                     sw.Job(CHILDREN, {"item": 3, "amount": 3}, key="late", expires=0.2),
                     sw.Job(CHILDREN, {"item": 4, "amount": 4})],
                    then=sw.Job(CALLBACKS, {"order": 10}), key="mixed")
        p.send_join([sw.Job(CHILDREN, {"item": 5, "amount": 5})],
                    then=sw.Job(CALLBACKS, {"order": 11}), key="single")
        assert p.cancel(CHILDREN, "to-cancel", group="billing") == "unknown"
        await asyncio.sleep(0.3)  # the expiry passes while the group is paused
        p.resume(CHILDREN, "billing")
        await run_until_idle(Charges.from_url(redis_url), r)
        receipts = FlakyReceipts.from_url(redis_url)
        await run_until_idle(receipts, r)
        assert p.join_status(CALLBACKS, "mixed").state == "fired"
    seen = {key: results for key, _, results in receipts.seen}
    assert sorted(seen) == ["mixed", "single"] and len(receipts.seen) == 2
    mixed = [(c.key, c.state, c.result) for c in seen["mixed"]]
    assert mixed == [("to-cancel", "cancelled", None), ("ran-before", "done", 42),
                     ("late", "expired", None), ("mixed:3", "done", 4)]
    assert [(c.state, c.result) for c in seen["single"]] == [("done", 5)]


async def test_bad_joins_are_refused_and_a_resend_runs_once(redis_url: str,
                                                          r: redis.Redis) -> None:
    with sw.Producer.from_url(redis_url) as p:
        with pytest.raises(sw.ConfigError, match=r"non-empty list of sw\.Job"):
            p.send_join([], then=sw.Job(CALLBACKS, {}))
        with pytest.raises(sw.ConfigError, match="on_failure"):
            p.send_join([sw.Job(CHILDREN, {})], then=sw.Job(CALLBACKS, {}), on_failure="skip")
        with pytest.raises(sw.ConfigError, match="cannot be delayed"):
            p.send_join([sw.Job(CHILDREN, {})], then=sw.Job(CALLBACKS, {}, delay=5))
        with pytest.raises(sw.ConfigError, match=r"not a job option|unknown|retries"):
            p.send_join([sw.Job(CHILDREN, {}, retries=3)], then=sw.Job(CALLBACKS, {}))
        one = [sw.Job(CHILDREN, {"item": 0, "amount": 1})]
        p.send_join(one, then=sw.Job(CALLBACKS, {}), key="taken")
        p.send_join(one, then=sw.Job(CALLBACKS, {}), key="taken")  # again
        with pytest.raises(sw.ConfigError, match=r"in use by a join of 1 children"):
            p.send_join([sw.Job(CHILDREN, {}), sw.Job(CHILDREN, {})],
                        then=sw.Job(CALLBACKS, {}), key="taken")
        assert r.xlen(CHILDREN) == 2  # the resend sent its child again, with the same key
        await run_until_idle(Charges.from_url(redis_url), r)
        receipts = Receipts.from_url(redis_url)
        await run_until_idle(receipts, r)
        st = p.join_status(CALLBACKS, "taken", results=True)
    assert (st.state, st.done, len(st.results)) == ("fired", 1, 1)
    assert [key for key, _, _ in receipts.seen] == ["taken"]  # once


def _calls(r: redis.Redis) -> int:
    """Every command the server ran so far, those scripts ran included."""
    return sum(int(v["calls"]) for k, v in r.info("commandstats").items()
               if k.startswith("cmdstat_"))


async def _run_all(url: str, r: redis.Redis) -> None:
    await run_until_idle(Charges.from_url(url), r)
    await run_until_idle(Receipts.from_url(url), r)


async def test_a_join_costs_a_constant_number_of_commands_per_child(
        make_server: Any) -> None:
    """Commands the server ran, per child, for 1,000 plain jobs, for 100 joins of 10 and
    for one join of 1,000 (sent and run): a join adds a few commands a child, the same
    however large it is."""
    server = make_server()
    r = redis.Redis.from_url(server.url)
    per_child = {}
    with sw.Producer.from_url(server.url) as p:
        for name, send in (
                ("plain", lambda: p.send_many(CHILDREN, [{"item": i, "amount": i}
                                                         for i in range(1000)])),
                ("joins of 10", lambda: [p.send_join(
                    [sw.Job(CHILDREN, {"item": i, "amount": i}) for i in range(10)],
                    then=sw.Job(CALLBACKS, {})) for _ in range(100)]),
                ("a join of 1,000", lambda: p.send_join(
                    [sw.Job(CHILDREN, {"item": i, "amount": i}) for i in range(1000)],
                    then=sw.Job(CALLBACKS, {})))):
            before = _calls(r)
            send()
            await _run_all(server.url, r)
            per_child[name] = (_calls(r) - before) / 1000
    print(f"\nRedis commands per child, sent and run: {per_child}")
    added_10 = per_child["joins of 10"] - per_child["plain"]
    added_1000 = per_child["a join of 1,000"] - per_child["plain"]
    assert added_1000 <= 8, per_child  # HSETNX, HINCRBY, 2 PEXPIRE, HMGET, and the rest
    assert added_1000 <= max(added_10, 1) * 1.5 + 1, per_child  # not growing with N
    r.close()


class Orders(sw.StreamWorker):
    """Sends a join from a handler (its first attempt fails after sending: dropped)."""

    stream = "orders"
    group = "shop"
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.02

    async def handle(self, msg: sw.Message) -> str:
        key = msg.send_join([sw.Job(CHILDREN, {"item": i, "amount": 10 + i})
                             for i in range(3)], then=sw.Job(CALLBACKS, {"order": msg.key}))
        if msg.attempt == 1:
            raise RuntimeError("the shop database hiccupped")
        return key


async def test_a_join_sent_from_a_handler_goes_with_its_completion(
        redis_url: str, r: redis.Redis) -> None:
    """msg.send_join: nothing of a failed attempt's join is sent; the retry's join (the
    same key, derived from the job's) runs its callback once."""
    with sw.Producer.from_url(redis_url) as p:
        p.send("orders", {}, key="o-1")
        await run_until_idle(Orders.from_url(redis_url), r)
        key = p.result("orders", "o-1", group="shop", timeout=10)
        assert r.xlen(CHILDREN) == 3  # one attempt's children only
        await run_until_idle(Charges.from_url(redis_url), r)
        receipts = Receipts.from_url(redis_url)
        await run_until_idle(receipts, r)
        assert p.join_status(CALLBACKS, key).state == "fired"
    [(ran, payload, results)] = receipts.seen
    assert ran == key and payload == {"order": "o-1"}
    assert [c.result for c in results] == [10, 11, 12]


async def test_streamwork_job_and_the_test_message_know_joins(redis_url: str,
                                                             r: redis.Redis) -> None:
    """``streamwork job`` shows a join beside its callback's status (text and --json); a
    test message records the joins a handler sends and answers join_results as told."""
    import json

    from click.testing import CliRunner

    from streamwork._cli.main import main
    from streamwork.testing import message

    with sw.Producer.from_url(redis_url) as p:
        p.send_join([sw.Job(CHILDREN, {"item": i, "amount": i}) for i in range(2)],
                    then=sw.Job(CALLBACKS, {}), key="shown")
    out = CliRunner().invoke(main, ["job", CALLBACKS, "shown", "--url", redis_url,
                                    "--group", "mail"])
    assert out.exit_code == 0, out.output
    assert "open: 2 children, 0 done, 0 failed, 2 pending (on_failure=run)" in out.output
    await run_until_idle(Charges.from_url(redis_url), r)
    got = CliRunner().invoke(main, ["job", CALLBACKS, "shown", "--url", redis_url,
                                    "--group", "mail", "--json"])
    assert json.loads(got.output)["join"] == {"state": "fired", "total": 2, "done": 2,
                                              "failed": 0, "pending": 0, "policy": "run"}

    msg = message({"items": [1, 2]}, key="order-1", stream="orders", group="shop")
    sent = msg.send_join([sw.Job(CHILDREN, {"item": 1})], then=sw.Job(CALLBACKS, {}))
    assert msg.joins[0].key == sent and msg.joins[0].on_failure == "run"
    with pytest.raises(sw.ConfigError, match="on_failure"):
        msg.send_join([sw.Job(CHILDREN, {})], then=sw.Job(CALLBACKS, {}), on_failure="x")
    cb = message({}, join_results=[sw.JoinChild(0, "a", "done", 5)])
    assert [c.result for c in await cb.join_results()] == [5]
    with pytest.raises(sw.ConfigError, match="not the callback of a join"):
        await message({}).join_results()


async def test_a_join_entry_redis_refuses_for_good_does_not_stop_the_outbox_drain(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """An outbox entry opening a join whose key is another type (WRONGTYPE, for good) is
    logged and dropped; the drain goes on and moves the entries beside it."""
    from streamwork._worker.config import WorkerConfig
    from streamwork._worker.features.chain_outbox import Drainer

    cb = StreamKeys.for_stream(CALLBACKS)
    r.set(cb.join("broken"), "not a hash")
    outbox = StreamKeys.for_stream(CHILDREN).outbox
    r.xadd(outbox, {"k": "open", "t": CALLBACKS, "j": "broken", "n": "1", "p": "run",
                    "o": CALLBACKS, "d": b"body", "l": "60000"})
    r.xadd(outbox, {"k": "join", "t": CALLBACKS, "j": "fine", "i": "0", "s": "done",
                    "v": b"\x93\xa4done\xa1k\x01", "l": "60000"})
    drainer = Drainer(WorkerConfig(stream=CHILDREN, group="billing"), redis_url, "d")
    try:
        assert await drainer.drain(CHILDREN) == 2
    finally:
        await drainer.redis.aclose()
    assert r.xlen(outbox) == 0
    assert r.hget(cb.join("fine"), "done") == b"1"  # the report beside it was recorded
    assert any("join outbox entries dropped" in rec.getMessage() and "WRONGTYPE"
               in rec.getMessage() for rec in caplog.records)
