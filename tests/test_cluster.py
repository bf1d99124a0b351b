"""Redis Cluster end to end: a local 3-master cluster, streams on different masters,
dedup on, retries, staged writes under the stream's hash tag (every key a script touches
in one slot)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.cluster

import streamwork as sw
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork.testing import run_until_idle
from tests.helpers.cluster_util import local_cluster
from tests.helpers.ordered_campaign import expected_logs, run_campaign

pytestmark = pytest.mark.cluster


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


class PartitionLedger(sw.StreamWorker):
    """6 partitions; keys ending in 3 fail once, keys ending in 9 are dead-lettered; each
    effect is a staged HINCRBY under the partition's own tag."""

    group = "testers"
    partitions = 6
    read_block = 0.1
    retry_delay = 0.05
    retry_max_delay = 0.5
    visibility_timeout = 2.0

    async def handle(self, msg: sw.Message) -> int:
        if msg.key.endswith("9"):
            raise sw.DeadLetter("nines are refused")
        if msg.attempt == 1 and msg.key.endswith("3"):
            raise RuntimeError("flaky once")
        msg.stage("HINCRBY", [_ledger(msg.stream)], [msg.key, 1])
        return len(msg.key)


async def test_six_partitions_over_three_masters(cluster: redis.cluster.RedisCluster) -> None:
    """A stream split in 6 partitions spread over the 3 masters: every job takes effect once
    (retries included), the refused ones are dead letters of their partitions, and status
    finds a job's record without being told its partition."""
    names = partition_names("payments", 6)
    assert len({cluster.get_node_from_key(n).name for n in names}) == 3
    url = f"redis+cluster://{cluster.get_default_node().name}"
    keys = [f"pay-{i}" for i in range(150)]
    with sw.Producer.from_url(url, partitions=6) as producer:
        producer.send_many("payments", [{}] * len(keys), keys=keys)
        worker = PartitionLedger.from_url(url, stream="payments")
        await run_until_idle(worker, cluster, timeout=90)
        applied: dict[bytes, bytes] = {}
        for name in names:
            applied.update(cluster.hgetall(_ledger(name)))
        good = [k for k in keys if not k.endswith("9")]
        assert sorted(applied) == sorted(k.encode() for k in good)
        assert set(applied.values()) == {b"1"}
        assert worker.counts["retried"] == sum(k.endswith("3") for k in keys)
        dead = sum(cluster.xlen(StreamKeys.for_stream(n).dead) for n in names)
        assert dead == worker.counts["dead_lettered"] == sum(k.endswith("9") for k in keys)
        far = next(k for k in good if partition_of(k, 6) == 5)
        assert producer.result("payments", far, timeout=5) == len(far)
        assert producer.status("payments", "pay-19").state == "dead"


def test_ordered_three_processes_on_the_cluster(cluster: redis.cluster.RedisCluster,
                                                spawn_worker: Any) -> None:
    """Ordered mode over 6 partitions on 3 masters, 3 worker processes, retries and a dead
    letter, one process SIGKILLed mid-run: each order key's effect log is exact and in
    order."""
    url = f"redis+cluster://{cluster.get_default_node().name}"
    out = run_campaign(url, cluster, spawn_worker)
    assert out["logs"] == expected_logs()
    assert out["alive"] == [True, True]
    assert out["dead"] == 1
