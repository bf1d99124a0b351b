"""Cancel under faults and beside the other features: a job cancelled before its handler
starts never starts (read ahead, waiting for its in-place retry), one cancelled while it
runs ends cancelled whatever its handler does next (raises before the next heartbeat,
returns, its worker is SIGKILLed), and a delivery whose lease was lost while it waited
for a rate-limit token does not start. Each test keeps a ledger of handler starts in Redis
(tests/workers/cancel.py)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._redis.server import RedisServer
from streamwork._wire.keys import StreamKeys
from streamwork.testing import await_for, wait_for
from tests.workers.cancel import EFFECTS, GROUP, RUNS, STREAM, Slow, fail_key, release_key

KEYS = StreamKeys.for_stream(STREAM).group(GROUP)


class SlowOrdered(Slow):
    """Ordered mode: a failed job is retried in place, after 3 s."""

    ordered = True
    retry_delay = 3.0
    retry_max_delay = 3.0


class Paced(Slow):
    """One job every 5 s for the whole group."""

    concurrency = 2
    rate_limit = "12/m"


def _runs(r: redis.Redis) -> list[str]:
    return [v.decode() for v in r.lrange(RUNS, 0, -1)]


def _settled(r: redis.Redis, p: sw.Producer, key: str, state: str) -> bool:
    """The job's record says ``state`` and nothing of it waits anywhere in Redis."""
    pending = int(r.xpending(STREAM, GROUP)["pending"])
    if r.exists(KEYS.retry):
        pending += int(r.xpending(KEYS.retry, GROUP)["pending"])
    return (p.status(STREAM, key, group=GROUP).state == state and pending == 0
            and r.zcard(KEYS.retries) == 0)


async def _serving(w: sw.StreamWorker) -> asyncio.Task[None]:
    return asyncio.create_task(w.serve())


async def _stop(*pairs: tuple[sw.StreamWorker, asyncio.Task[None]]) -> None:
    for w, _ in pairs:
        w.stop()
    for _, task in pairs:
        await task
    for w, _ in pairs:
        if getattr(w, "ledger", None) is not None:
            await w.ledger.aclose()  # type: ignore[attr-defined]


async def test_a_read_ahead_job_cancelled_never_starts(redis_url: str, r: redis.Redis) -> None:
    """Behind a running job, a job already read by the worker is "queued", not "running";
    cancelled there, it never starts."""
    w = Slow.from_url(redis_url)  # concurrency 1: the second job waits in the run queue
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="first")
        p.send(STREAM, {}, key="second")
        task = await _serving(w)
        try:
            await await_for(lambda: _runs(r) == ["first:1"], message="the first job to start")
            await await_for(lambda: p.status(STREAM, "second", group=GROUP).state == "queued",
                            message="the second job to be read ahead")
            assert p.status(STREAM, "first", group=GROUP).state == "running"
            assert p.cancel(STREAM, "second", group=GROUP, reason="customer asked") == "queued"
            r.set(release_key("first"), 1)
            r.set(release_key("second"), 1)
            await await_for(lambda: _settled(r, p, "second", "cancelled")
                            and p.status(STREAM, "first", group=GROUP).state == "done",
                            message="the first done, the second acknowledged as cancelled")
        finally:
            await _stop((w, task))
        assert _runs(r) == ["first:1"]
        assert r.lrange(EFFECTS, 0, -1) == [b"first"]
        st = p.status(STREAM, "second", group=GROUP)
        assert (st.state, st.reason) == ("cancelled", "customer asked")
        assert w.counts["cancelled"] == 1


async def test_a_running_job_that_raises_before_the_heartbeat_ends_cancelled(
        redis_url: str, r: redis.Redis) -> None:
    """The cancel is in the record, not only in what the next heartbeat tells the handler:
    a handler that raises first is not retried."""
    w = Slow.from_url(redis_url, visibility_timeout=30.0)  # next heartbeat in 10 s
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="job")
        task = await _serving(w)
        try:
            await await_for(lambda: _runs(r) == ["job:1"], message="the job to start")
            assert p.cancel(STREAM, "job", group=GROUP) == "running"
            r.set(fail_key("job"), 1)
            await await_for(lambda: _settled(r, p, "job", "cancelled"),
                            message="the job to end cancelled")
        finally:
            await _stop((w, task))
        assert _runs(r) == ["job:1"]
        assert r.xlen(StreamKeys.for_stream(STREAM).dead) == 0


