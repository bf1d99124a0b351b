"""The producer's steps without Redis: each round trip they ask for, driven here with
hand-written replies (the shells perform the same rounds on a real server)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgpack
import pytest
import redis
import redis.backoff
import redis.retry

from streamwork._producer.batching import SEND_CHUNK, ids, new_key
from streamwork._producer.core import Core
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
    advance,
)
from streamwork._wire.codec import decode_body
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import partition_names
from streamwork.errors import ConfigError, RedisUnavailable, SendFailed, StreamNotFound

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


def _produced(request: Request) -> tuple[str, list[bytes], Any, str]:
    """(stream, bodies, maxlen, marker) of a send.lua (one body) or produce.lua call."""
    assert isinstance(request, Script) and request.call.script in ("send", "produce")
    stream, marker = request.call.keys
    body = request.call.args[0]
    bodies = ([body] if request.call.script == "send"
              else msgpack.unpackb(body, raw=True))
    return str(stream), bodies, request.call.args[1], str(marker)


def test_send_checks_the_partitions_once_then_produces_one_body_with_its_marker() -> None:
    core = Core(None)
    result, seen = drive(send(core, "orders", {"n": 1}, key="k1", maxlen=10),
                         lambda r: None if isinstance(r, Get) else b"5-0")
    assert result == "5-0"
    assert seen[0] == Get(StreamKeys.for_stream("orders").partitions)
    [produce] = seen[1:]
    stream, [body], maxlen, marker = _produced(produce)
    assert (stream, maxlen) == ("orders", 10)
    sent = StreamKeys.for_stream("orders").sent("")
    assert marker.startswith(sent) and len(marker) == len(sent) + 32
    env = decode_body(body)
    assert (env.key, env.payload) == ("k1", {"n": 1})
    _, again = drive(send(core, "orders", 2, key="k1"), lambda r: b"6-0")
    assert [type(r) for r in again] == [Script], "the partition count is checked once"
    assert _produced(again[0])[3] != marker, "each call has a marker of its own"


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
    stream, _, _, marker = _produced(seen[1])
    assert stream == core._target("orders", "k", "acct-1")
    assert stream in partition_names("orders", 2)
    assert marker.startswith(StreamKeys.for_stream(stream).sent(""))
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
    assert [type(r) for r in seen] == [Get, Script, Script, Sleep, Script]
    assert all(r == seen[1] for r in seen[1:] if isinstance(r, Script)), "one marker"


class _Client:
    """Stands in for a redis-py client that says its timeouts and makes no retries."""

    def get_connection_kwargs(self) -> dict[str, Any]:
        return {"socket_timeout": 1.0, "socket_connect_timeout": 0.5,
                "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 0)}


@pytest.mark.parametrize(("errors", "outcome"), [
    ([redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")],
     "not stored"),
    ([redis.TimeoutError("Timeout connecting to server"),
      redis.ResponseError("LOADING Redis is loading the dataset in memory")], "not stored"),
    ([redis.TimeoutError("Timeout reading from socket"),
      redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")],
     "unknown"),
    ([redis.ConnectionError("Connection closed by server.")], "unknown"),
])
def test_a_send_without_an_answer_says_whether_it_may_be_stored(
        errors: list[Exception], outcome: str) -> None:
    """SendFailed's outcome: "not stored" only when no attempt can have reached Redis (it
    failed to connect, or Redis answered with an error); any timeout or connection lost
    after connecting makes it "unknown". The bound is the retry budget plus two attempts."""
    core = Core(_Client(), retry_timeout=0)
    assert core.send_bound == 0 + 2 * (0.5 + 1.0)
    failing = iter(errors * 2)

    def down(request: Request) -> Any:
        if isinstance(request, (Get, Sleep)):
            return None
        raise next(failing)

    with pytest.raises(SendFailed) as raised:
        drive(send(core, "orders", 1, key="k"), down)
    assert (raised.value.outcome, raised.value.keys) == (outcome, ["k"])
    assert isinstance(raised.value, RedisUnavailable)


def test_a_client_that_retries_on_its_own_makes_every_outcome_unknown() -> None:
    """A client whose own retries may have resent the request (or one that does not say):
    even a connect error at the end leaves the outcome unknown."""
    refused = redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    def down(request: Request) -> Any:
        if isinstance(request, (Get, Sleep)):
            return None
        raise refused

    with pytest.raises(SendFailed) as raised:
        drive(send(Core(None, retry_timeout=0), "orders", 1, key="k"), down)
    assert raised.value.outcome == "unknown"


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


def test_a_send_shares_one_retry_deadline_between_its_check_and_its_write() -> None:
    """A send's partition check that failed and was answered only at its retry deadline
    leaves no time for the write: the write is not tried (the send stays within
    send_bound) and the job is known not stored."""
    answers = iter([redis.TimeoutError("Timeout reading from socket"), None])
    seen: list[Request] = []

    def late(request: Request) -> Any:
        seen.append(request)
        if isinstance(request, Sleep):
            return None
        reply = next(answers)
        if isinstance(reply, Exception):
            raise reply
        return reply

    with pytest.raises(SendFailed) as raised:
        drive(send(Core(_Client(), retry_timeout=0), "orders", 1, key="k"), late)
    assert [type(r) for r in seen] == [Get, Get], "the write was not tried"
    assert (raised.value.outcome, raised.value.keys) == ("not stored", ["k"])


def test_send_bound_counts_the_clients_own_tries() -> None:
    """send_bound: retry_timeout plus two attempts, an attempt being all of a client's own
    tries (and backoffs) when it retries on its own; unbounded for a client that does not
    say."""
    no_retries = redis.Redis(socket_timeout=1.0, socket_connect_timeout=0.5,
                             retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0))
    assert Core(no_retries, retry_timeout=2).send_bound == 2 + 2 * 1.5
    default = redis.Redis()  # redis-py 8's: 10 retries, backoff capped at 1 s, 5 s timeouts
    kwargs = default.get_connection_kwargs()
    retry: Any = default.get_retry()
    tries, cap = retry._retries, retry._backoff._cap
    one = (tries + 1) * (kwargs["socket_timeout"] + kwargs["socket_connect_timeout"]) \
        + tries * cap
    assert Core(default, retry_timeout=2).send_bound == 2 + 2 * one
    assert Core(None).send_bound == float("inf")
    no_retries.close()
    default.close()
