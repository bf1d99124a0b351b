"""The producer's steps without Redis: each round trip they ask for, driven here with
hand-written replies (the shells perform the same rounds on a real server)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
import pytest
import redis

from streamwork._producer.core import SEND_CHUNK, Core, ids, new_key
from streamwork._producer.jobs import Jobs
from streamwork._producer.rounds import (
    Get,
    Groups,
    MGet,
    Request,
    Result,
    Script,
    SetIfMissing,
    Sleep,
    Steps,
    Xadd,
    advance,
)
from streamwork._wire.codec import decode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork.errors import ConfigError, RedisUnavailable, StreamNotFound

T = TypeVar("T")


def drive(steps: Steps[T], answer: Callable[[Request], Any]) -> tuple[T, list[Request]]:
    """Run ``steps`` to the end, answering each request with ``answer`` (which may raise,
    as a failed round trip does); return the result and the requests in order."""
    seen: list[Request] = []
    step = advance(steps, None, None)
    while not isinstance(step, Result):
        seen.append(step)
        reply: Any = None
        error: BaseException | None = None
        try:
            reply = answer(step)
        except BaseException as exc:
            error = exc
        step = advance(steps, reply, error)
    return step.value, seen


def send(core: Core, stream: str, payload: Any, key: str | None = None,
         headers: dict[str, str] | None = None, maxlen: int | None = None,
         **options: Any) -> Steps[str]:
    return core._send_steps(stream, payload, key, headers, maxlen, options)


def send_many(core: Core, stream: str, payloads: list[Any], keys: list[str] | None = None,
              headers: dict[str, str] | None = None, maxlen: int | None = None,
              **options: Any) -> Steps[list[str]]:
    return core._send_many_steps(stream, payloads, keys, headers, maxlen, options)


def test_send_checks_the_partitions_once_then_xadds_one_body() -> None:
    core = Core(None)
    result, seen = drive(send(core, "orders", {"n": 1}, key="k1", maxlen=10),
                         lambda r: None if isinstance(r, Get) else b"5-0")
    assert result == "5-0"
    assert seen[0] == Get(StreamKeys.for_stream("orders").partitions)
    [xadd] = seen[1:]
    assert isinstance(xadd, Xadd) and xadd.stream == "orders" and xadd.maxlen == 10
    env = decode_body(xadd.body)
    assert (env.key, env.payload) == ("k1", {"n": 1})
    _, again = drive(send(core, "orders", 2), lambda r: b"6-0")
    assert [type(r) for r in again] == [Xadd], "the partition count is checked once"


def test_a_delayed_send_is_one_schedule_call_and_returns_the_key() -> None:
    core = Core(None)
    result, seen = drive(send(core, "orders", 1, key="later", delay=1.5), lambda r: None)
    assert result == "later"
    script = seen[-1]
    assert isinstance(script, Script) and script.call.script == "schedule"
    assert script.call.args[:2] == ["1500", ""]


def test_a_partitioned_send_records_the_count_and_refuses_another() -> None:
    core = Core(None, partitions=2)
    result, seen = drive(send(core, "orders", 1, key="k", order_key="acct-1"),
                         lambda r: None if isinstance(r, SetIfMissing) else b"1-0")
    assert result == "1-0"
    assert seen[0] == SetIfMissing(StreamKeys.for_stream("orders").partitions, 2)
    assert isinstance(seen[1], Xadd)
    assert seen[1].stream == core._target("orders", "k", "acct-1")
    assert seen[1].stream in partition_names("orders", 2)
    with pytest.raises(ConfigError, match="split into 3 partitions"):
        drive(send(Core(None, partitions=2), "orders", 1), lambda r: b"3")


def test_transient_errors_are_retried_then_raised_as_redis_unavailable() -> None:
    core = Core(None, retry_timeout=0)
    failures = 0

    def down(request: Request) -> Any:
        nonlocal failures
        if isinstance(request, Get):
            return None
        failures += 1
        raise redis.ConnectionError("refused")

    with pytest.raises(RedisUnavailable) as raised:
        drive(send(core, "orders", 1), down)
    assert failures == 2, "a failure is retried at once; the budget of 0 s ends it there"
    assert isinstance(raised.value.__cause__, redis.ConnectionError)

    flaky = iter([redis.ConnectionError("x"), redis.TimeoutError("y"), b"9-0"])

    def recovering(request: Request) -> Any:
        if isinstance(request, (Get, Sleep)):
            return None
        reply = next(flaky)
        if isinstance(reply, Exception):
            raise reply
        return reply

    result, seen = drive(send(Core(None), "orders", 1), recovering)
    assert result == "9-0"
    assert [type(r) for r in seen] == [Get, Xadd, Xadd, Sleep, Xadd]


def test_other_errors_are_not_retried() -> None:
    def refuse(request: Request) -> Any:
        raise redis.ResponseError("WRONGTYPE Operation against a key")

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        drive(send(Core(None), "orders", 1), refuse)


def test_send_many_is_one_produce_call_per_chunk_and_reads_short_replies() -> None:
    n = 2 * SEND_CHUNK + 5
    calls: list[int] = []

    def produce(request: Request) -> Any:
        if isinstance(request, Get):
            return None
        assert isinstance(request, Script) and request.call.script == "produce"
        calls.append(1)
        count = SEND_CHUNK if len(calls) < 3 else 5
        return [f"{len(calls)}-0".encode(), count]

    result, _ = drive(send_many(Core(None), "orders", list(range(n))), produce)
    assert len(calls) == 3
    assert result[:2] == ["1-0", "1-1"] and result[SEND_CHUNK] == "2-0" and result[-1] == "3-4"
    assert len(result) == n


def test_send_many_on_partitions_puts_the_ids_back_in_order() -> None:
    core = Core(None, partitions=3)
    keys = [f"k{i}" for i in range(30)]

    def produce(request: Request) -> Any:
        """Each job's partition and key as its "id"."""
        if isinstance(request, SetIfMissing):
            return None
        assert isinstance(request, Script) and request.call.script == "produce"
        bodies = msgpack.unpackb(request.call.args[0], raw=True)
        return [f"{request.call.keys[0]}/{decode_body(b).key}".encode() for b in bodies]

    result, _ = drive(send_many(core, "orders", list(range(30)), keys=keys), produce)
    assert [r.split("/")[1] for r in result] == keys
    assert {r.split("/")[0] for r in result} == set(partition_names("orders", 3))
    assert all(r.split("/")[0] == core._target("orders", k, None)
               for r, k in zip(result, keys, strict=True))


