"""Job chains to a partitioned stream: ``msg.send`` puts each job in the partition
`Producer.send` would pick, the target's count read from what Redis records for it (or
given as ``partitions=``); a count it cannot know, or one that differs from the record, is
refused at ``msg.send``. Sent jobs count as ``produced`` once their completion succeeds."""

from __future__ import annotations

import asyncio
import collections
import zlib
from typing import Any, ClassVar

import msgpack
import pytest
import redis

import streamwork as sw
from streamwork._redis.server import free_port
from streamwork._wire.codec import BODY_FIELD
from streamwork._wire.keys import StreamKeys
from streamwork._wire.message import Message
from streamwork._wire.partitions import partition_names
from streamwork._worker.config import WorkerConfig
from streamwork._worker.features.chains import ChainSender
from streamwork.errors import ConfigError
from streamwork.testing import await_for, run_until_idle

SOURCE, TARGET, GROUP = "orders", "invoices", "billing"
PARTS = 4


def _placed(r: redis.Redis, stream: str, count: int) -> dict[str, list[int]]:
    """job key -> the partitions (0-based) holding an entry of it, one per entry."""
    found: dict[str, list[int]] = collections.defaultdict(list)
    for i, name in enumerate(partition_names(stream, count)):
        for _, fields in r.xrange(name):
            found[msgpack.unpackb(fields[BODY_FIELD], raw=False)["k"]].append(i)
    return found


class Fanout(sw.StreamWorker):
    """Sends ``n`` jobs to TARGET keyed ``<job key>-<i>`` (order keys ``ok``, partition
    count ``partitions`` when the payload gives them); an error at msg.send is kept."""

    stream = SOURCE
    group = GROUP
    concurrency = 4
    read_block = 0.1
    retry_delay = 0.05
    max_deliveries = 1
    errors: ClassVar[list[BaseException]] = []

    async def handle(self, msg: sw.Message) -> None:
        p = msg.payload
        keys = [f"{msg.key}-{i}" for i in range(p.get("n", 1))]
        try:
            msg.send_many(TARGET, [{"i": i} for i in range(len(keys))], keys=keys,
                          order_keys=p.get("ok"), partitions=p.get("partitions"))
        except ConfigError as exc:
            type(self).errors.append(exc)
            raise


class SyncFanout(Fanout):
    """Fanout as a plain def (its msg.send runs in the worker's thread pool)."""

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        p = msg.payload
        keys = [f"{msg.key}-{i}" for i in range(p.get("n", 1))]
        try:
            msg.send_many(TARGET, [{"i": i} for i in range(len(keys))], keys=keys,
                          order_keys=p.get("ok"), partitions=p.get("partitions"))
        except ConfigError as exc:
            type(self).errors.append(exc)
            raise


class Served(sw.StreamWorker):
    """The partitioned target's worker: a ledger of the keys it ran."""

    stream = TARGET
    group = "books"
    concurrency = 4
    read_block = 0.1
    ran: ClassVar[collections.Counter[str]] = collections.Counter()

    async def handle(self, msg: sw.Message) -> None:
        type(self).ran[msg.key] += 1


async def test_jobs_go_to_the_partition_producer_send_picks(
        redis_url: str, r: redis.Redis) -> None:
    """With the count recorded by a Producer(partitions=4), a handler's sends of the
    producer's own keys (and order keys) land in the very partitions the producer's did;
    a partitioned worker serves every one exactly once."""
    keys = [f"o-{n}" for n in range(20)]
    with sw.Producer.from_url(redis_url, partitions={TARGET: PARTS}) as producer:
        for k in keys:  # the producer's own copies, keyed as the handler's will be
            producer.send_many(TARGET, [{"i": 0}, {"i": 1}], keys=[f"{k}-0", f"{k}-1"],
                               order_keys=[f"{k}-0", "shared"])
    assert r.get(StreamKeys.for_stream(TARGET).partitions) == str(PARTS).encode()
    with sw.Producer.from_url(redis_url) as producer:
        producer.send_many(SOURCE, [{"n": 2, "ok": [f"{k}-0", "shared"]} for k in keys],
                           keys=keys)
    Fanout.errors = []
    await run_until_idle(Fanout.from_url(redis_url), r)
    assert not Fanout.errors
    assert not r.exists(TARGET)  # nothing on the base stream no partitioned worker reads
    placed = _placed(r, TARGET, PARTS)
    assert len(placed) == 2 * len(keys)
    # each key twice (the producer's copy and the handler's), both in one partition
    assert all(len(at) == 2 and at[0] == at[1] for at in placed.values()), placed
    assert len({at[0] for at in placed.values()}) > 1  # they did spread
    assert len({placed[f"{k}-1"][0] for k in keys}) == 1  # one order key, one partition
    Served.ran = collections.Counter()
    # dedup off: both copies of a key run, each once (nothing lost, none twice)
    await run_until_idle(Served.from_url(redis_url, partitions=PARTS, dedup=False), r)
    assert Served.ran == {k: 2 for k in placed}


