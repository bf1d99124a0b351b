"""Job chains on Redis Cluster: a job sent to a stream in another slot goes through the
sending stream's outbox (written with the completion) and is moved to its target once,
even when a drainer dies between moving entries and deleting them; a target in the
sending stream's own slot is written directly. Then the charge -> receipt -> ledger chain
with its three streams on three masters, under worker SIGKILLs."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import msgpack
import pytest
import redis.cluster
from redis.crc import key_slot

import streamwork as sw
from streamwork._redis import scripts
from streamwork._wire.codec import BODY_FIELD
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names, partition_of
from streamwork._worker.config import WorkerConfig
from streamwork._worker.features.chain_outbox import Drainer
from streamwork._worker.features.chains import BODY, DUE, MAXLEN, TARGET
from streamwork.testing import await_for, stream_idle, wait_for
from tests.helpers.cluster_util import LocalCluster, local_cluster
from tests.workers.chains import CHARGE, LEDGER, RECEIPT, effects, runs

pytestmark = pytest.mark.cluster

STEPS = (CHARGE, RECEIPT, LEDGER)
INVOICES = "invoices"
TARGETS = ("tests.workers.chains:Charge", "tests.workers.chains:Receipt",
           "tests.workers.chains:Ledger")


@pytest.fixture(name="formed")
def _formed(make_server: Any) -> Iterator[LocalCluster]:
    """3 masters, yielded once every node agrees the cluster is whole (cluster_util)."""
    with local_cluster(make_server, masters=3) as cluster:
        yield cluster


def _masters(c: redis.cluster.RedisCluster, *keys: str) -> set[str]:
    return {c.get_node_from_key(k).name for k in keys}


class Sender(sw.StreamWorker):
    """Sends one job to CHARGE's neighbour in its own slot, one to RECEIPT and one delayed
    to LEDGER (other slots)."""

    stream = CHARGE
    group = "chain"
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> None:
        msg.send("{" + CHARGE + "}:audit", {"order": msg.key})
        msg.send(RECEIPT, {"order": msg.key}, key="r-" + msg.key, maxlen=10_000)
        msg.send(LEDGER, {"order": msg.key}, delay=3600)


async def test_other_slots_go_through_the_outbox(formed: LocalCluster) -> None:
    """A job sent to another slot reaches it once through the outbox (left empty, even by
    a worker stopped right after its last job); one sent within the slot is written
    directly; the target's chained mark is set."""
    c = formed.client
    assert len(_masters(c, CHARGE, RECEIPT)) == 2
    with sw.Producer.from_url(formed.url) as producer:
        producer.send_many(CHARGE, [{}] * 20, keys=[f"o-{i}" for i in range(20)])
    worker = Sender.from_url(formed.url)
    task = asyncio.create_task(worker.serve())
    await await_for(lambda: stream_idle(c, CHARGE, "chain"), 60,
                    message="every job completed")
    worker.stop()  # what is still in the outbox is moved by the stopping worker
    await task
    assert c.xlen(StreamKeys.for_stream(CHARGE).outbox) == 0
    keys = sorted(msgpack.unpackb(f[BODY_FIELD])["k"] for _, f in c.xrange(RECEIPT))
    assert keys == sorted(f"r-o-{i}" for i in range(20))
    assert c.xlen("{" + CHARGE + "}:audit") == 20
    assert c.zcard(StreamKeys.for_stream(LEDGER).delayed) == 20  # due in an hour
    assert worker.counts["staged_rejected"] == 0
    assert c.get(StreamKeys.for_stream(RECEIPT).chained(CHARGE)) is not None


class ToPartitions(sw.StreamWorker):
    """Sends two jobs per job to INVOICES, a stream split into 3 partitions (one per
    master): those in other slots than CHARGE's go through its outbox."""

    stream = CHARGE
    group = "chain"
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> None:
        msg.send_many(INVOICES, [{}, {}], keys=[f"{msg.key}-a", f"{msg.key}-b"])


