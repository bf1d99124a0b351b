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
    [(key, payload, results)] = receipts.seen
    assert key == "run-8"
    assert [c.state for c in results] == ["done", "dead"]
    assert "card declined for item 2" in results[1].error and not results[1].ok
    [letter] = r.xrange(StreamKeys.for_stream(CALLBACKS).dead)
    assert letter[1][b"reason"] == b"join_failed"