async def test_a_partitioned_worker_records_the_count_msg_send_reads(
        redis_url: str, r: redis.Redis) -> None:
    """The count a partitioned worker recorded is enough: jobs sent from a handler are
    served by that worker exactly once, and the sender counts them as produced."""
    Served.ran = collections.Counter()
    target = Served.from_url(redis_url, partitions=PARTS)
    task = asyncio.create_task(target.serve())
    await await_for(lambda: r.get(StreamKeys.for_stream(TARGET).partitions),
                    message="the partitioned worker to record its count")
    with sw.Producer.from_url(redis_url) as producer:
        producer.send_many(SOURCE, [{"n": 3}] * 10, keys=[f"o-{n}" for n in range(10)])
    sender = Fanout.from_url(redis_url)
    Fanout.errors = []
    await run_until_idle(sender, r)
    await await_for(lambda: sum(Served.ran.values()) >= 30, message="30 chained jobs served")
    target.stop()
    await task
    assert not Fanout.errors
    assert Served.ran == {f"o-{n}-{i}": 1 for n in range(10) for i in range(3)}
    assert sender.counts["produced"] == 30
    assert not r.exists(TARGET)


async def test_an_unrecorded_target_is_not_partitioned_unless_told(
        redis_url: str, r: redis.Redis) -> None:
    """No count recorded: the base stream, as a Producer without partitions sends; with
    partitions= the count is recorded (as a Producer(partitions=) does) and used."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {"n": 2}, key="plain")
    await run_until_idle(Fanout.from_url(redis_url), r)
    assert r.xlen(TARGET) == 2
    r.delete(TARGET)
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {"n": 8, "partitions": PARTS}, key="told")
    await run_until_idle(Fanout.from_url(redis_url), r)
    assert r.get(StreamKeys.for_stream(TARGET).partitions) == str(PARTS).encode()
    assert not r.exists(TARGET)
    assert sorted(_placed(r, TARGET, PARTS)) == sorted(f"told-{i}" for i in range(8))


@pytest.mark.parametrize(("recorded", "given", "says"), [
    (b"4", 2, "split into 4 partitions"),
    (b"4", 1, "split into 4 partitions"),
    (b"lots", None, "not a count msg.send can route by"),
])
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_count_that_cannot_be_right_is_refused_at_send(
        redis_url: str, r: redis.Redis, recorded: bytes, given: int | None,
        says: str, kind: str) -> None:
    """A partitions= that differs from the record, or a record that is not a count: nothing
    is sent and the job is dead-lettered with a ConfigError saying so. A plain def
    handler's msg.send asks Redis and raises at once; an async def one's does not ask (no
    round trip on the event loop): the worker finds it before writing the completion."""
    r.set(StreamKeys.for_stream(TARGET).partitions, recorded)
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {"n": 2, "partitions": given}, key="o-1")
    Fanout.errors = []
    worker = (Fanout if kind == "async" else SyncFanout).from_url(redis_url)
    await run_until_idle(worker, r)
    if kind == "sync":
        assert len(Fanout.errors) == 1 and says in str(Fanout.errors[0]), Fanout.errors
    else:
        assert Fanout.errors == []
    [(_, dead)] = r.xrange(StreamKeys.for_stream(SOURCE).dead)
    assert dead[b"error_type"] == b"ConfigError" and says.encode() in dead[b"detail"]
    assert worker.counts["dead_lettered"] == 1
    assert worker.counts["produced"] == 0
    assert not any(r.exists(s) for s in (TARGET, *partition_names(TARGET, PARTS)))


def test_redis_that_cannot_be_asked_refuses_the_send() -> None:
    """Nothing listens at the worker's URL: msg.send cannot learn the target's count and
    raises ConfigError saying so, staging nothing (rather than guess the base stream)."""
    cfg = WorkerConfig(stream=SOURCE, group=GROUP)
    msg: Message[Any] = Message("1-0", SOURCE, "o-1", {}, 1, 0.0, {}, None, GROUP, "c",
                                _sender=ChainSender(cfg, None, False,
                                                    f"redis://127.0.0.1:{free_port()}"))
    with pytest.raises(ConfigError, match="could not read how many partitions"):
        msg.send(TARGET, {"i": 0})
    assert msg.staged == [] and msg._sent_to == {}


def _message(sender: ChainSender, key: str = "o-1") -> Message[Any]:
    return Message("1-0", SOURCE, key, {}, 1, 0.0, {}, None, GROUP, "c", _sender=sender)


def test_a_count_given_after_an_unrecorded_send_is_recorded_then(
        redis_url: str, r: redis.Redis) -> None:
    """A sender that found nothing recorded, then is given partitions=4, records 4 (it
    does not hold on to "not partitioned") and routes by it from then on; a different
    count given later is refused."""
    sender = ChainSender(WorkerConfig(stream=SOURCE, group=GROUP), None, False, redis_url)
    first = _message(sender)
    first.send(TARGET, {})
    assert [keys for _, keys, _ in first.staged] == [(TARGET.encode(),)]
    second = _message(sender, "o-2")
    second.send(TARGET, {}, key="k", partitions=PARTS)
    assert r.get(StreamKeys.for_stream(TARGET).partitions) == b"4"
    names = partition_names(TARGET, PARTS)
    assert [keys for _, keys, _ in second.staged] == [
        (names[zlib.crc32(b"k") % PARTS].encode(),)]
    third = _message(sender, "o-3")
    third.send(TARGET, {}, key="k")  # the count is known now: the same partition
    assert third.staged[0][1] == second.staged[0][1]
    with pytest.raises(ConfigError, match="split into 4 partitions"):
        _message(sender, "o-4").send(TARGET, {}, partitions=2)
