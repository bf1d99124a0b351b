"""Job chains: a job a handler sends with ``msg.send`` / ``msg.send_many`` is enqueued if and
only if the sending job completes (it travels in the completion script), with exactly the
body `Producer.send` writes; bad input raises in the handler, at ``msg.send``."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any, ClassVar

import msgpack
import pytest
import redis

import streamwork as sw
from streamwork._wire.codec import BODY_FIELD
from streamwork._wire.keys import StreamKeys
from streamwork.errors import ConfigError
from streamwork.testing import await_for, run_until_idle, stream_idle

SOURCE, TARGET = "orders", "receipts"


def _bodies(r: redis.Redis, stream: str) -> list[dict[str, Any]]:
    """The decoded bodies of ``stream``'s entries, in order."""
    return [msgpack.unpackb(fields[BODY_FIELD], raw=False) for _, fields in r.xrange(stream)]


class Chainer(sw.StreamWorker):
    """Sends, for each job, what its payload asks: ``n`` jobs to TARGET; ``fail_until``:
    raise (after sending) while the attempt is below it."""

    stream = SOURCE
    group = "billing"
    concurrency = 4
    visibility_timeout = 5.0
    retry_delay = 0.05
    retry_max_delay = 0.2
    read_block = 0.1
    max_deliveries = 5
    sent: ClassVar[list[str]] = []

    async def handle(self, msg: sw.Message) -> None:
        p = msg.payload
        keys = msg.send_many(TARGET, [{"order": msg.key, "i": i} for i in range(p.get("n", 1))],
                             keys=p.get("keys"))
        type(self).sent.extend(keys)
        if msg.attempt < p.get("fail_until", 0):
            raise RuntimeError("fails after sending")
        if p.get("dead"):
            raise sw.DeadLetter("asked to")


@pytest.mark.parametrize("dedup", [True, False])
async def test_sent_jobs_appear_once_with_the_producers_body(
        redis_url: str, r: redis.Redis, dedup: bool) -> None:
    """Each job's sends reach the target once, in order, with the body Producer.send would
    write (version, key, payload, headers, enqueue time, time limit)."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {"n": 2}, key="o-1")
        producer.send(SOURCE, {"n": 1, "keys": ["r-2"]}, key="o-2")
        producer.send(TARGET, {"order": "o-3", "i": 0}, key="ref", timeout=7.0)
    worker = Chainer.from_url(redis_url, dedup=dedup)
    await run_until_idle(worker, r)
    bodies = _bodies(r, TARGET)
    assert len(bodies) == 4
    ref = bodies[0]
    got = {(b["p"]["order"], b["p"]["i"]): b for b in bodies[1:]}
    assert set(got) == {("o-1", 0), ("o-1", 1), ("o-2", 0)}
    assert got[("o-2", 0)]["k"] == "r-2"
    assert ref["o"] == {"l": 7000}  # the options map: the time limit in ms
    assert set(got[("o-1", 0)]) == set(ref) - {"o"}  # the same fields (no option sent)
    assert got[("o-1", 0)]["v"] == ref["v"]
    assert got[("o-1", 0)]["k"] != got[("o-1", 1)]["k"]
    assert all(abs(b["t"] - ref["t"]) < 60_000 for b in bodies)


async def test_a_key_is_derived_the_same_on_every_attempt(redis_url: str, r: redis.Redis) -> None:
    """A job that sends then fails twice sends nothing until its third attempt succeeds;
    the keys it derived are the same on every attempt, and its sends appear once."""
    Chainer.sent = []
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {"n": 2, "fail_until": 3}, key="o-1")
    worker = Chainer.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["retried"] == 2
    assert len(Chainer.sent) == 6 and len(set(Chainer.sent)) == 2
    assert sorted(b["k"] for b in _bodies(r, TARGET)) == sorted(set(Chainer.sent))


async def test_nothing_is_sent_by_a_job_that_dies(redis_url: str, r: redis.Redis) -> None:
    """A job dead-lettered after sending (DeadLetter, or failing every attempt) sends
    nothing."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {"n": 3, "dead": True}, key="o-1")
        producer.send(SOURCE, {"n": 3, "fail_until": 99}, key="o-2")
    worker = Chainer.from_url(redis_url, max_deliveries=2)
    await run_until_idle(worker, r)
    assert worker.counts["dead_lettered"] == 2
    assert r.xlen(StreamKeys.for_stream(SOURCE).dead) == 2
    assert not r.exists(TARGET)