async def test_a_running_job_that_returns_after_a_cancel_ends_cancelled(
        redis_url: str, r: redis.Redis) -> None:
    """Returning normally after the cancel does not complete the job: it ends cancelled and
    its staged writes are not applied."""
    w = Slow.from_url(redis_url, visibility_timeout=30.0)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="job")
        task = await _serving(w)
        try:
            await await_for(lambda: _runs(r) == ["job:1"], message="the job to start")
            assert p.cancel(STREAM, "job", group=GROUP, reason="stop") == "running"
            assert p.status(STREAM, "job", group=GROUP).reason == "cancel requested: stop"
            r.set(release_key("job"), 1)
            await await_for(lambda: _settled(r, p, "job", "cancelled"),
                            message="the job to end cancelled")
        finally:
            await _stop((w, task))
        assert r.llen(EFFECTS) == 0
        with pytest.raises(sw.JobFailed, match="cancelled: stop"):
            p.result(STREAM, "job", group=GROUP, timeout=1)


def test_a_cancel_outlives_the_worker_that_ran_the_job(
        redis_url: str, r: redis.Redis,
        spawn_worker: Callable[..., Any]) -> None:
    """Cancelled while running, then its worker is SIGKILLed: the copy another worker
    reclaims is acknowledged as cancelled, not run again."""
    first = spawn_worker("tests.workers.cancel:Slow", redis_url)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="job")
        wait_for(lambda: _runs(r) == ["job:1"], message="the job to start")
        assert p.cancel(STREAM, "job", group=GROUP) == "running"
        first.send_signal(signal.SIGKILL)
        first.wait()
        spawn_worker("tests.workers.cancel:Slow", redis_url)
        r.set(release_key("job"), 1)  # were it run again, it would finish
        wait_for(lambda: _settled(r, p, "job", "cancelled"), timeout=30,
                 message="the reclaimed copy to be acknowledged as cancelled")
    assert _runs(r) == ["job:1"]
    assert r.llen(EFFECTS) == 0


async def test_a_job_waiting_for_its_in_place_retry_is_cancelled(
        redis_url: str, r: redis.Redis) -> None:
    """Ordered mode retries a failed job in place: while it waits it says "waiting", and
    cancelled then, attempt 2 never starts."""
    r.set(fail_key("job"), 1)
    w = SlowOrdered.from_url(redis_url)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="job")
        task = await _serving(w)
        try:
            await await_for(lambda: p.status(STREAM, "job", group=GROUP).state == "waiting",
                            message="the job to wait for its in-place retry")
            assert _runs(r) == ["job:1"]
            assert p.cancel(STREAM, "job", group=GROUP) == "waiting"
            r.delete(fail_key("job"))
            r.set(release_key("job"), 1)
            await await_for(lambda: _settled(r, p, "job", "cancelled"), timeout=20,
                            message="the job to end cancelled")
        finally:
            await _stop((w, task))
        assert _runs(r) == ["job:1"]
        assert r.llen(EFFECTS) == 0


