"""Joins on Redis Cluster: children on one master, their callbacks' stream (and so the
join) on another: each child's end goes through its stream's outbox, written with that
end, and is recorded in the join by a drainer once, however often it is moved; the
callback is sent once, by the last report. Under worker SIGKILLs."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.cluster

from tests.faults.test_join_chaos import join_chaos
from tests.helpers.cluster_util import LocalCluster, local_cluster
from tests.workers.joins import ALBUMS, ITEMS

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
    """300 joins of 10 children (children and callbacks on two masters), 4 SIGKILLs:
    every callback once, after all of its children, with each outcome."""
    c = formed.client
    assert _master(c, ITEMS) != _master(c, ALBUMS), "the test needs two masters"
    join_chaos(formed.url, spawn_worker, joins=300, kills=4, every=1.0, seed=21, r=c)
    # the reports went through the children's outbox: drained (XDEL) on their master
    items_master = c.get_node_from_key(ITEMS)
    stats = c.info("commandstats", target_nodes=items_master)
    assert stats.get("cmdstat_xdel", {}).get("calls", 0) > 0, "no report was drained"
    assert c.xlen("{" + ITEMS + "}:outbox") == 0
