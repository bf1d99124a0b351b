"""User middleware (``sw.Middleware``): per-job hooks around the handler, in order (after
hooks in reverse), in a context of the job's own, with errors contained; with batch
handlers, cancel, time limits and retries; and the worker-wide hooks."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork.testing import await_for, run_until_idle

STREAM = "mw"
CURRENT: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="")


class Recorder(sw.Middleware):
    """Records each hook call (name, key, extra) into a shared list."""

    def __init__(self, name: str, calls: list[tuple[str, ...]]) -> None:
        self.name = name
        self.calls = calls

    def before(self, msg: sw.Message) -> None:
        self.calls.append((f"{self.name}.before", msg.key))

    async def after(self, msg: sw.Message, outcome: sw.Outcome) -> None:
        self.calls.append((f"{self.name}.after", msg.key, outcome.state))

    def on_failure(self, msg: sw.Message, error: BaseException) -> None:
        self.calls.append((f"{self.name}.on_failure", msg.key, type(error).__name__))


class LogContext(sw.Middleware):
    """Sets the job's key in a context variable the handler reads (a per-job log context)."""

    async def before(self, msg: sw.Message) -> None:
        CURRENT.set(msg.key)


class Reporter(sw.Middleware):
    """An error reporter: records every failure with its exception."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, int, str]] = []

    def on_failure(self, msg: sw.Message, error: BaseException) -> None:
        self.failures.append((msg.key, msg.attempt, repr(error)))


class _Base(sw.StreamWorker):
    stream = STREAM
    group = "g"
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.02


class SeesContext(_Base):
    concurrency = 8

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, str] = {}

    async def handle(self, msg: sw.Message) -> None:
        await asyncio.sleep(0.01)  # other jobs run meanwhile: each keeps its own value
        self.seen[msg.key] = CURRENT.get()


class SyncSeesContext(_Base):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: dict[str, str] = {}

    def handle(self, msg: sw.Message) -> None:  # type: ignore[override]
        self.seen[msg.key] = CURRENT.get()


class Flaky(_Base):
    """Fails while ``msg.attempt < payload["until"]``, times out on ``sleep``."""

    max_deliveries = 3
    timeout = 0.3

    async def handle(self, msg: sw.Message) -> str:
        if msg.payload.get("sleep"):
            await asyncio.sleep(msg.payload["sleep"])
        if msg.attempt < msg.payload.get("until", 0):
            raise ValueError(f"attempt {msg.attempt} fails")
        return "ok"


def _send(url: str, *payloads: dict[str, Any], prefix: str = "k") -> list[str]:
    keys = [f"{prefix}{i}" for i in range(len(payloads))]
    with sw.Producer.from_url(url) as p:
        for key, payload in zip(keys, payloads, strict=True):
            p.send(STREAM, payload, key=key)
    return keys


async def test_a_value_set_in_before_is_seen_by_its_handler_only(redis_url: str,
                                                                 r: redis.Redis) -> None:
    """A per-job log context: the before hook's context variable is the handler's, job by
    job, while eight run at once (async handlers) and in a plain def's thread."""
    keys = _send(redis_url, *[{}] * 40)
    w = SeesContext.from_url(redis_url, middleware=[LogContext()])
    await run_until_idle(w, r)
    assert w.seen == {k: k for k in keys}
    assert CURRENT.get() == "", "nothing leaks into the caller's context"
    s = SyncSeesContext.from_url(redis_url, group="sync", middleware=[LogContext()])
    await run_until_idle(s, r)
    assert s.seen == {k: k for k in keys}


async def test_hooks_run_in_order_and_after_hooks_in_reverse(redis_url: str,
                                                             r: redis.Redis) -> None:
    calls: list[tuple[str, ...]] = []
    _send(redis_url, {})
    w = Flaky.from_url(redis_url, middleware=[Recorder("a", calls), Recorder("b", calls)])
    await run_until_idle(w, r)
    assert calls == [("a.before", "k0"), ("b.before", "k0"),
                     ("b.after", "k0", "done"), ("a.after", "k0", "done")]
    assert w.counts["acked"] == 1