class Cancelled(sw.StreamWorker):
    """Sends, then waits until its job is cancelled, then returns."""

    stream = SOURCE
    group = "billing"
    visibility_timeout = 3.0
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> None:
        msg.send(TARGET, {"order": msg.key})
        while not msg.cancelled:
            await asyncio.sleep(0.02)


async def test_a_job_cancelled_while_it_runs_sends_nothing(
        redis_url: str, r: redis.Redis) -> None:
    """The handler returns after the cancel: the job ends cancelled, its sends dropped."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {}, key="o-1")
        worker = Cancelled.from_url(redis_url)
        task = asyncio.create_task(worker.serve())
        await await_for(lambda: producer.status(SOURCE, "o-1", group="billing").state
                        == "running", message="the job to run")
        producer.cancel(SOURCE, "o-1", group="billing")
        await await_for(lambda: producer.status(SOURCE, "o-1", group="billing").state
                        == "cancelled", message="the job to end cancelled")
        await await_for(lambda: stream_idle(r, SOURCE, "billing"), message="idle")
        worker.stop()
        await task
    assert not r.exists(TARGET)
    assert worker.counts["cancelled"] == 1


class LosesLease(sw.StreamWorker):
    """Sends, then waits until its lease is lost (the test steals it), then returns."""

    stream = SOURCE
    group = "billing"
    visibility_timeout = 1.0
    read_block = 0.1

    async def handle(self, msg: sw.Message) -> None:
        msg.send(TARGET, {"order": msg.key})
        while not msg.lock_lost:
            await asyncio.sleep(0.02)


async def test_a_job_that_lost_its_lease_sends_nothing(redis_url: str, r: redis.Redis) -> None:
    """Its lease taken by another holder while it ran: the job's completion is refused, and
    its sends with it."""
    record = StreamKeys.for_stream(SOURCE).group("billing").job("o-1")
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {}, key="o-1")
        worker = LosesLease.from_url(redis_url)
        task = asyncio.create_task(worker.serve())
        await await_for(lambda: producer.status(SOURCE, "o-1", group="billing").state
                        == "running", message="the job to run")
        r.set(record, b"Rsomeone-else:999|1|0", px=60_000)
        await await_for(lambda: worker.counts["lock_lost"] >= 1, message="the lease loss")
        worker.stop()
        await task
    assert not r.exists(TARGET)


class Sends(sw.StreamWorker):
    """Sends what ``send`` (a class attribute) asks, the keyword arguments of msg.send."""

    stream = SOURCE
    group = "billing"
    read_block = 0.1
    send: ClassVar[dict[str, Any]] = {}
    errors: ClassVar[list[BaseException]] = []

    async def handle(self, msg: sw.Message) -> None:
        try:
            msg.send(**type(self).send)
        except Exception as exc:
            type(self).errors.append(exc)
            raise sw.DeadLetter(str(exc)) from exc


@pytest.mark.parametrize(("send", "option", "words"), [
    ({"stream": 7, "payload": {}}, "stream", "str"),
    ({"stream": "", "payload": {}}, "stream", "empty"),
    ({"stream": "{receipts}:dead", "payload": {}}, "stream", "another stream"),
    ({"stream": TARGET, "payload": {"x": object()}}, "payload", "MessagePack"),
    ({"stream": TARGET, "payload": {}, "delay": -1}, "delay", ">= 0"),
    ({"stream": TARGET, "payload": {}, "key": ""}, "key", "non-empty"),
    ({"stream": TARGET, "payload": {}, "at": dt.datetime(2030, 1, 1)}, "at", "timezone"),
])
async def test_bad_input_raises_in_the_handler(
        redis_url: str, r: redis.Redis, send: dict[str, Any], option: str, words: str) -> None:
    """A stream name streamwork refuses, an unencodable payload or a bad option raises
    ConfigError naming it at msg.send, and nothing is staged."""
    Sends.send, Sends.errors = send, []
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {}, key="o-1")
    await run_until_idle(Sends.from_url(redis_url), r)
    [err] = Sends.errors
    assert isinstance(err, ConfigError), err
    assert err.option == option and words in str(err), err
    assert r.xlen(StreamKeys.for_stream(SOURCE).dead) == 1


async def test_delayed_and_trimmed_sends(redis_url: str, r: redis.Redis) -> None:
    """delay= puts the job in the target's delayed ZSET (promoted by the target's workers
    when due); maxlen= trims the target as Producer.send does."""
    Sends.send = {"stream": TARGET, "payload": {"a": 1}, "delay": 3600}
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {}, key="o-1")
    await run_until_idle(Sends.from_url(redis_url), r)
    Sends.send = {"stream": TARGET, "payload": {"a": 2}, "maxlen": 1}
    for i in range(3):
        r.xadd(TARGET, {"x": i})
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {}, key="o-2")
    worker = Sends.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["acked"] == 1 and worker.counts["staged_rejected"] == 0
    [(_, last)] = r.xrevrange(TARGET, count=1)
    assert msgpack.unpackb(last[BODY_FIELD])["p"] == {"a": 2}
    [(member, due)] = r.zrange(StreamKeys.for_stream(TARGET).delayed, 0, -1, withscores=True)
    assert member.startswith(b"0:")
    assert abs(due / 1000 - (r.time()[0] + 3600)) < 120


def test_send_outside_a_worker_is_refused() -> None:
    """A Message built by hand (not by a worker) cannot send: ConfigError says where it
    works."""
    msg = sw.Message(id="1-0", stream=SOURCE, key="k", payload={}, attempt=1, enqueued_at=0.0,
                     headers={})
    with pytest.raises(ConfigError, match="inside a handler"):
        msg.send(TARGET, {})


class BatchChainer(sw.StreamWorker):
    """A batch handler: each job sends one job; jobs whose payload says ``fail`` fail."""

    stream = SOURCE
    group = "billing"
    batch_max = 8
    read_block = 0.1
    retry_delay = 0.05
    retry_max_delay = 0.2
    max_deliveries = 2

    async def handle_batch(self, msgs: list[sw.Message]) -> list[Any]:
        out: list[Any] = []
        for msg in msgs:
            msg.send(TARGET, {"order": msg.key})
            out.append(RuntimeError("fails") if msg.payload.get("fail") else None)
        return out


async def test_batch_handler_sends_per_message(redis_url: str, r: redis.Redis) -> None:
    """In handle_batch each message's sends follow its own outcome: the failed ones' sends
    are dropped, the others' appear once."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send_many(SOURCE, [{"fail": i % 3 == 0} for i in range(12)],
                           keys=[f"o-{i}" for i in range(12)])
    worker = BatchChainer.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["dead_lettered"] == 4
    orders = sorted(b["p"]["order"] for b in _bodies(r, TARGET))
    assert orders == sorted(f"o-{i}" for i in range(12) if i % 3)


