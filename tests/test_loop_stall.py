"""A handler that blocks the event loop is named: an ``async def`` handler calling
``time.sleep`` next to another worker of the same process gets one WARNING naming the
handler, its job and how long it blocked the loop; the Redis timeouts the stalls cause
(each stall outlasts the socket timeout, cut to 3 s here from 10: the replies of the reads
sent before it sit unread past their deadline) are not called an outage."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import redis

import streamwork as sw
from streamwork._redis import connection
from streamwork._worker.core import looplag
from streamwork.testing import await_for

BLOCK = 5.0  #: s the handler blocks the loop, each job (as in the report)
JOBS = 2  #: blocking jobs: the second stall is logged at DEBUG
SOCKET_TIMEOUT = 3.0  #: s, the clients' socket timeout here: shorter than a stall


class Blocker(sw.StreamWorker):
    """The mistake: a blocking call in an async def handler."""

    stream, group = "stall-blocker", "blockers"
    read_block = 0.2
    concurrency = 1

    async def handle(self, msg: sw.Message) -> None:
        time.sleep(BLOCK)  # the bug under test


class Steady(sw.StreamWorker):
    """The other worker of the process, whose jobs the stall holds up."""

    stream, group = "stall-steady", "steady"
    read_block = 0.2

    async def handle(self, msg: sw.Message) -> None:
        await asyncio.sleep(0)


async def test_a_blocking_handler_is_named_and_is_no_outage(
        redis_url: str, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG, logger="streamwork")
    monkeypatch.setitem(connection._OPTIONS, "socket_timeout", SOCKET_TIMEOUT)
    blocker, steady = Blocker.from_url(redis_url), Steady.from_url(redis_url)
    with sw.Producer.from_url(redis_url) as producer:
        for i in range(20):
            producer.send(Steady.stream, {"n": i}, key=f"steady-{i}")
        for i in range(JOBS):
            producer.send(Blocker.stream, {"to": "a@example.com"}, key=f"sleepy-{i}")
    serving = [asyncio.ensure_future(w.serve()) for w in (blocker, steady)]
    try:
        await await_for(lambda: blocker.counts["acked"] == JOBS, timeout=90,
                        message="the blocking job done")
        await await_for(lambda: steady.counts["acked"] == 20, timeout=60,
                        message="the other worker's jobs done")
        # the monitor reports once the loop runs again: wait for its line, not a time
        await await_for(lambda: len(_stalls(caplog)) == JOBS, timeout=10,
                        message="every stall seen")
        await asyncio.sleep(3 * looplag.TICK)  # any later (false) outage line had its turn
    finally:
        for w in (blocker, steady):
            w.stop()
        await asyncio.gather(*serving)
    [line] = _stall_lines(caplog)  # one WARNING: the next stalls by it are at DEBUG
    text = line.getMessage()
    assert "handler Blocker.handle" in text and "key=sleepy-0" in text, text
    assert "test_loop_stall.py" in text and "in handle" in text, text  # where it blocked
    assert "asyncio.to_thread" in text and "plain def" in text, text  # what to do
    took = line.sw["duration_ms"] / 1000  # type: ignore[attr-defined]
    assert BLOCK - 0.5 <= took <= BLOCK + 5, took
    assert line.sw["key"] == "sleepy-0"  # type: ignore[attr-defined]
    outage = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.WARNING
              and rec.getMessage().startswith("redis unavailable")]
    assert outage == [], outage
    excused = [rec for rec in caplog.records if "across a" in rec.getMessage()]
    assert excused, "no read timed out across a stall: the test did not test that"


async def test_a_watch_is_shared_and_stopped_by_its_last_user() -> None:
    """Workers of one loop share one watch; it ends with the last of them."""
    async with looplag.watching() as first, looplag.watching() as second:
        assert first is second is looplag.current()
    assert looplag.current() is None


def test_a_timeout_across_a_stall_is_excused() -> None:
    """`Watch.excuses`: a timeout whose call spent most of its time in stalls of the loop
    is theirs; a connection refused, a call begun after the stall, or a long wait with a
    short stall in it (a real outage) is not."""
    watch = looplag.Watch(asyncio.new_event_loop())
    try:
        now = time.monotonic()
        watch.beat = now
        watch.stalls.append((now - 5.0, now - 0.1))
        timeout = redis.exceptions.TimeoutError("Timeout reading from 127.0.0.1:6379")
        assert watch.excuses(timeout, now - 6) == pytest.approx(4.9, abs=0.05)
        assert watch.excuses(redis.exceptions.ConnectionError("refused"), now - 6) is None
        assert watch.excuses(timeout, now - 0.05) is None
        assert watch.excuses(timeout, now - 12) is None  # 4.9 s of 12: Redis was slow too
        watch.stalls.clear()
        watch.beat = now - 3.0  # stuck since then: the monitor has not run yet
        assert watch.excuses(timeout, now - 3.5) == pytest.approx(2.9, abs=0.05)
    finally:
        watch.loop.close()


def _stalls(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [rec for rec in caplog.records
            if rec.getMessage().startswith("the event loop was blocked")]


def _stall_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [rec for rec in _stalls(caplog) if rec.levelno == logging.WARNING]


def test_only_a_loop_held_in_one_place_is_named(caplog: pytest.LogCaptureFixture) -> None:
    """`Watch._report`: the same handler seen holding the loop for half a STALL or more is
    named at WARNING; samples that keep changing (a process starved of CPU, the loop
    moving on) or streamwork's own tasks only give a DEBUG line."""
    caplog.set_level(logging.DEBUG, logger="streamwork")
    watch = looplag.Watch(asyncio.new_event_loop())
    try:
        t = time.monotonic()
        flicker = [(t + i * 0.05, f"handler H.handle (job key=k{i} entry_id=1-{i})", {})
                   for i in range(12)]
        own = [(t, "task streamwork-flusher", {}), (t + 0.9, "task streamwork-flusher", {})]
        held = [(t, "handler H.handle (job key=k entry_id=1-0, at app.py:3 in handle)",
                 {"key": "k"}), (t + 0.6, "handler H.handle (job key=k entry_id=1-0, at "
                                          "app.py:3 in handle)", {"key": "k"})]
        for samples in (flicker, own, []):
            watch._report(2.0, samples)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        watch._report(2.0, held)
        [line] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "by handler H.handle (job key=k" in line.getMessage()
    finally:
        watch.loop.close()
