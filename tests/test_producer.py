"""Producer and AsyncProducer against a real redis-server: entries, validation, outages."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._producer.batching import SEND_CHUNK
from streamwork._redis.server import free_port
from streamwork._wire.codec import BODY_FIELD, decode_body
from streamwork._wire.keys import StreamKeys
from streamwork.errors import ConfigError, PayloadTooLarge, RedisUnavailable

STREAM = "orders"


def entries(r: redis.Redis, stream: str = STREAM) -> list[tuple[str, dict[bytes, bytes]]]:
    return [(eid.decode(), fields) for eid, fields in r.xrange(stream)]


def decoded(r: redis.Redis, stream: str = STREAM) -> list[tuple[str, str, Any]]:
    """(entry id, key, payload) of every entry; also checks the entry has only field 'd'."""
    out = []
    for eid, fields in entries(r, stream):
        assert set(fields) == {BODY_FIELD}, fields
        env = decode_body(fields[BODY_FIELD])
        out.append((eid, env.key, env.payload))
    return out


def test_send_enqueues_one_decodable_entry(redis_url: str, r: redis.Redis) -> None:
    """send XADDs one entry whose body decodes to the key, payload and enqueue time."""
    before = time.time()
    with sw.Producer.from_url(redis_url) as p:
        entry_id = p.send(STREAM, {"order_id": 7, "lines": [1, 2]}, key="order-7",
                          headers={"tenant": "eu"})
    assert decoded(r) == [(entry_id, "order-7", {"order_id": 7, "lines": [1, 2]})]
    env = decode_body(r.xrange(STREAM)[0][1][BODY_FIELD])
    assert env.headers["tenant"] == "eu"
    assert before - 1 <= env.enqueued_ms / 1000 <= time.time() + 1


def test_default_key_is_a_fresh_uuid4_hex(redis_url: str, r: redis.Redis) -> None:
    """Without key= every job gets a new uuid4 hex as its key."""
    with sw.Producer.from_url(redis_url) as p:
        for i in range(5):
            p.send(STREAM, i)
    keys = [key for _, key, _ in decoded(r)]
    assert len(set(keys)) == 5
    for key in keys:
        assert len(key) == 32 and uuid.UUID(hex=key).version == 4 and key == uuid.UUID(key).hex


def test_send_many_keeps_order_keys_and_payloads(redis_url: str, r: redis.Redis) -> None:
    """send_many returns entry ids in order and each entry holds its own key and payload."""
    payloads = [{"n": i, "blob": bytes([i % 256])} for i in range(300)]
    keys = [f"job-{i}" for i in range(300)]
    with sw.Producer.from_url(redis_url) as p:
        ids = p.send_many(STREAM, payloads, keys=keys)
        assert p.send_many(STREAM, []) == []
        auto = p.send_many(STREAM, ["a", "b"])
    got = decoded(r)
    assert [g[0] for g in got[:300]] == ids
    assert [(g[1], g[2]) for g in got[:300]] == list(zip(keys, payloads, strict=True))
    assert [g[0] for g in got[300:]] == auto
    assert len({g[1] for g in got[300:]}) == 2


@pytest.mark.parametrize("last", ["99999999999999-0", "99999999999999-9007199254740990"])
def test_send_many_ids_are_the_entries_ids(redis_url: str, r: redis.Redis, last: str) -> None:
    """produce.lua answers a run of ids in one millisecond as [first, count] and other
    runs id by id; either way send_many returns exactly the ids XADD gave. An entry with
    a future id pins the millisecond: after "...-0" the ids are consecutive (the short
    answer); past 2^52 the sequence numbers are sent in full (Lua numbers lose digits)."""
    r.xadd(STREAM, {"x": "1"}, id=last)
    with sw.Producer.from_url(redis_url) as p:
        ids = p.send_many(STREAM, [{"i": i} for i in range(50)])
    assert ids == [e.decode() for e, _ in r.xrange(STREAM)][1:]
    ms, seq = last.split("-")
    assert ids == [f"{ms}-{int(seq) + 1 + i}" for i in range(50)]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_send_many_is_one_atomic_script_call_per_chunk(redis_url: str, r: redis.Redis,
                                                             kind: str) -> None:
    """send_many of 2,500 jobs: three produce.lua calls (chunks of 1,000), ids in order;
    a batch whose first XADD fails writes nothing at all (no half-written pipeline)."""
    keys = [f"k{i}" for i in range(2 * SEND_CHUNK + 500)]
    r.config_resetstat()
    if kind == "sync":
        with sw.Producer.from_url(redis_url) as p:
            ids = p.send_many(STREAM, [{"i": i} for i in range(len(keys))], keys=keys)
    else:
        async with sw.AsyncProducer.from_url(redis_url) as ap:
            ids = await ap.send_many(STREAM, [{"i": i} for i in range(len(keys))], keys=keys)
    calls = r.info("commandstats")
    assert calls["cmdstat_evalsha"]["calls"] + calls.get("cmdstat_eval", {"calls": 0})[
        "calls"] == 3, "one script call per chunk"
    assert "cmdstat_xadd" in calls and calls["cmdstat_xadd"]["calls"] == len(keys)
    entries = r.xrange(STREAM)
    assert [e.decode() for e, _ in entries] == ids
    assert [decode_body(f[BODY_FIELD]).key for _, f in entries] == keys
    r.delete(STREAM)
    r.set(STREAM, "not a stream")
    with sw.Producer.from_url(redis_url) as p, pytest.raises(redis.ResponseError):
        p.send_many(STREAM, [{}] * 10)
    assert r.type(STREAM) == b"string"


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_send_many_delayed_and_capped(redis_url: str, r: redis.Redis, kind: str) -> None:
    """send_many(delay=) schedules every job in one call per chunk and returns their keys;
    maxlen= trims the stream to about that many entries (send and send_many); a bad
    maxlen enqueues nothing."""
    keys = [f"d{i}" for i in range(1500)]
    delayed = StreamKeys.for_stream(STREAM).delayed
    if kind == "sync":
        with sw.Producer.from_url(redis_url) as p:
            got = p.send_many(STREAM, [{}] * len(keys), keys=keys, delay=600)
            p.send_many(STREAM, [{}] * 3000, maxlen=100)
            p.send(STREAM, {}, maxlen=100)
            with pytest.raises(ConfigError, match="maxlen"):
                p.send_many(STREAM, [{}] * 5, maxlen=0)
    else:
        async with sw.AsyncProducer.from_url(redis_url) as ap:
            got = await ap.send_many(STREAM, [{}] * len(keys), keys=keys, delay=600)
            await ap.send_many(STREAM, [{}] * 3000, maxlen=100)
            await ap.send(STREAM, {}, maxlen=100)
            with pytest.raises(ConfigError, match="maxlen"):
                await ap.send_many(STREAM, [{}] * 5, maxlen=True)
    assert got == keys, "delayed jobs are known by their keys"
    assert r.zcard(delayed) == len(keys)
    assert 100 <= r.xlen(STREAM) <= 300, "trimmed to about maxlen (whole stream nodes)"


async def test_async_producer_round_trip(redis_url: str, r: redis.Redis) -> None:
    """AsyncProducer.send / send_many enqueue decodable entries, like Producer."""
    async with sw.AsyncProducer.from_url(redis_url) as ap:
        one = await ap.send(STREAM, {"a": 1}, key="k-1")
        many = await ap.send_many(STREAM, [1, 2, 3], keys=["k-2", "k-3", "k-4"])
        default_key = await ap.send(STREAM, None)
    got = decoded(r)
    assert [g[0] for g in got] == [one, *many, default_key]
    assert [(g[1], g[2]) for g in got[:4]] == [("k-1", {"a": 1}), ("k-2", 1), ("k-3", 2),
                                               ("k-4", 3)]
    assert uuid.UUID(hex=got[4][1]).version == 4


def test_producer_is_thread_safe(redis_url: str, r: redis.Redis) -> None:
    """One Producer shared by 8 threads enqueues every job exactly once."""
    errors: list[BaseException] = []
    with sw.Producer.from_url(redis_url) as p:
        def work(t: int) -> None:
            try:
                for i in range(100):
                    p.send(STREAM, i, key=f"t{t}-{i}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    keys = [g[1] for g in decoded(r)]
    assert sorted(keys) == sorted(f"t{t}-{i}" for t in range(8) for i in range(100))


# ---- nothing is enqueued when a send is rejected --------------------------------------


def _rejected(r: redis.Redis, send: Callable[[], Any], exc: type[BaseException]) -> None:
    if not r.exists(STREAM):
        r.xadd(STREAM, {"seed": "1"})
    before = r.xlen(STREAM)
    with pytest.raises(exc) as info:
        send()
    assert r.xlen(STREAM) == before, "a rejected send must enqueue nothing"
    assert isinstance(info.value, sw.StreamworkError)


def test_too_large_payload_raises_before_xadd(redis_url: str, r: redis.Redis) -> None:
    """A payload over max_payload_bytes raises PayloadTooLarge and enqueues nothing."""
    with sw.Producer.from_url(redis_url, max_payload_bytes=1024) as p:
        _rejected(r, lambda: p.send(STREAM, "x" * 2000), PayloadTooLarge)
        # one oversized job in a batch: none of the batch is enqueued
        _rejected(r, lambda: p.send_many(STREAM, ["ok", "x" * 2000, "ok"]), PayloadTooLarge)
    with sw.Producer.from_url(redis_url) as p:  # the default limit is 1 MiB
        _rejected(r, lambda: p.send(STREAM, b"\0" * (1024 * 1024 + 1)), PayloadTooLarge)


async def test_async_too_large_payload_raises_before_xadd(redis_url: str,
                                                          r: redis.Redis) -> None:
    """AsyncProducer refuses an oversized payload too, enqueuing nothing."""
    r.xadd(STREAM, {"seed": "1"})
    async with sw.AsyncProducer.from_url(redis_url, max_payload_bytes=1024) as ap:
        with pytest.raises(PayloadTooLarge):
            await ap.send(STREAM, "x" * 2000)
        with pytest.raises(PayloadTooLarge):
            await ap.send_many(STREAM, ["ok", "x" * 2000])
    assert r.xlen(STREAM) == 1


@pytest.mark.parametrize(("payload", "key", "option"), [
    (object(), None, "payload"), ({"s": {1, 2}}, None, "payload"), (2**70, None, "payload"),
    ("ok", "", "key"), ("ok", 7, "key"),
])
def test_bad_payload_or_key_raises_before_xadd(redis_url: str, r: redis.Redis, payload: Any,
                                               key: Any, option: str) -> None:
    """An unencodable payload or bad key raises ConfigError naming it; nothing enqueued."""
    with sw.Producer.from_url(redis_url) as p:
        _rejected(r, lambda: p.send(STREAM, payload, key=key), ConfigError)
        _rejected(r, lambda: p.send_many(STREAM, ["fine", payload], keys=["a", key]),
                  ConfigError)


def test_bad_stream_name_and_keys_length_raise_before_xadd(redis_url: str,
                                                           r: redis.Redis) -> None:
    """A bad stream name or a keys list of the wrong length raises ConfigError first."""
    with sw.Producer.from_url(redis_url) as p:
        for bad in ("", "has space", "a{b", "x" * 201):
            with pytest.raises(ConfigError) as info:
                p.send(bad, 1)
            assert info.value.option == "stream"
        _rejected(r, lambda: p.send_many(STREAM, [1, 2, 3], keys=["a", "b"]), ConfigError)
    assert r.keys("*") == [STREAM.encode()]


@pytest.mark.parametrize("options", [{"max_payload_bytes": 10}, {"retry_timeout": -1}])
def test_bad_producer_options(options: dict[str, Any]) -> None:
    """Producer options are checked when it is built, naming the option."""
    with pytest.raises(ConfigError) as info:
        sw.Producer.from_url("redis://127.0.0.1:1/0", **options)
    assert info.value.option == next(iter(options))


# ---- outages ---------------------------------------------------------------------------


def test_unreachable_redis_raises_redis_unavailable_after_budget() -> None:
    """Against a dead port, send retries for retry_timeout then raises RedisUnavailable."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    with sw.Producer.from_url(url, retry_timeout=0.5) as p:
        start = time.monotonic()
        with pytest.raises(RedisUnavailable) as info:
            p.send(STREAM, 1)
        took = time.monotonic() - start
        with pytest.raises(RedisUnavailable):
            p.send_many(STREAM, [1, 2])
    assert 0.3 <= took < 10, f"took {took:.2f}s for a 0.5 s retry budget"
    assert url in str(info.value)
    assert isinstance(info.value, sw.StreamworkError)


