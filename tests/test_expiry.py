"""Per-job expiry (``expires=``): a job not started by then is dropped as ``expired`` —
never run, acknowledged, counted, its status says so, its chained sends never happen —
whether it waited in the stream, read ahead by a worker, or for a retry; and a bad value
is refused with nothing enqueued."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import streamwork as sw
from streamwork._cli.main import main
from streamwork._wire.keys import StreamKeys
from streamwork.testing import await_for, run_until_idle

STREAM = "exp"
KEYS = StreamKeys.for_stream(STREAM)


class Recording(sw.StreamWorker):
    """Records each key it runs; ``sleep`` s in the handler; ``fail`` on attempt 1;
    ``send``: a chained job to stream "next"."""

    stream = STREAM
    group = "g"
    read_block = 0.05
    retry_delay = 0.05
    retry_max_delay = 0.1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ran: list[str] = []

    async def handle(self, msg: sw.Message) -> str:
        self.ran.append(msg.key)
        await asyncio.sleep(msg.payload.get("sleep", 0))
        if msg.payload.get("fail") and msg.attempt == 1:
            raise ValueError("first attempt fails")
        if msg.payload.get("send"):
            msg.send("next", {"from": msg.key})
        return "ran"


def _pending(r: redis.Redis, group: str = "g") -> int:
    return int(r.xpending(STREAM, group)["pending"])


async def test_a_job_not_started_by_its_expiry_is_dropped_as_expired(redis_url: str,
                                                                     r: redis.Redis) -> None:
    """While the group is paused a job's expiry passes: after the resume it never runs, its
    status is expired (with why), it is counted, acknowledged, not dead-lettered; a job
    without expiry sent with it runs; a cancel of it changes nothing."""
    with sw.Producer.from_url(redis_url) as p:
        p.pause(STREAM, "g")
        p.send(STREAM, {}, key="late", expires=0.3)
        p.send(STREAM, {}, key="fine", expires=3600)
        p.send(STREAM, {}, key="plain")
        await asyncio.sleep(0.5)  # the expiry passes while nothing may start
        p.resume(STREAM, "g")
        w = Recording.from_url(redis_url)
        await run_until_idle(w, r)
        assert sorted(w.ran) == ["fine", "plain"]
        st = p.status(STREAM, "late", group="g")
        assert st.state == "expired" and st.finished
        assert "not started before it expired at" in st.reason
        assert p.status(STREAM, "fine", group="g").state == "done"
        assert p.cancel(STREAM, "late", group="g") == "expired"
        assert p.status(STREAM, "late", group="g").state == "expired"
        with pytest.raises(sw.JobFailed):
            p.result(STREAM, "late", group="g", timeout=1)
    assert w.counts["expired"] == 1 and w.counts["dropped"] == 1
    assert w.counts["acked"] == 2 and w.counts["dead_lettered"] == 0
    assert _pending(r) == 0 and r.xlen(KEYS.dead) == 0


async def test_a_job_read_ahead_that_expires_while_it_waits_never_runs_nor_sends(
        redis_url: str, r: redis.Redis) -> None:
    """One runner busy with a long job; the next, read ahead and held, expires meanwhile:
    it is dropped when its turn comes, and the job its handler would have chained is never
    enqueued."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 1.0}, key="long")
        p.send(STREAM, {"send": True}, key="short-lived", expires=0.4)
    w = Recording.from_url(redis_url, concurrency=1)
    await run_until_idle(w, r)
    assert w.ran == ["long"]
    assert r.exists("next") == 0 or r.xlen("next") == 0
    with sw.Producer.from_url(redis_url) as p:
        assert p.status(STREAM, "short-lived", group="g").state == "expired"
    assert w.counts["expired"] == 1


async def test_a_retry_due_after_the_expiry_is_dropped(redis_url: str,
                                                       r: redis.Redis) -> None:
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"fail": True}, key="flaky", expires=0.5)
        w = Recording.from_url(redis_url, retry_delay=0.8, retry_max_delay=0.8)
        await run_until_idle(w, r)
        st = p.status(STREAM, "flaky", group="g")
    assert w.ran == ["flaky"], "the first attempt ran, the retry did not"
    assert st.state == "expired" and st.attempts == 2
    assert w.counts["retried"] == 1 and w.counts["expired"] == 1


async def test_options_read_back_and_a_job_in_time_runs(redis_url: str,
                                                        r: redis.Redis) -> None:
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    seen: list[Any] = []

    class Sees(Recording):
        async def handle(self, msg: sw.Message) -> str:
            seen.append(msg.options.get("expires"))
            return "ran"

    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="dated", expires=until)
    await run_until_idle(Sees.from_url(redis_url), r)
    [read] = seen
    assert isinstance(read, dt.datetime) and read.tzinfo is not None
    assert abs(read - until) <= dt.timedelta(milliseconds=1)  # carried in whole ms


async def test_expiry_without_job_records_and_in_a_batch(redis_url: str, r: redis.Redis) -> None:
    """dedup off: the expired job is acknowledged unrun and counted (no record to say so);
    a batch handler's expired job is dropped while the others of the call run."""
    with sw.Producer.from_url(redis_url) as p:
        p.pause(STREAM, "off")
        p.pause(STREAM, "batch")
        p.send(STREAM, {}, key="gone", expires=0.2)
        p.send(STREAM, {}, key="kept")
        await asyncio.sleep(0.4)
        p.resume(STREAM, "off")
        p.resume(STREAM, "batch")
    off = Recording.from_url(redis_url, group="off", dedup=False)
    await run_until_idle(off, r)
    assert off.ran == ["kept"] and off.counts["expired"] == 1
    assert _pending(r, "off") == 0

    calls: list[list[str]] = []

    class Batch(sw.StreamWorker):
        stream = STREAM
        group = "batch"
        read_block = 0.05

        async def handle_batch(self, msgs: list[sw.Message]) -> None:
            calls.append([m.key for m in msgs])

    b = Batch.from_url(redis_url)
    await run_until_idle(b, r)
    assert [k for call in calls for k in call] == ["kept"]
    assert b.counts["expired"] == 1 and _pending(r, "batch") == 0


@pytest.mark.parametrize("bad", [-1, 0, float("inf"), dt.datetime(2030, 1, 1),
                                 dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc), "soon"])
def test_a_bad_expiry_is_refused_and_nothing_is_enqueued(redis_url: str, r: redis.Redis,
                                                        bad: Any) -> None:
    with sw.Producer.from_url(redis_url) as p, pytest.raises(sw.ConfigError, match="expires"):
        p.send(STREAM, {}, expires=bad)
    assert r.exists(STREAM) == 0


async def test_the_command_line_sends_with_an_expiry_and_shows_the_state(
        redis_url: str, r: redis.Redis) -> None:
    runner = CliRunner()
    with sw.Producer.from_url(redis_url) as p:
        p.pause(STREAM, "g")
    sent = runner.invoke(main, ["send", STREAM, "{}", "--key", "cli", "--expires", "0.2",
                                "--url", redis_url])
    assert sent.exit_code == 0, sent.output
    await asyncio.sleep(0.4)
    with sw.Producer.from_url(redis_url) as p:
        p.resume(STREAM, "g")
    w = Recording.from_url(redis_url)
    await run_until_idle(w, r)
    shown = runner.invoke(main, ["job", STREAM, "cli", "--group", "g", "--url", redis_url])
    assert shown.exit_code == 0 and "expired" in shown.output, shown.output
    await await_for(lambda: w.counts["expired"] == 1, timeout=5)
