"""Redis Cluster end to end: a local 3-master cluster, streams on different masters,
dedup on, retries, staged writes under the stream's hash tag (RELIABILITY fault class 19)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.cluster

import streamwork as sw
from streamwork._keys import StreamKeys
from streamwork.testing import run_until_idle
from tests.cluster_util import local_cluster


def _ledger(stream: str) -> str:
    """A ledger key under the stream's hash tag, so staged writes stay in its slot."""
    return StreamKeys.for_stream(stream).prefix + ":ledger"


class ClusterLedger(sw.StreamWorker):
    """Fails keys ending in 7 once; records each effect with a staged HINCRBY."""

    group = "testers"
    read_block = 0.1
    retry_delay = 0.05
    retry_max_delay = 0.5
    visibility_timeout = 2.0

    async def handle(self, msg: sw.Message) -> None:
        if msg.attempt == 1 and msg.key.endswith("7"):
            raise RuntimeError("flaky once")
        msg.stage("HINCRBY", [_ledger(msg.stream)], [msg.key, 1])


@pytest.fixture(name="cluster")
def _cluster(make_server: Any) -> Iterator[redis.cluster.RedisCluster]:
    """3 masters, yielded only once every node agrees the cluster is whole (cluster_util)."""
    with local_cluster(make_server, masters=3) as formed:
        yield formed.client


async def test_streams_on_different_masters_process_once(
    cluster: redis.cluster.RedisCluster,
) -> None:
    """Every job of three streams (on at least two masters) takes effect exactly once,
    retries included, and every script ran without a CROSSSLOT error."""
    streams = ["orders", "mail", "sms"]
    nodes = {cluster.get_node_from_key(s).name for s in streams}
    assert len(nodes) >= 2, "pick stream names that land on different masters"
    url = f"redis+cluster://{cluster.get_default_node().name}"
    producer = sw.Producer.from_url(url)
    for stream in streams:
        producer.send_many(stream, [{}] * 60, keys=[f"{stream}-{i}" for i in range(60)])
    for stream in streams:
        worker = ClusterLedger.from_url(url, stream=stream)
        await run_until_idle(worker, cluster, timeout=60)
        ledger = cluster.hgetall(_ledger(stream))
        assert len(ledger) == 60 and set(ledger.values()) == {b"1"}, (stream, worker)
        assert worker.counts["retried"] == 6
        assert int(cluster.xpending(stream, "testers")["pending"]) == 0
    producer.close()


def test_local_cluster_with_replicas_is_whole(make_server: Any) -> None:
    """cluster_util with replicas: 3 masters with one connected replica each, as the cluster
    itself reports, and a write on each master reaches its replica."""
    with local_cluster(make_server, masters=3, replicas=1, node_timeout_ms=2000) as formed:
        assert len(formed.masters) == 3 and len(formed.replicas) == 3
        for master in formed.masters:
            [replica] = formed.replicas_of[master.port]
            node = formed.client.get_node(host="127.0.0.1", port=master.port)
            key = next(k for i in range(100_000) if formed.client.get_node_from_key(
                k := f"{{r{i}}}") == node)
            formed.client.set(key, "v")
            assert formed.client.wait(1, 5000, target_nodes=node) == 1
            direct = redis.Redis(host="127.0.0.1", port=replica.port)
            try:
                assert direct.info("replication")["role"] == "slave"
                assert direct.execute_command("READONLY") and direct.get(key) == b"v"
            finally:
                direct.close()
