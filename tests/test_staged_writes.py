"""Staged writes (Message.stage) reach Redis exactly as redis-py would send the same values:
numbers unrounded, bytes byte for byte; values Redis has no type for are refused at once."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import redis
from redis._parsers.encoders import Encoder

import streamwork as sw
from streamwork.errors import ConfigError
from streamwork.testing import run_until_idle

STREAM = "staged"

#: job key -> the writes its handler stages: [(command, keys, args), ...]
Ops = list[tuple[str, list[Any], list[Any]]]


class StagingWorker(sw.StreamWorker):
    """Stages, for each job, the writes listed under its key in ``ops``."""

    stream = STREAM
    group = "stagers"
    concurrency = 4
    visibility_timeout = 5.0
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    dedup_window = 600.0
    ops: ClassVar[dict[str, Ops]] = {}

    async def handle(self, msg: sw.Message) -> None:
        for command, keys, args in self.ops[msg.key]:
            msg.stage(command, keys, args)


async def _run(redis_url: str, r: redis.Redis, ops: dict[str, Ops]) -> sw.StreamWorker:
    """Send one job per key of ``ops``, run a worker staging them until all are acked."""
    worker_cls: type[StagingWorker] = type("Staging", (StagingWorker,), {"ops": ops})
    with sw.Producer.from_url(redis_url) as producer:
        for key in ops:
            producer.send(STREAM, {}, key=key)
    worker = worker_cls.from_url(redis_url)
    await run_until_idle(worker, r)
    assert r.xpending(STREAM, "stagers")["pending"] == 0
    assert worker.counts["acked"] == len(ops)
    assert worker.counts["staged_rejected"] == 0, "Redis rejected a staged write"
    return worker


async def test_staged_large_int_is_stored_exactly(redis_url: str, r: redis.Redis) -> None:
    """SET of 2**62 + 1 (not a double) stores its decimal digits, not 4.6116860184273879e+18."""
    await _run(redis_url, r, {"j": [("SET", ["big"], [4611686018427387905]),
                                    ("SET", ["neg"], [-(2**63)])]})
    assert r.get("big") == b"4611686018427387905"
    assert r.get("neg") == b"-9223372036854775808"


async def test_staged_floats_are_stored_as_redis_py_writes_them(
        redis_url: str, r: redis.Redis) -> None:
    """0.1 reads back b"0.1" (not 0.10000000000000001); 1e300 and -0.0 read back what
    redis-py's own SET of the same float stores."""
    values = {"tenth": 0.1, "huge": 1e300, "negzero": -0.0, "third": 1 / 3}
    await _run(redis_url, r, {"j": [("SET", [k], [v]) for k, v in values.items()]})
    assert r.get("tenth") == b"0.1"
    for name, value in values.items():
        r.set(f"ref:{name}", value)
        assert r.get(name) == r.get(f"ref:{name}"), name
    assert r.get("huge") == b"1e+300"
    assert r.get("negzero") == b"-0.0"


async def test_staged_hincrby_by_ten_to_the_17_applies_and_acks(
        redis_url: str, r: redis.Redis) -> None:
    """HINCRBY key f 10**17 is accepted (not sent as "1e+17") and the job is acknowledged."""
    await _run(redis_url, r, {"a": [("HINCRBY", ["totals"], ["eur", 10**17])],
                              "b": [("HINCRBY", ["totals"], ["eur", 10**17 + 1])]})
    assert r.hget("totals", "eur") == b"200000000000000001"


async def test_staged_bytes_are_stored_byte_for_byte(redis_url: str, r: redis.Redis) -> None:
    """Bytes that are not UTF-8 (NUL, lone continuation bytes, 0xff) go through unchanged,
    as values and as keys; bytearray and memoryview too; str goes as UTF-8."""
    raw = b"\x00\xff\xfe\x80abc\xc3("
    await _run(redis_url, r, {"j": [
        ("SET", ["raw"], [raw]),
        ("SET", [b"key:\xff\x00"], [bytearray(raw)]),
        ("RPUSH", ["list"], [memoryview(raw), "\u00e9\u20ac", ""]),
    ]})
    assert r.get("raw") == raw
    assert r.get(b"key:\xff\x00") == raw
    assert r.lrange("list", 0, -1) == [raw, "\u00e9\u20ac".encode(), b""]


def _msg() -> sw.Message:
    return sw.Message(id="1-0", stream=STREAM, key="k", payload={}, attempt=1,
                      enqueued_at=0.0, headers={})


@pytest.mark.parametrize("bad", [True, False, None, {"a": 1}, [1], (1,), 1j, object()])
def test_stage_refuses_values_redis_has_no_type_for(bad: Any) -> None:
    """bool, None, dict, list, ... raise ConfigError when staged (not later in the ack's
    script), naming stage(); nothing is staged."""
    msg = _msg()
    with pytest.raises(ConfigError) as err:
        msg.stage("SET", ["k"], [bad])
    assert err.value.option == "stage"
    assert "pass" in str(err.value)
    with pytest.raises(ConfigError):
        msg.stage("SET", [bad], ["v"])
    assert msg.staged == []


def test_stage_refuses_a_bare_string_for_keys_or_args() -> None:
    """stage("SET", "k", ...) would split "k" into characters: refused."""
    msg = _msg()
    with pytest.raises(ConfigError, match="list"):
        msg.stage("SET", "k", ["v"])
    with pytest.raises(ConfigError, match="list"):
        msg.stage("SET", ["k"], b"v")
    with pytest.raises(ConfigError, match="UTF-8"):
        msg.stage("SET", ["k"], ["\ud800"])
    assert msg.staged == []


def test_stage_stores_what_redis_py_would_send() -> None:
    """Each key and arg is stored as the bytes redis-py's Encoder.encode makes of it."""
    encoder = Encoder("utf-8", "strict", False)
    values: list[Any] = [0, -1, 2**64, 4611686018427387905, 0.1, 1e300, -0.0, 1e-7, 2.5,
                         float("inf"), "", "caf\u00e9", b"\xff", bytearray(b"ba"),
                         memoryview(b"mv")]
    msg = _msg()
    msg.stage("RPUSH", ["k", 7], values)
    [(command, keys, args)] = msg.staged
    assert command == "RPUSH"
    assert keys == (b"k", b"7")
    assert args == tuple(bytes(encoder.encode(v)) for v in values)
    assert all(type(a) is bytes for a in args)