class Invoiced(sw.StreamWorker):
    """INVOICES' partitioned worker: a ledger of the keys it ran."""

    stream = INVOICES
    group = "books"
    read_block = 0.1
    ran: ClassVar[Counter[str]] = Counter()

    async def handle(self, msg: sw.Message) -> None:
        type(self).ran[msg.key] += 1


async def test_a_partitioned_target_across_slots(formed: LocalCluster) -> None:
    """A handler's jobs to a partitioned stream reach the partition Producer.send picks
    (through the outbox for those in other slots) and its partitioned worker runs each
    once."""
    c = formed.client
    names = partition_names(INVOICES, 3)
    assert len(_masters(c, *names)) == 3
    Invoiced.ran = Counter()
    target = Invoiced.from_url(formed.url, partitions=3)
    served = asyncio.create_task(target.serve())
    await await_for(lambda: c.get(StreamKeys.for_stream(INVOICES).partitions), 60,
                    message="the partitioned worker to record its count")
    keys = [f"o-{i}" for i in range(30)]
    with sw.Producer.from_url(formed.url) as producer:
        producer.send_many(CHARGE, [{}] * len(keys), keys=keys)
    worker = ToPartitions.from_url(formed.url)
    task = asyncio.create_task(worker.serve())
    want = {f"{k}-{x}": 1 for k in keys for x in "ab"}
    await await_for(lambda: Invoiced.ran == want or sum(Invoiced.ran.values()) > len(want),
                    90, message="every chained job served")
    worker.stop()
    target.stop()
    await asyncio.gather(task, served)
    assert Invoiced.ran == want
    for i, name in enumerate(names):  # where Producer.send would have put each
        for _, f in c.xrange(name):
            assert partition_of(msgpack.unpackb(f[BODY_FIELD])["k"], 3) == i
    assert not c.exists(INVOICES)
    assert c.xlen(StreamKeys.for_stream(CHARGE).outbox) == 0
    other = [n for n in names if key_slot(n.encode()) != key_slot(CHARGE.encode())]
    assert other and all(c.get(StreamKeys.for_stream(n).chained(CHARGE)) for n in other)
    assert worker.counts["produced"] == len(want)


async def test_a_drain_cut_short_is_not_repeated(formed: LocalCluster) -> None:
    """Entries moved to their target by a drainer that died before deleting them (and a
    second drainer racing it) are moved once: the chained mark skips them."""
    c = formed.client
    outbox = StreamKeys.for_stream(CHARGE).outbox
    target = StreamKeys.for_stream(RECEIPT)
    for i in range(10):
        c.xadd(outbox, {TARGET: RECEIPT.encode(), BODY: f"body-{i}".encode(), MAXLEN: b"",
                        DUE: b""})
    rows = [[e, f[BODY], b"", b""] for e, f in c.xrange(outbox)]
    runner = scripts.SyncScripts(c)
    assert runner.run(scripts.chain(target, CHARGE, rows[:6])) == [6, 0]  # then it "died"
    cfg = WorkerConfig(stream=CHARGE, group="chain")
    drainers = [Drainer(cfg, formed.url, f"d{i}") for i in range(2)]
    await asyncio.gather(*(d.drain(CHARGE) for d in drainers))
    assert sum(d.moved for d in drainers) == 4
    assert [f[BODY_FIELD] for _, f in c.xrange(RECEIPT)] == [
        f"body-{i}".encode() for i in range(10)]
    assert c.xlen(outbox) == 0
    for d in drainers:
        await d.redis.aclose()


