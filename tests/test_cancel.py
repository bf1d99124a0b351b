"""Cancel: a queued, delayed or waiting job never runs once cancelled (acked,
counted, status "cancelled"); a running one sees msg.cancelled at the next heartbeat (and
an async one is cancelled with cancel_running); a done one is left alone."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._worker.core.loops import heartbeat
from streamwork.testing import await_for, run_until_idle

STREAM, GROUP = "mail", "senders"


class Mailer(sw.StreamWorker):
    stream, group = STREAM, GROUP
    read_block = 0.05
    retry_delay = 0.2
    retry_max_delay = 0.2
    visibility_timeout = 1.5

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.ran: list[str] = []
        self.saw_cancel: dict[str, float] = {}
        self.started: dict[str, float] = {}

    async def handle(self, msg: sw.Message) -> str:
        self.ran.append(msg.key)
        p = msg.payload
        if p.get("fail_first") and msg.attempt == 1:
            raise RuntimeError("first attempt fails")
        if p.get("wait_cancel"):
            self.started[msg.key] = time.monotonic()
            while not msg.cancelled:
                await asyncio.sleep(0.01)
            self.saw_cancel[msg.key] = time.monotonic()
            raise RuntimeError("stopping: cancelled")
        if p.get("sleep"):
            self.started[msg.key] = time.monotonic()
            await asyncio.sleep(p["sleep"])
        return msg.key


async def test_queued_and_delayed_jobs_never_run(redis_url: str, r: redis.Redis) -> None:
    with sw.Producer.from_url(redis_url) as p:
        r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        p.send(STREAM, {}, key="queued")
        p.send(STREAM, {}, key="later", delay=0.5)
        p.send(STREAM, {}, key="kept")
        assert p.cancel(STREAM, "queued", reason="customer asked") == "unknown"
        assert p.cancel(STREAM, "later") == "unknown"
        w = Mailer.from_url(redis_url)
        task = asyncio.create_task(w.serve())
        try:
            await await_for(lambda: w.counts["cancelled"] == 2 and "kept" in w.ran, timeout=20)
        finally:
            w.stop()
            await task
        assert w.ran == ["kept"]
        st = p.status(STREAM, "queued")
        assert (st.state, st.reason, st.finished) == ("cancelled", "customer asked", True)
        assert p.status(STREAM, "later").state == "cancelled"
        with pytest.raises(sw.JobFailed, match="cancelled: customer asked"):
            p.result(STREAM, "queued", timeout=1)
        assert int(r.xpending(STREAM, GROUP)["pending"]) == 0
        # a done job is left alone
        assert p.cancel(STREAM, "kept") == "done"
        assert p.status(STREAM, "kept").state == "done"


async def test_a_waiting_job_is_not_retried(redis_url: str, r: redis.Redis) -> None:
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"fail_first": True}, key="flaky")
        w = Mailer.from_url(redis_url, retry_delay=2.0, retry_max_delay=2.0)
        task = asyncio.create_task(w.serve())
        try:
            await await_for(lambda: p.status(STREAM, "flaky", group=GROUP).state == "waiting",
                            timeout=10)
            assert p.cancel(STREAM, "flaky", group=GROUP) == "waiting"
            await await_for(lambda: w.counts["cancelled"] == 1, timeout=15)
        finally:
            w.stop()
            await task
        assert w.ran == ["flaky"] and w.counts["acked"] == 0
        assert p.status(STREAM, "flaky").state == "cancelled"


async def test_a_running_job_sees_it_at_the_next_heartbeat(
        redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler sees msg.cancelled at the first heartbeat after the cancel (counted by
    beats, not by a clock a busy machine stretches); what it raises then ends the job
    cancelled, not retried."""
    beats: list[tuple[float, int]] = []  # (when a beat began, cancels seen when it ended)
    real_beat = heartbeat.beat

    async def counted_beat(ctx: Any, h: Any) -> None:
        began = time.monotonic()
        await real_beat(ctx, h)
        beats.append((began, ctx.tally.counts["cancel_seen"]))

    monkeypatch.setattr(heartbeat, "beat", counted_beat)
    w = Mailer.from_url(redis_url)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"wait_cancel": True}, key="long")
        task = asyncio.create_task(w.serve())
        try:
            await await_for(lambda: "long" in w.started, timeout=10)
            st = p.status(STREAM, "long", group=GROUP)
            assert st.state == "running" and st.reason == ""
            assert p.cancel(STREAM, "long", group=GROUP, reason="stop") == "running"
            cancelled = time.monotonic()
            assert p.status(STREAM, "long", group=GROUP).reason == "cancel requested: stop"
            await await_for(lambda: "long" in w.saw_cancel, timeout=10)
            await await_for(lambda: w.counts["cancelled"] == 1, timeout=10)
        finally:
            w.stop()
            await task
    after = [seen for began, seen in beats if began >= cancelled]
    assert after and after[0] == 1, f"cancels seen by the beats after the cancel: {after}"
    assert w.ran == ["long"] and w.counts["retried"] == 0 and w.counts["dead_lettered"] == 0
    assert p.status(STREAM, "long", group=GROUP).state == "cancelled"
    assert r.xlen("{mail}:dead") == 0