async def test_a_delivery_lost_while_waiting_for_a_rate_token_does_not_start(
        make_server: Callable[..., RedisServer]) -> None:
    """A job waits for the group's rate token while Redis stalls past its lease: another
    worker reclaims it, and the first, when its token comes, does not start it."""
    server = make_server()
    url = server.url
    r = redis.Redis.from_url(url)
    first, second = Paced.from_url(url), Paced.from_url(url)
    try:
        with sw.Producer.from_url(url) as p:
            r.set(release_key("a"), 1)
            r.set(release_key("b"), 1)
            p.send(STREAM, {}, key="a")
            p.send(STREAM, {}, key="b")
            one = await _serving(first)
            two: asyncio.Task[None] | None = None
            try:
                # one token for the two: either may take it (two runners ask at once)
                await await_for(lambda: len(_runs(r)) == 1, message="one job to run")
                ran = _runs(r)[0].split(":")[0]
                waits = "b" if ran == "a" else "a"
                await await_for(lambda: p.status(STREAM, waits, group=GROUP).state == "queued",
                                message="the other job to wait for a token")
                server.pause()  # Redis stalls past the lease (visibility_timeout 1.5 s)
                await asyncio.sleep(3.5)  # the stall itself, not a wait for a result
                server.resume()
                await await_for(lambda: first.counts["lock_lost"] >= 1, timeout=30,
                                message="the first worker to see its lease lost")
                two = await _serving(second)
                await await_for(lambda: _settled(r, p, waits, "done"), timeout=60,
                                message="the waiting job to be done (by the second worker)")
                await await_for(lambda: first._consumer is not None
                                and first._consumer.holdings.held() == 0, timeout=30,
                                message="the first worker to let the job go")
            finally:
                await _stop((first, one), *(((second, two),) if two is not None else ()))
        # the job that ran may run again (its completion could not be written while Redis
        # stalled: its effect is staged, so it lands once); the waiting one never started
        # on the first worker
        assert len([run for run in _runs(r) if run.startswith(f"{waits}:")]) == 1, _runs(r)
        assert sorted(r.lrange(EFFECTS, 0, -1)) == [b"a", b"b"]
    finally:
        r.close()


async def test_cancel_with_redlock_leases(redis_url: str, r: redis.Redis,
                                          make_server: Callable[..., RedisServer]) -> None:
    """With lock_urls the job record is not the lease, yet a read-ahead job cancelled never
    starts and a running one is told (msg.cancelled) and ends cancelled, even past the
    record's first TTL (the heartbeat keeps the record)."""
    masters = [make_server().url for _ in range(3)]
    # 2 s: at 1 s a very busy machine (load 16) kept the first job from starting for 30 s
    # (a Redlock lease over three masters could not be taken within its validity)
    w = Slow.from_url(redis_url, lock_urls=masters, visibility_timeout=2.0)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="first")
        p.send(STREAM, {}, key="second")
        task = await _serving(w)
        try:
            await await_for(lambda: _runs(r) == ["first:1"], message="the first job to start")
            await await_for(lambda: p.status(STREAM, "second", group=GROUP).state == "queued",
                            message="the second job to be read ahead")
            assert p.cancel(STREAM, "second", group=GROUP) == "queued"
            await asyncio.sleep(3.0)  # past the record's first TTL (2 s): the job runs on
            assert p.status(STREAM, "first", group=GROUP).state == "running"
            assert p.cancel(STREAM, "first", group=GROUP, reason="late") == "running"
            r.set(release_key("first"), 1)
            r.set(release_key("second"), 1)
            await await_for(lambda: _settled(r, p, "first", "cancelled")
                            and _settled(r, p, "second", "cancelled"),
                            message="both jobs to end cancelled")
        finally:
            await _stop((w, task))
    assert _runs(r) == ["first:1"]
    assert r.llen(EFFECTS) == 0


async def test_cancel_says_it_can_do_nothing_with_dedup_off(redis_url: str,
                                                            r: redis.Redis) -> None:
    """Without job records a cancel cannot stop anything, and says so."""
    r.set(release_key("job"), 1)
    w = Slow.from_url(redis_url, dedup=False)
    with sw.Producer.from_url(redis_url) as p:
        task = await _serving(w)
        try:
            await await_for(lambda: r.hget(KEYS.settings, "dedup") == b"0",
                            message="the worker to declare its group")
            assert p.cancel(STREAM, "job", group=GROUP) == "ignored"
            p.send(STREAM, {}, key="job")
            await await_for(lambda: r.lrange(EFFECTS, 0, -1) == [b"job"],
                            message="the job to run")
        finally:
            await _stop((w, task))
