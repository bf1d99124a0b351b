"""Version-2 bodies (tests/fixtures/wire_v2/, written by the encoder before the options map)
still decode and still run: their ``l`` is the time limit, their ``sw-order-key`` and
``sw-priority`` headers the order key and priority. Entries a previous producer left in a
stream keep working across the upgrade to version 3."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import msgpack
import pytest
import redis

import streamwork as sw
from streamwork._ops.deadletter import list_dead
from streamwork._wire.codec import BODY_FIELD, decode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.priorities import level_stream
from streamwork._worker.core.consumer import max_held
from streamwork.testing import await_for, run_until_idle
from tests.helpers.serving import serving

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "wire_v2"
T = 1_767_225_600_000  # every fixture's enqueue time (2026-01-01T00:00:00Z)
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
EXT = {"amount": Decimal("12.50"), "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
       "day": dt.date(2026, 1, 2),
       "at": dt.datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=dt.timezone.utc)}

#: each fixture: (key, payload, headers, options) as today's decoder must give them
EXPECTED: dict[str, tuple[str, Any, dict[str, str], dict[str, Any]]] = {
    "plain": ("plain-1", {"n": 1}, {"tenant": "eu"}, {}),
    "timeout": ("timeout-1", {"sleep": 5.0}, {}, {"timeout": 0.3}),
    "order_key": ("order-1", {"n": 2}, {}, {"order_key": "customer-7"}),
    "order_key_next": ("order-3", {"n": 6}, {}, {"order_key": "customer-7"}),
    "order_key_same": ("order-2", {"n": 3}, {}, {}),
    "priority_high": ("high-1", {"n": 4}, {}, {"priority": "high"}),
    "priority_low": ("low-1", {"n": 5}, {"tenant": "us"}, {"priority": "low"}),
    "ext_types": ("ext-1", EXT, TRACE, {}),
    "everything": ("all-1", {"ext": EXT, "list": [1, "two", None]}, {"tenant": "eu", **TRACE},
                   {"timeout": 2.5, "order_key": "customer-8", "priority": "high"}),
    "schedule_tick": ("nightly:1767225600000", {"report": "daily"},
                      {"sw-schedule": "nightly", "sw-tick": "1767225600000"},
                      {"order_key": "nightly"}),
}


def fixture(name: str) -> bytes:
    return (FIXTURES / f"{name}.msgpack").read_bytes()


def test_every_fixture_is_a_version_2_body_and_is_expected() -> None:
    """The folder holds exactly the fixtures listed here, each a version-2 body."""
    assert sorted(p.stem for p in FIXTURES.glob("*.msgpack")) == sorted(EXPECTED)
    for name in EXPECTED:
        assert msgpack.unpackb(fixture(name), timestamp=3)["v"] == 2, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_version_2_body_decodes_to_the_same_job(name: str) -> None:
    """Key, enqueue time, payload (ext types included), headers and options: the option
    headers are read as options and taken out of the headers."""
    env = decode_body(fixture(name))
    key, payload, headers, options = EXPECTED[name]
    assert (env.key, env.enqueued_ms, env.headers, dict(env.options)) == (key, T, headers,
                                                                          options)
    assert env.payload == payload


def test_a_foreign_option_header_that_does_not_read_stays_a_header() -> None:
    """A version-2 body whose ``sw-priority`` is no level (not what streamwork wrote) keeps
    it as a header and runs at the normal level, as before."""
    body = msgpack.packb({"v": 2, "k": "k", "t": 1, "h": {"sw-priority": "urgent"}, "p": 1})
    env = decode_body(body)
    assert (env.headers, dict(env.options)) == ({"sw-priority": "urgent"}, {})


def test_a_bad_version_2_limit_is_still_schema_type_l() -> None:
    with pytest.raises(sw.DecodeError) as info:
        decode_body(msgpack.packb({"v": 2, "k": "k", "t": 1, "h": {}, "p": 1, "l": 0}))
    assert info.value.reason == "schema:type:l"


# ---- a real worker runs them -------------------------------------------------------------------

STREAM = "legacy"
KEYS = StreamKeys.for_stream(STREAM)


class Recorder(sw.StreamWorker):
    """Records each start and end as (event, key, order key, priority, options);
    sleeps ``sleep`` seconds (cut short by a time limit)."""

    stream = STREAM
    group = "legacy"
    timeout = 60.0  # only a job's own limit can stop it
    max_deliveries = 1
    read_block = 0.05
    visibility_timeout = 10.0
    events: ClassVar[list[tuple[str, str, str, str, dict[str, Any]]]] = []

    async def handle(self, msg: sw.Message) -> None:
        seen = (msg.key, msg.order_key, msg.priority, dict(msg.options))
        type(self).events.append(("start", *seen))
        await asyncio.sleep(float(msg.payload.get("sleep", 0.0)))
        type(self).events.append(("end", *seen))


def _add(r: redis.Redis, name: str, stream: str = STREAM) -> None:
    r.xadd(stream, {BODY_FIELD: fixture(name)})  # as the old producer left it, byte for byte


async def test_a_version_2_time_limit_stops_its_job(r: redis.Redis, redis_url: str) -> None:
    """``timeout.msgpack`` carries ``l: 300`` and sleeps 5 s: it is stopped at its limit
    (dead-lettered as a timeout) while the worker's own limit is 60 s; the others run."""
    Recorder.events = []
    for name in ("timeout", "plain", "ext_types", "everything"):
        _add(r, name)
    started = time.monotonic()
    await run_until_idle(Recorder.from_url(redis_url), r, timeout=30)
    [dead] = list_dead(r, STREAM)
    assert (dead.key, dead.reason) == ("timeout-1", "timeout")
    assert time.monotonic() - started < 4.5, "stopped by its own limit, not its sleep"
    ended = {key for event, key, *_ in Recorder.events if event == "end"}
    assert ended == {"plain-1", "ext-1", "all-1"}
    [everything] = [e for e in Recorder.events if e[:2] == ("start", "all-1")]
    assert everything[2:] == ("customer-8", "high", {"timeout": 2.5, "order_key": "customer-8",
                                                     "priority": "high"})