def test_reply_ids() -> None:
    assert ids([b"7-2", 3]) == ["7-2", "7-3", "7-4"]
    assert ids([b"7-2", b"8-0"]) == ["7-2", "8-0"]
    assert ids(["7-2"]) == ["7-2"]
    assert ids([]) == []


def test_new_key_is_a_uuid4_hex() -> None:
    key = new_key()
    assert len(key) == 32 and key[12] == "4" and key[16] in "89ab"


def test_cancel_asks_every_partition_and_answers_the_telling_state() -> None:
    core = Jobs(None, partitions=3)
    answers = iter([b"unknown", b"running", b"unknown"])

    def answer(request: Request) -> Any:
        return [{"name": b"g"}] if isinstance(request, Groups) else next(answers)

    result, seen = drive(core._cancel_steps("orders", "k", "g", "", None, 60.0), answer)
    assert result == "running" and type(result) is str
    assert [r.call.script for r in seen if isinstance(r, Script)] == ["cancel"] * 3
    with pytest.raises(ConfigError, match="ttl"):
        drive(core._cancel_steps("orders", "k", "g", "", None, 0), lambda r: None)


def test_status_without_a_group_needs_a_stream() -> None:
    def missing(request: Request) -> Any:
        assert isinstance(request, Groups)
        raise redis.ResponseError("ERR no such key")

    with pytest.raises(StreamNotFound):
        drive(Jobs(None)._status_steps("orders", "k", None, None), missing)


def test_result_pauses_between_looks_and_gives_up_at_its_timeout() -> None:
    steps = Jobs(None)._result_steps("orders", "k", "g", 60.0, None)
    assert isinstance(advance(steps, None, None), MGet)  # the record and its progress
    # the group was named, so a missing record makes it look the group up once
    groups = advance(steps, None, None)
    assert isinstance(groups, Groups)
    pause = advance(steps, [{"name": b"g"}], None)
    assert pause == Sleep(0.005)
    steps.close()
    with pytest.raises(TimeoutError, match="did not finish"):
        drive(Jobs(None)._result_steps("orders", "k", "g", 0, None),
              lambda r: [{"name": b"g"}] if isinstance(r, Groups) else None)
