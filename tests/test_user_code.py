"""User code the worker calls never stops one of its internal loops.

Each place user code runs gets an error no library expects (ZeroDivisionError,
LookupError, an exception whose __str__ raises, a message UTF-8 cannot encode): payload
validators, concurrency_key, on_start / on_stop, handler exceptions and their text, the
handler's result, a user's local_cache, span recording; and a schedule's payload must fit
the worker's payload_type when the worker is built, not fail at every tick.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider

import streamwork as sw
from streamwork._ops.deadletter import list_dead
from streamwork._telemetry.api import end_span
from streamwork._wire.codec import BODY_FIELD, decode_fields
from streamwork._wire.records import done_record, parse
from streamwork.testing import await_for, run_until_idle, wait_for
from tests.workers.usercode import STREAM as TYPED_STREAM
from tests.workers.usercode import Line, Order, StartFails

ROOT = Path(__file__).resolve().parent.parent
STREAM, GROUP = "user-code", "users"


# ---- payload validators, across processes ----------------------------------------------


def _blocked_readers(r: redis.Redis) -> int:
    """Connections blocked in XREADGROUP right now (a worker that is up and reading)."""
    return sum(1 for c in r.client_list() if c.get("cmd") == "xreadgroup" and "b" in c["flags"])


def _wait_settled(r: redis.Redis, procs: list[subprocess.Popen[bytes]], keys: list[str],
                  timeout: float) -> None:
    """Wait until every key is in the ledger and one dead letter exists; fail at once if a
    worker process exits meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            assert p.poll() is None, f"worker process {p.pid} exited ({p.returncode})"
        ledger = r.hgetall("ledger")
        dead = list_dead(r, TYPED_STREAM, 10)
        if len(ledger) >= len(keys) and dead:
            return
        assert time.monotonic() < deadline, (
            f"after {timeout:g}s: {len(ledger)}/{len(keys)} jobs ran, {len(dead)} dead letters")
        time.sleep(0.1)


@pytest.mark.parametrize(("target", "bad", "error", "processes"), [
    ("tests.workers.usercode:PydanticOrders", Order, "ZeroDivisionError: integer division or "
     "modulo by zero", 0),
    ("tests.workers.usercode:DataclassLines", Line, "LookupError: no price list has item 0", 2),
], ids=["pydantic-two-runs", "dataclass-processes-2"])
def test_a_validator_raising_anything_dead_letters_only_its_job(
        r: redis.Redis, redis_url: str, spawn_worker: Callable[..., subprocess.Popen[bytes]],
        target: str, bad: type, error: str, processes: int) -> None:
    """Two worker processes (two `streamwork run`, or one with --processes 2) with a
    payload_type whose validator raises an unexpected error for one payload among valid
    ones: that job is dead-lettered (payload:invalid, the error's type and message, the
    original bytes), every valid job runs exactly once, and no worker dies."""
    if processes:
        procs = [spawn_worker(target, redis_url, "--processes", str(processes))]
    else:
        procs = [spawn_worker(target, redis_url) for _ in range(2)]
    wait_for(lambda: _blocked_readers(r) >= 2, 60, interval=0.1,
             message="2 worker processes waiting in XREADGROUP")
    keys = [f"job-{i}" for i in range(40)]
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(TYPED_STREAM, [{"n": i + 1} for i in range(20)], keys=keys[:20])
        p.send(TYPED_STREAM, {"n": 0}, key="bad")
        p.send_many(TYPED_STREAM, [{"n": i + 1} for i in range(20, 40)], keys=keys[20:])
    bad_body = next(f[BODY_FIELD] for _, f in r.xrange(TYPED_STREAM)
                    if decode_fields(f[BODY_FIELD])[0] == "bad")
    _wait_settled(r, procs, keys, 60)
    ledger = {k.decode(): int(v) for k, v in r.hgetall("ledger").items()}
    assert ledger == dict.fromkeys(keys, 1)
    [dead] = list_dead(r, TYPED_STREAM, 10)
    assert (dead.key, dead.reason, dead.attempts) == ("bad", "payload:invalid", 1)
    assert bad.__name__ in dead.detail and error in dead.detail, dead.detail
    assert dead.original[BODY_FIELD.decode()] == bad_body
    for proc in procs:
        assert proc.poll() is None, "a worker process died"
        os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        assert proc.wait(timeout=60) == 0


# ---- concurrency_key ---------------------------------------------------------------------