class OrderedRecorder(Recorder):
    ordered = True
    concurrency = 4


async def test_a_version_2_order_key_orders_its_jobs(r: redis.Redis, redis_url: str) -> None:
    """``order-1`` and ``order-3`` share the order key ``customer-7`` in a header: an
    ordered worker runs them one after the other (their keys differ: without the header
    they would run side by side), and each handler sees the order key."""
    OrderedRecorder.events = []
    r.xadd(STREAM, {BODY_FIELD: msgpack.packb(
        {**msgpack.unpackb(fixture("order_key")), "p": {"sleep": 0.3}})})  # a v2 body, slow
    _add(r, "order_key_next")
    await run_until_idle(OrderedRecorder.from_url(redis_url), r, timeout=30)
    events = [(event, key, order) for event, key, order, *_ in OrderedRecorder.events]
    assert events == [("start", "order-1", "customer-7"), ("end", "order-1", "customer-7"),
                      ("start", "order-3", "customer-7"), ("end", "order-3", "customer-7")]


class Levels(Recorder):
    concurrency = 1
    batch_size = 10


async def test_a_version_2_priority_is_read_first(r: redis.Redis, redis_url: str) -> None:
    """The high fixture (on the high level's stream, where the old producer put it) starts
    before the 200 normal jobs queued ahead of it, the low one after all of them; their
    handlers see the level."""
    Levels.events = []
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{}] * 200, keys=[f"n-{i}" for i in range(200)])
    _add(r, "priority_high", level_stream(KEYS, "high"))
    _add(r, "priority_low", level_stream(KEYS, "low"))
    worker = Levels.from_url(redis_url)
    async with serving(worker):
        await await_for(lambda: len([e for e in Levels.events if e[0] == "end"]) == 202,
                        timeout=60, message="the 202 jobs to run")
    # each job's first start (a copy run again after its lease lapsed on a loaded machine
    # starts again later, which says nothing about the levels' order)
    starts = list(dict.fromkeys(
        (key, level) for event, key, _, level, _ in Levels.events if event == "start"))
    assert starts.index(("high-1", "high")) <= max_held(1, 10)
    assert starts[-1] == ("low-1", "low"), starts[-12:]
