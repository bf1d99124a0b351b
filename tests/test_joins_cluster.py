"""Joins on Redis Cluster: children on one master, their callbacks' stream (and so the
join) on another: each child's end goes through its stream's outbox, written with that
end, and is recorded in the join by a drainer once, however often it is moved; the
callback is sent once, by the last report. Under worker SIGKILLs."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.cluster
from redis.crc import key_slot

import streamwork as sw
from streamwork.testing import await_for
from tests.faults.test_join_chaos import join_chaos
from tests.helpers.cluster_util import LocalCluster, local_cluster
from tests.workers.joins import ALBUMS, COVERS, ITEMS, Album, Item, effects, seen

pytestmark = pytest.mark.cluster


@pytest.fixture(name="formed")
def _formed(make_server: Any) -> Iterator[LocalCluster]:
    with local_cluster(make_server, masters=3) as cluster:
        yield cluster


def _master(c: redis.cluster.RedisCluster, key: str) -> str:
    return str(c.get_node_from_key(key).name)


@pytest.mark.timeout(300)
def test_joins_across_masters_run_each_callback_once(
        formed: LocalCluster, spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """300 joins of 10 children (the children on two streams on two masters, the
    callbacks on the third), 4 SIGKILLs: every callback once, after all of its children,
    with each outcome."""
    c = formed.client
    assert len({_master(c, ITEMS), _master(c, COVERS), _master(c, ALBUMS)}) == 3
    join_chaos(formed.url, spawn_worker, joins=300, kills=4, every=1.0, seed=21, r=c,
               spread=True)
    # the reports went through the children's outbox: drained (XDEL) on their master
    items_master = c.get_node_from_key(ITEMS)
    stats = c.info("commandstats", target_nodes=items_master)
    assert stats.get("cmdstat_xdel", {}).get("calls", 0) > 0, "no report was drained"
    assert c.xlen("{" + ITEMS + "}:outbox") == 0


class Shop(sw.StreamWorker):
    """Sends a join from a handler: children and callback in other slots than its own."""

    stream = "orders"
    group = "shop"
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> str:
        return msg.send_join([sw.Job(ITEMS, {"n": n}) for n in range(4)],
                             then=sw.Job(ALBUMS, {"album": msg.key}))


class Children(Item):
    read_block = 0.1


class Callback(Album):
    read_block = 0.1


async def test_a_join_sent_from_a_handler_opens_through_the_outbox(
        formed: LocalCluster) -> None:
    """A handler's join whose callback stream is in another slot is opened by the drain
    (join.lua); its children, in a third slot, report through theirs: one callback each."""
    c = formed.client
    assert key_slot(b"orders") != key_slot(ALBUMS.encode()) != key_slot(ITEMS.encode())
    with sw.Producer.from_url(formed.url) as producer:
        producer.send_many("orders", [{}] * 20, keys=[f"o-{i}" for i in range(20)])
    workers = [Shop.from_url(formed.url), Children.from_url(formed.url),
               Callback.from_url(formed.url)]
    tasks = [asyncio.create_task(w.serve()) for w in workers]
    try:
        await await_for(lambda: c.hlen(effects(ALBUMS)) == 20, 60,
                        message="every join's callback ran")
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
    counts = {k.decode(): int(v) for k, v in c.hgetall(effects(ALBUMS)).items()}
    assert all(n == 1 for n in counts.values()) and len(counts) == 20
    assert {v.decode() for v in c.hvals(seen(ALBUMS))} == {f"4:4:0:{sum(range(4))}"}