@sw.worker(SOURCE, group="billing", read_block=0.1)
def chain_function(msg: sw.Message) -> None:
    """A plain-def function worker sending on."""
    msg.send(TARGET, {"order": msg.key}, key=f"r-{msg.key}", headers={"step": "2"})


async def test_function_worker_sends(redis_url: str, r: redis.Redis) -> None:
    """A plain def under @sw.worker sends with its completion; headers go as given."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {}, key="o-1")
        producer.send(SOURCE, {}, key="o-1")  # a duplicate: its job runs (and sends) once
    worker = chain_function.from_url(redis_url)
    await run_until_idle(worker, r)
    [body] = _bodies(r, TARGET)
    assert body["k"] == "r-o-1" and body["h"]["step"] == "2"


async def test_a_target_that_is_not_a_stream_is_a_rejected_staged_write(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A target key holding another type (known only when the completion runs) is a
    staged write Redis rejects: the job completes, the error is logged, counted, and the
    job's other sends still go."""
    r.hset("not-a-stream", "x", 1)

    class Two(sw.StreamWorker):
        stream = SOURCE
        group = "billing"
        read_block = 0.1

        async def handle(self, msg: sw.Message) -> None:
            msg.send("not-a-stream", {})
            msg.send(TARGET, {})

    with sw.Producer.from_url(redis_url) as producer:
        producer.send(SOURCE, {}, key="o-1")
    worker = Two.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["staged_rejected"] == 1 and worker.counts["acked"] == 1
    assert r.xlen(TARGET) == 1
    assert any("rejected" in rec.getMessage() for rec in caplog.records)


@sw.batch_worker(SOURCE, group="billing", read_block=0.1, batch_max=5)
async def chain_batch_function(msgs: list[sw.Message]) -> None:
    """An async @sw.batch_worker function sending one job per message."""
    for msg in msgs:
        msg.send(TARGET, {"order": msg.key})


async def test_batch_function_worker_sends(redis_url: str, r: redis.Redis) -> None:
    """An @sw.batch_worker function's sends go with each message's completion, once."""
    with sw.Producer.from_url(redis_url) as producer:
        producer.send_many(SOURCE, [{}] * 7, keys=[f"o-{i}" for i in range(7)])
    await run_until_idle(chain_batch_function.from_url(redis_url), r)
    assert sorted(b["p"]["order"] for b in _bodies(r, TARGET)) == [f"o-{i}" for i in range(7)]