class Keyed(sw.StreamWorker):
    stream, group = STREAM, GROUP
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.05
    max_deliveries = 2
    concurrency_per_key = 1

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.ran: list[str] = []

    def concurrency_key(self, msg: sw.Message) -> str:
        return str(msg.payload["customer"])  # LookupError (KeyError) without one

    async def handle(self, msg: sw.Message) -> None:
        self.ran.append(msg.key)


async def test_a_concurrency_key_that_raises_fails_its_job_like_a_handler(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The job whose key cannot be computed never runs uncapped: it fails like a handler
    error (retried, then dead-lettered with the error's type and message), the failure is
    logged with the message, and the jobs beside it run."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"customer": 1}, key="a")
        p.send(STREAM, {"no customer": 2}, key="bad")
        p.send(STREAM, {"customer": 3}, key="c")
    w = Keyed.from_url(redis_url)
    with caplog.at_level(logging.WARNING, logger="streamwork.worker"):
        await run_until_idle(w, r, timeout=30)
    assert sorted(w.ran) == ["a", "c"]
    [dead] = list_dead(r, STREAM, 10)
    assert (dead.key, dead.reason, dead.error_type, dead.attempts) == (
        "bad", "max_deliveries", "KeyError", 2)
    assert "'customer'" in dead.detail
    assert w.counts["retried"] == 1 and w.counts["dead_lettered"] == 1
    assert "concurrency_key raised KeyError: 'customer'" in caplog.text


# ---- on_start / on_stop ------------------------------------------------------------------


async def test_on_start_that_raises_fails_the_start_loudly(redis_url: str) -> None:
    """serve() raises WorkerFailed naming on_start, with the error as its cause."""
    w = StartFails.from_url(redis_url)
    with pytest.raises(sw.WorkerFailed, match="on_start failed with LookupError: no such "
                                              "database: billing") as info:
        await asyncio.wait_for(w.serve(), 30)
    assert isinstance(info.value.cause, LookupError)


def test_on_start_that_raises_fails_streamwork_run_with_a_clear_error(redis_url: str) -> None:
    """`streamwork run` exits 1 and says which hook failed and why."""
    out = subprocess.run(
        [sys.executable, "-m", "streamwork", "run", "tests.workers.usercode:StartFails",
         "--url", redis_url], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "WorkerFailed" in last and "on_start failed with LookupError: no such database: " \
        "billing" in last, out.stderr


async def test_on_stop_that_raises_is_logged_and_the_stop_completes(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """The jobs are done and the worker stopped: on_stop's error is logged, not raised."""

    class StopFails(sw.StreamWorker):
        stream, group = STREAM, GROUP
        read_block = 0.05

        async def handle(self, msg: sw.Message) -> None:
            pass

        def on_stop(self) -> None:  # type: ignore[override]
            raise ZeroDivisionError("division by zero in on_stop")

    sw.Producer.from_url(redis_url).send(STREAM, {}, key="one")
    w = StopFails.from_url(redis_url)
    with caplog.at_level(logging.ERROR, logger="streamwork.worker"):
        await asyncio.wait_for(run_until_idle(w, r, timeout=30), 60)
    assert w.counts["acked"] == 1
    assert "on_stop raised ZeroDivisionError: division by zero in on_stop" in caplog.text


# ---- what handlers raise and return -------------------------------------------------------


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ZeroDivisionError("no text for you")


class Unlengthy(dict):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise LookupError("how long? nobody knows")


#: text decoded from bytes that are not UTF-8 (as os.fsdecode does): lone surrogates
CAFE = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
FF = b"\xff".decode("utf-8", "surrogateescape")


class Raising(sw.StreamWorker):
    stream, group = STREAM, GROUP
    read_block = 0.05
    max_deliveries = 1

    async def handle(self, msg: sw.Message) -> Any:
        what = msg.payload.get("what")
        if what == "unprintable":
            raise Unprintable()
        if what == "surrogate":
            raise OSError(f"cannot open {CAFE}")
        if what == "dead-surrogate":
            raise sw.DeadLetter(f"bad name {FF}")
        if what == "stage":
            msg.stage(f"SET{FF}", ["{user-code}:k"], ["v"])
        if what == "result":
            return Unlengthy(total=3)
        return "ok"


@pytest.mark.parametrize(("what", "reason", "etype", "text"), [
    ("unprintable", "max_deliveries", "Unprintable", "Unprintable()"),  # its repr
    ("surrogate", "max_deliveries", "OSError", "cannot open caf\\udce9.txt"),
    ("dead-surrogate", "dead_letter: bad name \\udcff", "DeadLetter", "bad name \\udcff"),
    ("stage", "max_deliveries", "ValueError", "stage(): command must be a Redis command name "
     "such as 'SET', got 'SET\\udcff'"),
])
async def test_a_handler_error_whose_text_is_broken_is_dead_lettered(
        redis_url: str, r: redis.Redis, what: str, reason: str, etype: str,
        text: str) -> None:
    """An exception whose __str__ raises, or whose message UTF-8 cannot encode, is
    recorded (type, a readable message) and the worker goes on with the next job; a staged
    command UTF-8 cannot encode is refused in the handler, not when it is written."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"what": what}, key="bad")
        p.send(STREAM, {"what": "fine"}, key="after")
    w = Raising.from_url(redis_url)
    await run_until_idle(w, r, timeout=30)
    [dead] = list_dead(r, STREAM, 10)
    assert (dead.key, dead.reason, dead.error_type) == ("bad", reason, etype)
    assert dead.detail.startswith(text + "\n"), dead.detail
    with sw.Producer.from_url(redis_url) as p:
        assert p.result(STREAM, "after", group=GROUP, timeout=5) == "ok"


class Later(sw.Retry):
    def __init__(self) -> None:  # no super().__init__(): no delay, no reason of its own
        Exception.__init__(self, "later")


class Soon(sw.Retry):
    def __init__(self) -> None:
        super().__init__()
        self.delay = "soon"  # type: ignore[assignment]


class Gone(sw.DeadLetter):
    def __init__(self) -> None:  # no super().__init__(): no reason of its own
        Exception.__init__(self, "gone")


class Steering(sw.StreamWorker):
    stream, group = STREAM, GROUP
    read_block = 0.05
    retry_delay = 0.01
    retry_max_delay = 0.05
    max_deliveries = 2

    async def handle(self, msg: sw.Message) -> str:
        kind = {"later": Later, "soon": Soon, "gone": Gone}.get(msg.payload["what"])
        if kind is not None:
            raise kind()
        return "ok"


@pytest.mark.parametrize(("what", "reason", "retried"), [
    ("later", "max_deliveries", 1), ("soon", "max_deliveries", 1), ("gone", "dead_letter: ", 0),
])
async def test_retry_and_dead_letter_subclasses_of_the_users_steer_the_job(
        redis_url: str, r: redis.Redis, what: str, reason: str, retried: int) -> None:
    """A Retry/DeadLetter subclass that skips the base __init__ (or sets a delay that is no
    number) still retries (with the worker's backoff) or dead-letters its job."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"what": what}, key="steered")
        p.send(STREAM, {"what": "fine"}, key="after")
    w = Steering.from_url(redis_url)
    await run_until_idle(w, r, timeout=30)
    [dead] = list_dead(r, STREAM, 10)
    assert (dead.key, dead.reason, dead.error_type) == ("steered", reason, type(
        {"later": Later(), "soon": Soon(), "gone": Gone()}[what]).__name__)
    assert w.counts["retried"] == retried and w.counts["acked"] == 1


async def test_a_result_whose_packing_raises_completes_the_job_without_it(
        redis_url: str, r: redis.Redis) -> None:
    """handle() returns a value whose encoding raises LookupError: the job is done, its
    result not kept (the note says why), and the worker goes on."""
    with sw.Producer.from_url(redis_url) as p:
        p.send(STREAM, {"what": "result"}, key="odd")
        p.send(STREAM, {"what": "fine"}, key="after")
    w = Raising.from_url(redis_url)
    await run_until_idle(w, r, timeout=30)
    with sw.Producer.from_url(redis_url) as p:
        st = p.status(STREAM, "odd", group=GROUP)
        assert (st.state, st.result) == ("done", None)
        assert "not kept" in st.result_note and "LookupError" in st.result_note
        assert p.result(STREAM, "after", group=GROUP, timeout=5) == "ok"
    assert w.counts["acked"] == 2 and not list_dead(r, STREAM, 10)


def test_a_done_record_packs_the_result_once() -> None:
    """A value that packs once and raises the second time is kept as packed the first."""
    calls = []

    class Once(dict):  # type: ignore[type-arg]
        def __len__(self) -> int:
            calls.append(1)
            if len(calls) > 1:
                raise LookupError("asked twice")
            return dict.__len__(self)

    st = parse(STREAM, GROUP, "k", done_record(7, 1, Once(a=1), 1024))
    assert (st.state, st.result, st.result_note, st.fencing_token) == ("done", {"a": 1}, "", 7)


def test_a_span_records_an_exception_whose_str_raises() -> None:
    """Ending a job's span with such an error records its type and a placeholder."""
    span = TracerProvider().get_tracer("t").start_span("job")
    end_span(span, "retried", Unprintable())
    [event] = span.events  # type: ignore[attr-defined]
    assert event.attributes["exception.type"] == "Unprintable"
    assert event.attributes["exception.message"] == "<str() raised ZeroDivisionError>"


# ---- a user's local_cache ---------------------------------------------------------------


class Unreliable(dict):  # type: ignore[type-arg]
    """A local_cache whose lookups (or writes) raise."""

    def __init__(self, fail_on: str) -> None:
        super().__init__()
        self.fail_on = fail_on

    def __contains__(self, key: object) -> bool:
        if self.fail_on == "lookup":
            raise LookupError("cache node down")
        return dict.__contains__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if self.fail_on == "write":
            raise ZeroDivisionError("cache full")
        dict.__setitem__(self, key, value)


@pytest.mark.parametrize(("fail_on", "error"), [("lookup", "LookupError: cache node down"),
                                                 ("write", "ZeroDivisionError: cache full")])
async def test_a_local_cache_that_raises_is_logged_and_used_no_more(
        redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture, fail_on: str,
        error: str) -> None:
    with sw.Producer.from_url(redis_url) as p:
        p.send_many(STREAM, [{"what": "fine"}] * 5, keys=[f"k{i}" for i in range(5)])
    w = Raising.from_url(redis_url, local_cache=Unreliable(fail_on))
    with caplog.at_level(logging.ERROR, logger="streamwork.worker"):
        await run_until_idle(w, r, timeout=30)
    assert w.counts["acked"] == 5
    assert f"the local_cache raised {error}" in caplog.text
    assert caplog.text.count("the local_cache raised") == 1


# ---- schedules and payload_type ------------------------------------------------------------


@dataclasses.dataclass
class Report:
    name: str


class TypedTicks(sw.StreamWorker[Report]):
    stream, group = "typed-ticks", "reporters"
    payload_type = Report
    read_block = 0.05

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.got: list[Any] = []

    async def handle(self, msg: sw.Message[Report]) -> None:
        self.got.append(msg.payload)


@pytest.mark.parametrize(("schedule", "says"), [
    (lambda: sw.Every(60), "schedule 'every-60s' ticks with the payload None"),
    (lambda: sw.Every(60, payload={"title": "x"}, name="hourly"),
     "schedule 'hourly' ticks with the payload {'title': 'x'}"),
    (lambda: sw.Cron("0 7 * * *", tz="Europe/Berlin", payload={"name": 7}),
     "schedule 'cron-0 7 * * *@Europe/Berlin' ticks with the payload {'name': 7}"),
], ids=["no-payload", "wrong-fields", "wrong-type"])
def test_a_schedule_whose_payload_does_not_fit_payload_type_is_refused(
        redis_url: str, schedule: Callable[[], Any], says: str) -> None:
    """Refused when the worker is built (naming the schedule and what to do), instead of
    dead-lettering every tick as payload:invalid."""
    with pytest.raises(sw.ConfigError) as info:
        TypedTicks.from_url(redis_url, schedules=[schedule()])
    message = str(info.value)
    assert message.startswith("schedules: " + says), message
    assert "Report" in message and "payload={...}" in message


def test_a_schedule_payload_that_fits_payload_type_is_accepted(redis_url: str) -> None:
    for payload in ({"name": "daily"}, Report("daily")):
        w = TypedTicks.from_url(redis_url, schedules=[sw.Every(60, payload=payload)])
        assert w.schedules[0].payload == payload
    Keyed.from_url(redis_url, schedules=[sw.Every(60)])  # untyped: any payload, None too


async def test_typed_ticks_arrive_as_instances(redis_url: str, r: redis.Redis) -> None:
    w = TypedTicks.from_url(redis_url, schedules=[sw.Every(0.2, payload=Report("often"))])
    task = asyncio.create_task(w.serve())
    try:
        await await_for(lambda: len(w.got) >= 2, 30, message="two ticks handled")
    finally:
        w.stop()
        await task
    assert all(x == Report("often") for x in w.got)
    assert w.counts["dead_lettered"] == 0
