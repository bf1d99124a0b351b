"""Batch handlers (``handle_batch``): each message's outcome on its own (results, failures
retried then dead-lettered alone), batch_max and batch_wait, once-only and staged writes per
message, time limits per call, options refused with them, ``@sw.batch_worker``, and a
worker process SIGKILLed mid-batch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._ops.deadletter import list_dead
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.batch_runner import per_message
from streamwork.errors import ConfigError
from streamwork.testing import Ledger, await_for, run_until_idle, stream_idle, wait_for

S, G = "rows", "loaders"
DEAD = StreamKeys.for_stream(S).dead


class Recorder(sw.StreamWorker):
    """A batch handler recording each call's keys (``calls``) in the class; subclasses say
    what each message's outcome is (``outcome``)."""

    stream = S
    group = G
    concurrency = 2
    batch_max = 10
    batch_wait = 0.5
    visibility_timeout = 5.0
    max_deliveries = 3
    retry_delay = 0.05
    retry_max_delay = 0.2
    read_block = 0.1
    dedup_window = 600.0
    calls: list[list[str]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.calls = []

    def outcome(self, msg: sw.Message) -> Any:
        return {"doubled": msg.payload["n"] * 2}

    def run_batch(self, msgs: list[sw.Message]) -> list[Any]:
        type(self).calls.append([m.key for m in msgs])
        out = []
        for m in msgs:
            got = self.outcome(m)
            if not isinstance(got, Exception):
                m.stage("HINCRBY", ["ledger"], [m.key, 1])
            out.append(got)
        return out

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        return self.run_batch(msgs)


def seen(calls: list[list[str]]) -> Counter[str]:
    """How many times the handler was given each key."""
    return Counter(k for call in calls for k in call)


def send(url: str, payloads: dict[str, Any]) -> None:
    with sw.Producer.from_url(url) as p:
        p.send_many(S, list(payloads.values()), keys=list(payloads))


def ones(keys: list[str]) -> dict[str, Any]:
    """A payload ``{"n": 1}`` for each key."""
    return {k: {"n": 1} for k in keys}


def results(url: str, keys: list[str]) -> list[Any]:
    with sw.Producer.from_url(url) as p:
        return [p.result(S, k, group=G, timeout=10) for k in keys]


# -- each message's outcome on its own ---------------------------------------------------


class Mixed(Recorder):
    """``bad`` keys fail every time; ``flaky`` ones on their first attempt."""

    def outcome(self, msg: sw.Message) -> Any:
        if msg.key.startswith("bad"):
            return ValueError(f"row {msg.key} is malformed")
        if msg.key.startswith("flaky") and msg.attempt == 1:
            return ConnectionError(f"row {msg.key}: try again")
        return super().outcome(msg)


class SyncMixed(Mixed):
    """The same as a plain ``def handle_batch`` (run in the worker's thread pool)."""

    def handle_batch(self, msgs: list[sw.Message]) -> Any:  # type: ignore[override]
        return self.run_batch(msgs)


@pytest.mark.parametrize("cls", [Mixed, SyncMixed], ids=["async", "sync"])
async def test_each_message_has_its_own_outcome(redis_url: str, r: redis.Redis,
                                                caplog: pytest.LogCaptureFixture,
                                                cls: type[Mixed]) -> None:
    """A call's answer holds a result or an exception per message: the results are the
    jobs' (``Producer.result``), acked once with their staged writes; a failed message is
    retried alone, then dead-lettered alone (its error logged as a failing ``handle``'s),
    its staged writes dropped."""
    caplog.set_level(logging.WARNING, logger="streamwork")
    payloads = {f"{kind}{i}": {"n": i} for kind in ("ok", "bad", "flaky") for i in range(3)}
    send(redis_url, payloads)
    cls.calls = []
    worker = cls.from_url(redis_url)
    await run_until_idle(worker, r)
    counts = seen(cls.calls)
    assert {k: counts[k] for k in payloads} == {
        **{f"ok{i}": 1 for i in range(3)}, **{f"bad{i}": 3 for i in range(3)},
        **{f"flaky{i}": 2 for i in range(3)}}
    assert max(len(c) for c in cls.calls) > 1, cls.calls  # several messages per call
    ok = [f"ok{i}" for i in range(3)] + [f"flaky{i}" for i in range(3)]
    assert results(redis_url, ok) == [{"doubled": 2 * i} for i in range(3)] * 2
    assert Ledger(r).counts() == dict.fromkeys(ok, 1)
    dead = list_dead(r, S)
    assert sorted(d.key or "" for d in dead) == ["bad0", "bad1", "bad2"]
    assert {(d.reason, d.error_type, d.attempts) for d in dead} == {
        ("max_deliveries", "ValueError", 3)}
    assert worker.counts["acked"] == 6 and worker.counts["dead_lettered"] == 3
    assert worker.counts["retried"] == 3 * 2 + 3
    lines = [rec.getMessage() for rec in caplog.records if rec.name.startswith("streamwork")]
    for i in range(3):
        assert sum(f"ValueError: row bad{i} is malformed" in m and "dead-lettered" in m
                   for m in lines) == 1, lines
        assert sum(f"ConnectionError: row flaky{i}: try again" in m and "retrying" in m
                   for m in lines) == 1, lines
    with sw.Producer.from_url(redis_url) as p, pytest.raises(sw.JobFailed):
        p.result(S, "bad0", group=G, timeout=5)


class Asking(Recorder):
    """Returns ``sw.DeadLetter`` for ``gone`` keys and ``sw.Retry`` for ``later`` ones on
    their first attempt."""

    def outcome(self, msg: sw.Message) -> Any:
        if msg.key.startswith("gone"):
            return sw.DeadLetter("unknown customer")
        if msg.key.startswith("later") and msg.attempt == 1:
            return sw.Retry(delay=0.01, reason="not yet")
        return super().outcome(msg)


async def test_returned_dead_letter_and_retry_act_as_raised(redis_url: str,
                                                             r: redis.Redis) -> None:
    """A ``sw.DeadLetter`` returned for a message dead-letters it at once; a ``sw.Retry``
    retries it (after its delay), as they do raised from ``handle``."""
    send(redis_url, {"gone1": {"n": 1}, "later1": {"n": 2}, "fine1": {"n": 3}})
    worker = Asking.from_url(redis_url)
    await run_until_idle(worker, r)
    [dead] = list_dead(r, S)
    assert (dead.key, dead.reason, dead.attempts) == ("gone1", "dead_letter: unknown customer", 1)
    assert seen(Asking.calls) == Counter({"gone1": 1, "later1": 2, "fine1": 1})
    assert results(redis_url, ["later1", "fine1"]) == [{"doubled": 4}, {"doubled": 6}]


class Raising(Recorder):
    """Raises for the whole call while any message of it is on its first attempt."""

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        type(self).calls.append([m.key for m in msgs])
        if any(m.attempt == 1 for m in msgs):
            raise RuntimeError("the bulk insert failed")
        for m in msgs:
            m.stage("HINCRBY", ["ledger"], [m.key, 1])
        return None


async def test_a_raising_call_fails_each_message_alone(redis_url: str, r: redis.Redis,
                                                       caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    """handle_batch raising: every message of the call fails with that error, each retried
    on its own (one retry line each, naming its key), then acked once."""
    caplog.set_level(logging.WARNING, logger="streamwork")
    keys = [f"k{i}" for i in range(6)]
    send(redis_url, ones(keys))
    worker = Raising.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["retried"] == 6 and worker.counts["acked"] == 6
    assert Ledger(r).counts() == dict.fromkeys(keys, 1)
    retries = [rec for rec in caplog.records if rec.getMessage().startswith(
        "job failed: retrying")]
    assert sorted(getattr(rec, "sw", {})["key"] for rec in retries) == keys
    assert all("RuntimeError: the bulk insert failed" in rec.getMessage() for rec in retries)


class Dying(Recorder):
    """Always raises: each message is dead-lettered on its own."""

    max_deliveries = 2

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        raise KeyError("no such table")


async def test_a_call_that_always_raises_dead_letters_each_message(
        redis_url: str, r: redis.Redis) -> None:
    keys = [f"k{i}" for i in range(4)]
    send(redis_url, ones(keys))
    worker = Dying.from_url(redis_url)
    await run_until_idle(worker, r)
    dead = list_dead(r, S)
    assert sorted(d.key or "" for d in dead) == keys
    assert {d.error_type for d in dead} == {"KeyError"}
    assert worker.counts["dead_lettered"] == 4


class WrongAnswer(Recorder):
    """Returns a list one short on a message's first attempt, None after."""

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        type(self).calls.append([m.key for m in msgs])
        if any(m.attempt == 1 for m in msgs):
            return [None] * (len(msgs) - 1)
        return None


async def test_a_wrong_answer_fails_the_messages_with_an_error_saying_what_to_return(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="streamwork")
    keys = [f"k{i}" for i in range(5)]
    send(redis_url, ones(keys))
    worker = WrongAnswer.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["retried"] == 5 and worker.counts["acked"] == 5
    retries = [rec.getMessage() for rec in caplog.records
               if rec.getMessage().startswith("job failed: retrying")]
    assert len(retries) == 5
    assert all("TypeError: handle_batch returned a list of" in m and "return None" in m
               for m in retries), retries


def test_answers_are_matched_to_messages() -> None:
    """None: all succeeded; a list (or tuple) as long as msgs: one outcome each; anything
    else: one TypeError for all saying what to return."""
    assert per_message(None, 3) == [None, None, None]
    error = ValueError("x")
    assert per_message([1, error, "c"], 3) == [1, error, "c"]
    assert per_message((1, 2), 2) == [1, 2]
    for wrong, said in (([1, 2], "a list of 2 items for 3 messages"), ({"a": 1}, "a dict"),
                        ("abc", "a str"), (7, "an int")):
        got = per_message(wrong, 3)
        assert len(got) == 3 and all(g is got[0] for g in got)
        assert isinstance(got[0], TypeError) and said in str(got[0]), str(got[0])
        assert "return None" in str(got[0]) and "a list of 3" in str(got[0])


# -- batch_max and batch_wait ------------------------------------------------------------


async def test_batch_max_caps_each_call(redis_url: str, r: redis.Redis) -> None:
    """53 jobs ready at once, batch_max 7: no call gets more than 7, and calls do fill."""
    keys = [f"k{i}" for i in range(53)]
    send(redis_url, ones(keys))
    cls: type[Recorder] = type("Capped", (Recorder,), {"batch_max": 7, "batch_wait": 0.2})
    await run_until_idle(cls.from_url(redis_url), r)
    sizes = [len(c) for c in cls.calls]
    assert sum(sizes) == 53 and max(sizes) == 7, sizes
    assert seen(cls.calls) == Counter(dict.fromkeys(keys, 1))


async def test_batch_wait_fills_a_batch_from_jobs_sent_one_by_one(
        redis_url: str, r: redis.Redis) -> None:
    """Jobs sent one at a time, each read on its own: with a long batch_wait the runner
    holds the first until batch_max have come (woken for each before the idle runner), so
    they arrive as one call."""
    cls: type[Recorder] = type("Waiting", (Recorder,), {
        "batch_max": 5, "batch_wait": 30.0, "concurrency": 2})
    worker = cls.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    with sw.Producer.from_url(redis_url) as p:
        for i in range(5):
            p.send(S, {"n": i}, key=f"k{i}")
            await asyncio.sleep(0.05)  # pacing: each job is read on its own
    # awaited: a blocking wait here would hold the worker's event loop too
    await await_for(lambda: r.exists(S) and stream_idle(r, S, G), timeout=60,
                    message="all acked")
    worker.stop()
    await task
    assert [len(c) for c in cls.calls] == [5], cls.calls


async def test_batch_wait_zero_takes_what_is_ready(redis_url: str, r: redis.Redis) -> None:
    """batch_wait 0: a call takes what is ready and does not wait for more (a lone job is
    handled at once, not after batch_wait)."""
    cls: type[Recorder] = type("Eager", (Recorder,), {"batch_max": 50, "batch_wait": 0.0})
    keys = [f"k{i}" for i in range(20)]
    send(redis_url, ones(keys))
    await run_until_idle(cls.from_url(redis_url), r)
    assert seen(cls.calls) == Counter(dict.fromkeys(keys, 1))
    assert max(len(c) for c in cls.calls) > 1


# -- once-only and staged writes per message ---------------------------------------------


async def test_a_key_sent_twice_takes_effect_once(redis_url: str, r: redis.Redis) -> None:
    """Dedup on: a key sent twice in one read (both copies could land in one batch) and a
    key sent again after it was done (another batch) each run once; their staged writes
    apply once."""
    cls: type[Recorder] = type("Once", (Recorder,), {"local_cache_size": 0})
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(S, [{"n": 1}] * 6, keys=["dup", "a", "dup", "b", "dup", "c"])
    worker = cls.from_url(redis_url)
    await run_until_idle(worker, r)
    send(redis_url, {"dup": {"n": 1}, "a": {"n": 1}, "d": {"n": 1}})
    worker2 = cls.from_url(redis_url)
    await run_until_idle(worker2, r)
    assert seen(cls.calls) == Counter({"dup": 1, "a": 1, "b": 1, "c": 1, "d": 1}), cls.calls
    assert Ledger(r).counts() == {"dup": 1, "a": 1, "b": 1, "c": 1, "d": 1}
    assert worker.counts["deduplicated"] + worker2.counts["deduplicated"] == 4


async def test_a_job_cancelled_before_it_started_is_not_handed_over(
        redis_url: str, r: redis.Redis) -> None:
    """A job cancelled while queued never reaches handle_batch; the others of its batch
    run."""
    send(redis_url, {f"k{i}": {"n": i} for i in range(4)})
    with sw.Producer.from_url(redis_url) as p:
        p.cancel(S, "k2", group=G)
    cls: type[Recorder] = type("Cancelled", (Recorder,), {})
    worker = cls.from_url(redis_url)
    await run_until_idle(worker, r)
    assert seen(cls.calls) == Counter({"k0": 1, "k1": 1, "k3": 1})
    assert Ledger(r).counts() == {"k0": 1, "k1": 1, "k3": 1}
    with sw.Producer.from_url(redis_url) as p:
        assert p.status(S, "k2", group=G).state == "cancelled"


class Robbed(Recorder):
    """Hands one message of its first call to another consumer (XCLAIM) while it runs."""

    reclaim_interval = 3600.0  # no sweep takes the stolen delivery back during the test

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        if not type(self).calls:
            client = redis.Redis.from_url(self.url)
            client.xclaim(S, G, "thief", 0, [msgs[0].id], justid=True)
            client.close()
        return self.run_batch(msgs)


async def test_a_message_whose_lease_is_lost_during_the_call_is_dropped_alone(
        redis_url: str, r: redis.Redis) -> None:
    """One message of a call taken by another consumer while the call runs: its outcome
    (and staged write) is dropped, left to its new owner; the others of the call are acked
    with their staged writes."""
    keys = [f"k{i}" for i in range(4)]
    with sw.Producer.from_url(redis_url) as p:
        r.xgroup_create(S, G, id="0", mkstream=True)
        p.send_many(S, list(ones(keys).values()), keys=keys)
    worker = Robbed.from_url(redis_url)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: worker.counts["acked"] == 3 and worker.counts["lock_lost"] == 1,
                        timeout=30, message="three acked, one lost")
    finally:
        worker.stop()
        await task
    [stolen] = Robbed.calls[0][:1]
    assert len(Robbed.calls[0]) == 4, Robbed.calls
    assert Ledger(r).counts() == {k: 1 for k in keys if k != stolen}
    [pending] = r.xpending_range(S, G, "-", "+", 10)
    assert pending["consumer"] == b"thief"


class CancelledMidCall(Recorder):
    """Cancels the job of its first call's first message, waits until the heartbeat tells
    that message, then returns a result for each."""

    visibility_timeout = 1.0  # a heartbeat every third of a second

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        if not type(self).calls:
            with sw.Producer.from_url(self.url) as p:
                p.cancel(S, msgs[0].key, group=G)
            while not msgs[0].cancelled:
                await asyncio.sleep(0.02)
        return self.run_batch(msgs)


async def test_a_job_cancelled_during_the_call_ends_cancelled_alone(
        redis_url: str, r: redis.Redis) -> None:
    """A job cancelled while its call runs sees msg.cancelled; whatever the call returns
    for it, it ends cancelled (its staged write dropped); the others of the call are done."""
    keys = [f"k{i}" for i in range(3)]
    send(redis_url, ones(keys))
    worker = CancelledMidCall.from_url(redis_url)
    await run_until_idle(worker, r)
    [first, *others] = CancelledMidCall.calls[0]
    assert Ledger(r).counts() == dict.fromkeys(others, 1)
    with sw.Producer.from_url(redis_url) as p:
        assert p.status(S, first, group=G).state == "cancelled"
        assert [p.status(S, k, group=G).state for k in others] == ["done"] * len(others)
    assert worker.counts["cancelled"] == 1 and worker.counts["acked"] == len(others)


async def test_a_rate_limit_counts_messages(redis_url: str, r: redis.Redis) -> None:
    """rate_limit with a batch handler: each message takes a token before its call; every
    job runs once, several per call."""
    cls: type[Recorder] = type("Rated", (Recorder,), {"rate_limit": "500/s"})
    keys = [f"k{i}" for i in range(40)]
    send(redis_url, ones(keys))
    await run_until_idle(cls.from_url(redis_url), r)
    assert seen(cls.calls) == Counter(dict.fromkeys(keys, 1))
    assert max(len(c) for c in cls.calls) > 1


class Slow(Recorder):
    """Sleeps past the time limit on a message's first attempt."""

    timeout = 0.3

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        type(self).calls.append([m.key for m in msgs])
        if any(m.attempt == 1 for m in msgs):
            await asyncio.sleep(10)
        return [m.key.upper() for m in msgs]


async def test_a_call_past_its_time_limit_times_out_each_message(
        redis_url: str, r: redis.Redis) -> None:
    """The time limit bounds the call: past it the call is cancelled and each of its jobs
    fails with reason timeout, retried on its own."""
    keys = [f"k{i}" for i in range(4)]
    send(redis_url, ones(keys))
    worker = Slow.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["timed_out"] == 4 and worker.counts["acked"] == 4
    assert results(redis_url, keys) == [k.upper() for k in keys]


class Steady(Recorder):
    """Each call takes 0.5 s; the worker's time limit is generous."""

    timeout = 30.0
    max_deliveries = 3

    async def handle_batch(self, msgs: list[sw.Message]) -> Any:
        type(self).calls.append([m.key for m in msgs])
        await asyncio.sleep(0.5)
        return [m.key.upper() for m in msgs]


async def test_one_jobs_short_time_limit_does_not_time_out_its_mates(
        redis_url: str, r: redis.Redis) -> None:
    """Nine jobs and one sent with timeout=0.2: the short one runs in calls of its own and
    is dead-lettered as timeout; its nine mates each succeed on their first attempt."""
    mates = [f"m{i}" for i in range(9)]
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(S, [{"n": 1}] * 4, keys=mates[:4])
        p.send(S, {"n": 1}, key="short", timeout=0.2)
        p.send_many(S, [{"n": 1}] * 5, keys=mates[4:])
    worker = Steady.from_url(redis_url)
    await run_until_idle(worker, r)
    assert results(redis_url, mates) == [k.upper() for k in mates]
    assert all("short" not in call or call == ["short"] for call in Steady.calls), Steady.calls
    assert worker.counts["timed_out"] == 3 and worker.counts["dead_lettered"] == 1
    with sw.Producer.from_url(redis_url) as p:
        assert [p.status(S, k, group=G).attempts for k in mates] == [1] * 9
        assert p.status(S, "short", group=G).reason == "timeout"


async def test_a_concurrency_key_cap_holds_per_message(redis_url: str, r: redis.Redis) -> None:
    """concurrency_key with concurrency_per_key 1: two jobs of one key are never in the
    same call (each message takes its key's hold before its call)."""
    cls: type[Recorder] = type("Keyed", (Recorder,), {
        "concurrency_key": staticmethod(lambda msg: msg.key[0])})
    keys = [f"{letter}{i}" for letter in "abc" for i in range(3)]
    send(redis_url, ones(keys))
    await run_until_idle(cls.from_url(redis_url), r)
    assert seen(cls.calls) == Counter(dict.fromkeys(keys, 1))
    for call in cls.calls:
        assert len({k[0] for k in call}) == len(call), cls.calls


async def test_a_partitioned_stream_runs_batches(redis_url: str, r: redis.Redis) -> None:
    cls: type[Recorder] = type("Parts", (Recorder,), {"partitions": 3})
    keys = [f"k{i}" for i in range(30)]
    with sw.Producer.from_url(redis_url, partitions=3) as p:
        p.send_many(S, [{"n": i} for i in range(30)], keys=keys)
    await run_until_idle(cls.from_url(redis_url), r)
    assert seen(cls.calls) == Counter(dict.fromkeys(keys, 1))
    assert max(len(c) for c in cls.calls) > 1


# -- what is refused ---------------------------------------------------------------------


@pytest.mark.parametrize(("options", "option", "said"), [
    ({"ordered": True}, "ordered", "Define handle() for an ordered worker"),
    ({"cancel_running": True}, "cancel_running", "look at msg.cancelled"),
    ({"batch_max": 0}, "batch_max", "must be an int from 1 to 10000"),
    ({"batch_wait": -1}, "batch_wait", "must be a number of seconds"),
])
def test_options_refused_with_a_batch_handler(options: dict[str, Any], option: str,
                                              said: str) -> None:
    with pytest.raises(ConfigError) as info:
        Recorder.from_url("redis://127.0.0.1:1/0", **options)
    assert info.value.option == option and said in str(info.value), str(info.value)


def test_batch_options_without_a_batch_handler_are_refused() -> None:
    class Single(sw.StreamWorker):
        stream, group, batch_max = S, G, 50

        async def handle(self, msg: sw.Message) -> None:
            pass

    with pytest.raises(ConfigError, match="define `async def handle_batch"):
        Single.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(ConfigError, match="batch_wait: is an option of batch handlers"):
        Single.from_url("redis://127.0.0.1:1/0", batch_max=100, batch_wait=1.0)


def test_handle_and_handle_batch_together_are_refused() -> None:
    class Both(Recorder):
        async def handle(self, msg: sw.Message) -> None:
            pass

    with pytest.raises(ConfigError, match="defines both handle"):
        Both.from_url("redis://127.0.0.1:1/0")


# -- @sw.batch_worker --------------------------------------------------------------------


async def test_a_decorated_function_is_a_batch_worker(redis_url: str, r: redis.Redis) -> None:
    calls: list[int] = []

    @sw.batch_worker(S, group=G, batch_max=4, batch_wait=0.5, read_block=0.1)
    async def load_rows(msgs: list[sw.Message]) -> list[Any]:
        calls.append(len(msgs))
        return [m.payload["n"] + 1 for m in msgs]

    assert issubclass(load_rows, sw.StreamWorker) and load_rows.fn is not None
    keys = [f"k{i}" for i in range(10)]
    send(redis_url, {k: {"n": i} for i, k in enumerate(keys)})
    await run_until_idle(load_rows.from_url(redis_url), r)
    assert sum(calls) == 10 and max(calls) == 4, calls
    assert results(redis_url, keys) == list(range(1, 11))


def test_batch_options_on_sw_worker_point_to_batch_worker() -> None:
    with pytest.raises(ConfigError, match=r"@sw\.batch_worker"):
        sw.worker(S, group=G, batch_max=10)  # type: ignore[call-overload]


def test_batch_worker_refuses_a_function_not_taking_the_list() -> None:
    with pytest.raises(ConfigError, match="must take the list of messages"):
        @sw.batch_worker(S, group=G)
        def two(a: Any, b: Any) -> None:
            pass


# -- a worker process killed mid-batch -----------------------------------------------------


def test_sigkill_mid_batch_loses_nothing_and_applies_nothing_twice(
        redis_url: str, r: redis.Redis, spawn_worker: Any) -> None:
    """Batch workers SIGKILLed while calls run: every job is applied (staged ledger
    write), none twice (dedup on), no fencing token granted twice, nothing dead."""
    stream = "batched"
    keys = [f"job-{i}" for i in range(3000)]
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(stream, [{"sleep": 0.2}] * len(keys), keys=keys)
    target = "tests.workers.batch:BatchLedgerWorker"
    env = {"SW_TEST_STREAM": stream}
    procs = [spawn_worker(target, redis_url, env=env) for _ in range(2)]
    rng = random.Random(5)
    kills = 0
    wait_for(lambda: r.hlen("ledger") > 0, 30, message="first effects")
    while kills < 4 and not stream_idle(r, stream, "batchers"):
        time.sleep(0.4)  # pacing of the faults, not a check
        victim = rng.randrange(len(procs))
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait()
        kills += 1
        procs[victim] = spawn_worker(target, redis_url, env=env)
    wait_for(lambda: stream_idle(r, stream, "batchers"), 90, message="the stream to drain")
    report = Ledger(r).report(keys)
    sizes = [int(s) for s in r.lrange("batch-sizes", 0, -1)]
    granted = [int(t) for t in r.lrange("granted", 0, -1)]
    print(f"\nbatch chaos: jobs={len(keys)} kills={kills} calls={len(sizes)} "
          f"largest={max(sizes)} started={len(granted)} lost={len(report.lost)} "
          f"twice={len(report.twice)}")
    assert kills >= 1 and len(granted) > len(keys), "no call was cut short by a kill"
    assert report.exactly_once, (report.lost[:5], list(report.twice.items())[:5])
    assert max(sizes) > 1
    assert len(granted) == len(set(granted)), "a fencing token was handed out twice"
    assert r.xpending(stream, "batchers")["pending"] == 0
    assert r.xlen(StreamKeys.for_stream(stream).dead) == 0


@pytest.mark.parametrize(("target", "group"), [
    ("tests.workers.batch:BatchLedgerWorker", "batchers"),
    ("tests.workers.dedup:StagedLedgerWorker", "billing"),
], ids=["batch", "one-by-one"])
def test_redis_restarts_mid_call_lose_nothing_and_apply_nothing_twice(
        make_server: Any, spawn_worker: Any, tmp_path: Any, target: str, group: str) -> None:
    """redis-server SIGKILLed and restarted (AOF, fsync always) while calls run: the
    workers stay up, reconnect, and every job is applied once (staged ledger write), none
    lost, none dead-lettered. The second outage outlasts the visibility timeout, so every
    lease lapses: the deliveries each worker let go come back in batches, not one at a time
    as suspects (printed: how many were taken back alone)."""
    stream = "batched-restart"
    server, r, keys = _durable_backlog(make_server, stream, 1000, 0.1)
    env = {"SW_TEST_STREAM": stream}
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    with contextlib.ExitStack() as files:
        procs = [spawn_worker(target, server.url, "--log-level", "INFO", env=env,
                              stdout=files.enter_context(log.open("w"))) for log in logs]
        _restart_twice_and_drain(server, r, keys, stream, group)
    r = redis.Redis.from_url(server.url)
    report = Ledger(r).report(keys)
    texts = [log.read_text(errors="replace") for log in logs]
    alone = sum(text.count("a suspect, it runs alone") for text in texts)
    print(f"\nrestarts: jobs={len(keys)} taken back alone={alone} lost={len(report.lost)} "
          f"twice={len(report.twice)}")
    assert all(proc.poll() is None for proc in procs), "a worker exited on the outage"
    assert all("redis unavailable" in text for text in texts)
    assert not any("could not start the job" in text for text in texts), (
        "an outage is logged once, not once per job held")
    assert report.exactly_once, (report.lost[:5], list(report.twice.items())[:5])
    assert r.xpending(stream, group)["pending"] == 0
    assert r.xlen(StreamKeys.for_stream(stream).dead) == 0
    r.close()


VISIBLE = 3.0  #: s, the visibility timeout of the two-outages test's worker
LONG = VISIBLE + 1.0  #: s each of its outages lasts: every lease runs out meanwhile


def test_two_long_outages_in_a_row_bring_a_workers_own_deliveries_back_in_batches(
        make_server: Any, spawn_worker: Any, tmp_path: Any) -> None:
    """One worker, two Redis outages in a row, each longer than the visibility timeout:
    both times every lease lapses and the worker lets go of all it held, and both times it
    takes its deliveries back as a batch, never one at a time as suspects (the second time
    they are delivered twice, but what this process let go itself did not kill it).
    Every job applied once, none lost or dead-lettered."""
    stream = "twice-down"
    server, r, keys = _durable_backlog(make_server, stream, 600, 0.05)
    log = tmp_path / "worker.log"
    with log.open("w") as out:
        # a visibility timeout of 3 s: on a busy machine a heartbeat a second late must
        # not let leases run out while Redis answers (those are rightly taken back alone)
        proc = spawn_worker("tests.workers.dedup:StagedLedgerWorker", server.url,
                            "--log-level", "INFO", "--visibility-timeout", str(VISIBLE),
                            env={"SW_TEST_STREAM": stream}, stdout=out)
        _restart_twice_and_drain(server, r, keys, stream, "billing", downs=(LONG, LONG))
    r = redis.Redis.from_url(server.url)
    report = Ledger(r).report(keys)
    text = log.read_text(errors="replace")
    alone = text.count("a suspect, it runs alone")
    batches = text.count("first deliveries, run as a batch")
    print(f"\ntwo long outages: taken back in batches={batches} alone={alone}")
    assert proc.poll() is None, f"the worker exited on the outage:\n{text[-3000:]}"
    assert report.exactly_once, (report.lost[:5], list(report.twice.items())[:5])
    assert r.xpending(stream, "billing")["pending"] == 0
    assert r.xlen(StreamKeys.for_stream(stream).dead) == 0
    assert text.count("lease lost: ") > 0, "no lease lapsed"
    assert batches >= 2, text[-3000:]
    assert alone == 0, f"{alone} deliveries taken back one at a time:\n{text[-3000:]}"
    r.close()


def _durable_backlog(make_server: Any, stream: str, n: int,
                     sleep: float) -> tuple[Any, redis.Redis, list[str]]:
    """A server that fsyncs every write (AOF always), ``n`` jobs on ``stream`` whose
    handlers sleep ``sleep`` s; the server, a client of it and the job keys."""
    server = make_server(appendfsync="always")
    r = redis.Redis.from_url(server.url)
    keys = [f"job-{i}" for i in range(n)]
    with sw.Producer.from_url(server.url) as p:
        p.send_many(stream, [{"sleep": sleep}] * len(keys), keys=keys)
    return server, r, keys


def _restart_twice_and_drain(server: Any, r: redis.Redis, keys: list[str], stream: str,
                             group: str, downs: tuple[float, float] = (0.0, 1.5)) -> None:
    client = [r]  # the current connection (a new one after each restart)
    applied_at_restarts = []
    # a quick restart, then one down longer than the visibility timeout (1 s): the leases
    # lapse meanwhile, so calls still running race the reclaimers of the other worker
    # (``downs``: how long each outage lasts)
    for share, down_for in zip((0.2, 0.5), downs, strict=True):
        wait_for(lambda s=share: client[0].hlen("ledger") >= s * len(keys), 60,  # type: ignore[misc]
                 message=f"{share:.0%} of the jobs applied")
        applied_at_restarts.append(client[0].hlen("ledger"))
        client[0].close()
        server.restart(down_for=down_for)
        client[0] = redis.Redis.from_url(server.url)
    wait_for(lambda: stream_idle(client[0], stream, group), 120,
             message="the stream to drain")
    client[0].close()
    assert applied_at_restarts[0] < len(keys), "the jobs were all done before the restart"