async def test_cancel_running_cancels_an_async_handler(redis_url: str,
                                                       r: redis.Redis) -> None:
    w = Mailer.from_url(redis_url, cancel_running=True)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"sleep": 30}, key="slow")
        task = asyncio.create_task(w.serve())
        try:
            await await_for(lambda: "slow" in w.started, timeout=10)
            assert p.cancel(STREAM, "slow", group=GROUP) == "running"
            await await_for(lambda: w.counts["cancelled"] == 1, timeout=10)
        finally:
            w.stop()
            await task
        assert p.status(STREAM, "slow", group=GROUP).state == "cancelled"
        assert w.counts["retried"] == 0 and int(r.xpending(STREAM, GROUP)["pending"]) == 0


async def test_cancel_on_a_partitioned_stream(redis_url: str, r: redis.Redis) -> None:
    with sw.Producer.from_url(redis_url, partitions=4) as p:
        p.send_many(STREAM, [{}] * 8, keys=[f"k{i}" for i in range(8)])
        assert p.cancel(STREAM, "k5", group=GROUP) == "unknown"
        w = Mailer.from_url(redis_url, partitions=4)
        await run_until_idle(w, r, timeout=20)
        assert sorted(w.ran) == sorted(f"k{i}" for i in range(8) if i != 5)
        assert p.status(STREAM, "k5", group=GROUP).state == "cancelled"


def test_bad_cancel_input(redis_url: str) -> None:
    with sw.Producer.from_url(redis_url) as p:
        with pytest.raises(sw.ConfigError, match="ttl"):
            p.cancel(STREAM, "k", group=GROUP, ttl=0)
        with pytest.raises(sw.ConfigError, match="key"):
            p.cancel(STREAM, "", group=GROUP)


def test_cli_cancel(redis_url: str, r: redis.Redis) -> None:
    from click.testing import CliRunner

    from streamwork._cli.main import main
    r.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {}, key="k1")
        out = CliRunner().invoke(main, ["cancel", STREAM, "k1", "--reason", "dup order",
                                        "--url", redis_url])
        assert out.exit_code == 0, out.output
        assert "k1: not read by the group yet (or never sent): it will not run" in out.output
        st = p.status(STREAM, "k1")
        assert (st.state, st.reason) == ("cancelled", "dup order")
        again = CliRunner().invoke(main, ["cancel", STREAM, "k1", "--url", redis_url])
        assert "already cancelled" in again.output
        bad = CliRunner().invoke(main, ["cancel", "nope", "k1", "--url", redis_url])
        assert bad.exit_code == 1 and "nope" in bad.output