async def test_an_error_reporter_sees_every_failure_and_timeout(redis_url: str,
                                                                r: redis.Redis) -> None:
    """on_failure sees each failed attempt (retried ones too) and the time limit's."""
    reporter = Reporter()
    _send(redis_url, {"until": 3}, {"sleep": 5}, prefix="f")
    w = Flaky.from_url(redis_url, middleware=[reporter])
    await run_until_idle(w, r)
    failed = sorted((k, a, e.split("(")[0]) for k, a, e in reporter.failures)
    assert failed == [("f0", 1, "ValueError"), ("f0", 2, "ValueError"),
                      ("f1", 1, "CancelledError"), ("f1", 2, "CancelledError"),
                      ("f1", 3, "CancelledError")]
    assert w.counts["acked"] == 1 and w.counts["dead_lettered"] == 1
    assert r.xlen("{mw}:dead") == 1


async def test_after_sees_timeout_and_cancelled_outcomes(redis_url: str, r: redis.Redis) -> None:
    calls: list[tuple[str, ...]] = []
    _send(redis_url, {"sleep": 5})
    w = Flaky.from_url(redis_url, max_deliveries=1, middleware=[Recorder("a", calls)])
    await run_until_idle(w, r)
    assert ("a.after", "k0", "timeout") in calls
    assert ("a.on_failure", "k0", "CancelledError") in calls

    class Long(_Base):
        cancel_running = True
        visibility_timeout = 1.5  # heartbeats (which see the cancel) every 0.5 s

        async def handle(self, msg: sw.Message) -> None:
            self.started = True
            await asyncio.sleep(30)

    calls.clear()
    long = Long.from_url(redis_url, group="c", middleware=[Recorder("a", calls)])
    task = asyncio.create_task(long.serve())
    try:
        await await_for(lambda: getattr(long, "started", False), message="the job runs")
        async with sw.AsyncProducer.from_url(redis_url) as p:
            assert await p.cancel(STREAM, "k0", group="c") == "running"
        await await_for(lambda: ("a.after", "k0", "cancelled") in calls,
                        message="after sees the cancel")
    finally:
        long.stop()
        await task
    assert long.counts["cancelled"] == 1


class BrokenBefore(sw.Middleware):
    def before(self, msg: sw.Message) -> None:
        raise RuntimeError("no session for you")


class BrokenAfter(sw.Middleware):
    async def after(self, msg: sw.Message, outcome: sw.Outcome) -> None:
        raise KeyError("reporter down")