async def test_async_unreachable_redis_raises_redis_unavailable() -> None:
    """AsyncProducer raises RedisUnavailable after its retry budget too."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    async with sw.AsyncProducer.from_url(url, retry_timeout=0.3) as ap:
        with pytest.raises(RedisUnavailable):
            await ap.send(STREAM, 1)
        with pytest.raises(RedisUnavailable):
            await ap.send_many(STREAM, [1])


def test_producer_survives_a_redis_restart(make_server: Callable[..., Any]) -> None:
    """The same Producer sends before a crash, during the outage (blocking until Redis is
    back) and after it; with appendfsync always every acknowledged send is kept."""
    server = make_server(appendfsync="always")
    client = redis.Redis.from_url(server.url)
    with sw.Producer.from_url(server.url, retry_timeout=30) as p:
        first = p.send(STREAM, "before", key="before")
        server.restart()
        second = p.send(STREAM, "after restart", key="after")
        server.kill()
        restarter = threading.Timer(0.7, server.start)
        restarter.start()
        try:
            third = p.send(STREAM, "sent while down", key="during")
        finally:
            restarter.join()
        many = p.send_many(STREAM, [1, 2], keys=["m1", "m2"])
    got = decoded(client)
    client.close()
    assert [g[0] for g in got] == [first, second, third, *many]
    assert [g[1] for g in got] == ["before", "after", "during", "m1", "m2"]
