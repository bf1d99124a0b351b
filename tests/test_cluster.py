"""Redis Cluster end to end: a local 3-master cluster, streams on different masters,
dedup on, retries, staged writes under the stream's hash tag (RELIABILITY fault class 19)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.cluster

import streamwork as sw
from streamwork.keys import StreamKeys
from streamwork.server import RedisServer, find_server_binary, free_port
from streamwork.testing import run_until_idle, wait_for
from tests.conftest import no_server


def _cli() -> str | None:
    """redis-cli (or the valkey-cli beside the server binary) to create the cluster."""
    sibling = Path(find_server_binary()).with_name("valkey-cli")
    return shutil.which("redis-cli") or (str(sibling) if sibling.exists() else None)


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
    cli = _cli()
    if cli is None:
        no_server("no redis-cli/valkey-cli to create a cluster with")
    servers: list[RedisServer] = []
    for _ in range(3):
        port = free_port()
        servers.append(make_server(port=port, extra_args=[
            "--cluster-enabled", "yes", "--cluster-port", str(free_port()),
            "--cluster-config-file", f"nodes-{port}.conf"]))
    made = subprocess.run(
        [cli, "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
         "--cluster-yes"], capture_output=True, text=True, timeout=60, env=os.environ)
    assert made.returncode == 0, made.stdout + made.stderr
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=servers[0].port)
    wait_for(lambda: client.cluster_info()["cluster_state"] == "ok", 20,
             message="the cluster to be ok")
    yield client
    client.close()


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