async def test_a_before_hook_that_raises_fails_the_job_as_a_handler_would(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The handler is not called; the job is retried, then dead-lettered with the hook's
    error; each failure is logged with its text; the later hooks still run (cleanup)."""
    calls: list[tuple[str, ...]] = []
    _send(redis_url, {})
    ran: list[str] = []

    class Counting(Flaky):
        async def handle(self, msg: sw.Message) -> str:
            ran.append(msg.key)
            return "ok"

    w = Counting.from_url(redis_url, middleware=[BrokenBefore(), Recorder("a", calls)])
    with caplog.at_level(logging.WARNING, logger="streamwork"):
        await run_until_idle(w, r)
    assert ran == []
    assert w.counts["dead_lettered"] == 1 and w.counts["retried"] == 2
    [(_, dead)] = r.xrange("{mw}:dead")
    assert dead[b"error_type"] == b"RuntimeError"
    assert b"no session for you" in dead[b"detail"]
    assert [c for c in calls if c[0] == "a.after"] == [("a.after", "k0", "failed")] * 3
    assert sum("BrokenBefore.before raised RuntimeError: no session for you" in m
               for m in caplog.messages) == 3


async def test_an_after_hook_that_raises_is_logged_and_the_outcome_stands(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    _send(redis_url, {})
    w = Flaky.from_url(redis_url, middleware=[BrokenAfter()])
    with caplog.at_level(logging.ERROR, logger="streamwork"):
        await run_until_idle(w, r)
    assert w.counts["acked"] == 1 and w.counts["retried"] == 0
    with sw.Producer.from_url(redis_url) as p:
        assert p.status(STREAM, "k0", group="g").result == "ok"
    [line] = [rec for rec in caplog.records if "BrokenAfter.after raised" in rec.getMessage()]
    assert "KeyError: 'reporter down'" in line.getMessage() and line.exc_info


class Batch(_Base):
    batch_max = 10
    batch_wait = 0.05

    async def handle_batch(self, msgs: list[sw.Message]) -> list[Any]:
        return [ValueError("odd") if int(m.key[1:]) % 2 else CURRENT.get() for m in msgs]


async def test_batch_handlers_get_each_jobs_hooks_and_outcome(redis_url: str,
                                                              r: redis.Redis) -> None:
    calls: list[tuple[str, ...]] = []
    _send(redis_url, *[{}] * 4)
    w = Batch.from_url(redis_url, max_deliveries=1, middleware=[Recorder("a", calls)])
    await run_until_idle(w, r)
    after = sorted(c for c in calls if c[0] == "a.after")
    assert after == [("a.after", "k0", "done"), ("a.after", "k1", "failed"),
                     ("a.after", "k2", "done"), ("a.after", "k3", "failed")]
    assert sorted(c[1] for c in calls if c[0] == "a.before") == ["k0", "k1", "k2", "k3"]
    assert sorted(c[1] for c in calls if c[0] == "a.on_failure") == ["k1", "k3"]


class Lifecycle(sw.Middleware):
    def __init__(self) -> None:
        self.events: list[str] = []

    async def on_worker_start(self, worker: Any) -> None:
        self.events.append(f"start {type(worker).__name__}")

    def on_worker_stop(self, worker: Any) -> None:
        self.events.append("stop")


async def test_worker_hooks_run_once_and_a_failing_start_stops_the_worker(
        redis_url: str, r: redis.Redis) -> None:
    life = Lifecycle()
    _send(redis_url, {})
    await run_until_idle(Flaky.from_url(redis_url, middleware=[life]), r)
    assert life.events == ["start Flaky", "stop"]

    class Refuses(sw.Middleware):
        def on_worker_start(self, worker: Any) -> None:
            raise OSError("no credentials")

    with pytest.raises(sw.WorkerFailed, match="no credentials") as failed:
        await Flaky.from_url(redis_url, middleware=[Refuses()]).serve()
    assert isinstance(failed.value.cause, OSError)


async def test_the_function_api_takes_middleware(redis_url: str, r: redis.Redis) -> None:
    seen: list[str] = []

    @sw.worker(STREAM, group="fn", middleware=[LogContext()], read_block=0.05)
    async def handle(msg: sw.Message) -> None:
        seen.append(CURRENT.get())

    _send(redis_url, {})
    await run_until_idle(handle.from_url(redis_url), r)
    assert seen == ["k0"]


def test_bad_middleware_is_refused_with_what_to_give() -> None:
    with pytest.raises(sw.ConfigError, match=r"Recorder is a class: give an instance"):
        Flaky.from_url("redis://127.0.0.1:1/0", middleware=[Recorder])
    with pytest.raises(sw.ConfigError, match="defines none of the hooks"):
        Flaky.from_url("redis://127.0.0.1:1/0", middleware=[object()])
    with pytest.raises(sw.ConfigError, match="must be a list of middleware"):
        Flaky.from_url("redis://127.0.0.1:1/0", middleware=LogContext())


async def test_without_middleware_a_job_pays_nothing_for_it(redis_url: str) -> None:
    """No middleware given: the handler is called as it is (no wrapper, no task per job)."""
    w = SeesContext.from_url(redis_url)
    from streamwork._worker.core.consumer import Consumer
    from streamwork._worker.features import FEATURES

    c = Consumer(w.handle, w.config, w.url, "probe", features=FEATURES)
    try:
        assert c.runner.call == w.handle
        assert not c.hooks.wraps
    finally:
        await c.redis.aclose()