def _chaos(formed: LocalCluster, spawn_worker: Callable[..., subprocess.Popen[bytes]],
           chains: int, kills: int, every: float, seed: int) -> dict[str, Any]:
    c, rnd = formed.client, random.Random(seed)
    assert len(_masters(c, *STEPS)) == 3, "the steps' streams should be on three masters"
    ids = [f"c-{i}" for i in range(chains)]
    with sw.Producer.from_url(formed.url) as producer:
        producer.send_many(CHARGE, [{"chain": i, "sleep": rnd.uniform(0.03, 0.1)} for i in ids],
                           keys=ids)

    def spawn() -> subprocess.Popen[bytes]:
        return spawn_worker(TARGETS[0], formed.url, *TARGETS[1:])

    procs = [spawn() for _ in range(3)]
    wait_for(lambda: c.hlen(effects(CHARGE)) > 0, 60, interval=0.05,
             message="the first charge to take effect")
    busy = 0
    for _ in range(kills):
        time.sleep(every * rnd.uniform(0.7, 1.3))  # pacing of the faults, not a check
        busy += int(c.hlen(effects(LEDGER)) < chains)
        victim = rnd.randrange(len(procs))
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait()
        procs[victim] = spawn()
    wait_for(lambda: c.hlen(effects(LEDGER)) >= chains
             and all(stream_idle(c, s, "chain") for s in STEPS), 120, interval=0.1,
             message="every chain to complete after the kills")
    reruns = {s: sum(int(v) for v in c.hvals(runs(s))) - chains for s in STEPS}
    figures = {"chains": chains, "kills": kills, "kills_while_busy": busy, "reruns": reruns}
    print(f"\nchain chaos on a cluster: {figures}")
    for step in STEPS:
        counts = {k.decode(): int(v) for k, v in c.hgetall(effects(step)).items()}
        assert sorted(counts) == sorted(ids), f"{step}: chains missing"
        assert set(counts.values()) == {1}, f"{step}: an effect applied more than once"
        assert c.xlen(step) == chains, f"{step}: {c.xlen(step)} jobs for {chains} chains"
        assert c.xlen(StreamKeys.for_stream(step).outbox) == 0
        assert c.xlen(StreamKeys.for_stream(step).dead) == 0
    # every send crossed slots: through the outbox, each target's mark moved
    assert c.get(StreamKeys.for_stream(RECEIPT).chained(CHARGE)) is not None
    assert c.get(StreamKeys.for_stream(LEDGER).chained(RECEIPT)) is not None
    for proc in procs:
        assert proc.poll() is None, "a worker that was not killed died on its own"
    return figures


@pytest.mark.timeout(240)
def test_chain_on_three_masters_survives_sigkills(
        formed: LocalCluster, spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """300 chains, their steps on three masters (every send through an outbox), 6 worker
    SIGKILLs: every chain completes, each step took effect once, one job per chain and
    step, every outbox empty."""
    _chaos(formed, spawn_worker, chains=300, kills=6, every=0.6, seed=3)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("STREAMWORK_SOAK"), reason="set STREAMWORK_SOAK=1")
@pytest.mark.timeout(900)
def test_chain_on_three_masters_soak(
        formed: LocalCluster, spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """Soak: 3000 chains on three masters, 25 SIGKILLs: every step once."""
    _chaos(formed, spawn_worker, chains=3000, kills=25, every=1.0, seed=17)


async def test_a_target_that_is_not_a_stream_is_logged_and_dropped(
        formed: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    """An outbox entry whose target holds another type is dropped with an error logged (as
    a rejected staged write is), and the drain goes on with the other targets."""
    c = formed.client
    c.hset(RECEIPT, "x", 1)
    outbox = StreamKeys.for_stream(CHARGE).outbox
    for target in (RECEIPT, LEDGER):
        c.xadd(outbox, {TARGET: target.encode(), BODY: b"body", MAXLEN: b"", DUE: b""})
    drainer = Drainer(WorkerConfig(stream=CHARGE, group="chain"), formed.url, "d")
    assert await drainer.drain(CHARGE) == 2
    await drainer.redis.aclose()
    assert c.xlen(outbox) == 0 and c.xlen(LEDGER) == 1
    assert any("not a stream" in rec.getMessage() for rec in caplog.records)
