"""A worker pointed at a Redis Cluster whose seed node does not answer waits for it, as a
worker pointed at a single server that does not answer does, instead of exiting at start.

redis-py reports it as ``RedisClusterException("Redis Cluster cannot be connected ...")``,
which is no ``ConnectionError``: the worker took it for a fatal error, so a worker
(re)started while the node its URL names was down (during a failover) exited at once.
Found by the nemesis campaign on a cluster (tests/faults/test_nemesis_cluster.py).
"""

from __future__ import annotations

import asyncio

import pytest

from streamwork._redis.faults import Fault, classify
from streamwork._redis.server import free_port
from streamwork.testing import await_for
from tests.workers.ledger import LedgerWorker


@pytest.mark.parametrize("partitions", [1, 3])
async def test_worker_waits_for_an_unreachable_cluster_seed(partitions: int) -> None:
    w = LedgerWorker.from_url(f"redis+cluster://127.0.0.1:{free_port()}",
                              partitions=partitions)
    task = asyncio.create_task(w.serve())

    def backing_off() -> bool:  # it met the unreachable seed and waits to try again
        if task.done():
            return True  # before the fix: the worker failed at once
        if w._partitioned is not None:
            sup = w._partitioned.start_sup
            return sup is not None and sup.failures > 0
        return w._consumer is not None and w._consumer.sup.failures > 0

    try:
        await await_for(backing_off, timeout=15, message="the worker to retry the cluster")
        assert not task.done(), f"the worker gave up: {task.exception()!r}"
    finally:
        w.stop()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)


def test_an_unreachable_cluster_is_transient() -> None:
    """What redis-py raises when no node of a cluster answers is an outage to ride out."""
    import redis.cluster
    import redis.exceptions

    with pytest.raises(redis.exceptions.RedisClusterException) as raised:
        redis.cluster.RedisCluster(host="127.0.0.1", port=free_port())
    assert classify(raised.value) is Fault.TRANSIENT
