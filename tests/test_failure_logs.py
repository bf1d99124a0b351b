"""Failure log lines: each names the exception (type and capped message) in its text and
in structured fields, a dead letter's line carries the traceback, text and JSON logs alike,
and each failure event is logged exactly once. Workers are served in-process (records from
``caplog``) and through ``streamwork run --log-format json`` (the lines it prints)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._ops.deadletter import list_dead
from streamwork._telemetry.logs import JsonFormatter, TextFormatter
from streamwork._wire.keys import StreamKeys
from streamwork.testing import run_until_idle, wait_for
from tests.workers.failing import STREAM, Failing, SyncFailing

MESSAGE = "unsupported operand for order 7"
DEAD = StreamKeys.for_stream(STREAM).dead


def failure_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The worker's WARNING-or-worse records about jobs ("job ...", "lease lost ...")."""
    return [rec for rec in caplog.records
            if rec.name.startswith("streamwork") and rec.levelno >= logging.WARNING
            and rec.getMessage().startswith(("job ", "lease lost", "undecodable", "payload"))]


def dead_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [rec for rec in failure_lines(caplog) if "dead-lettered" in rec.getMessage()
            or "dead letters" in rec.getMessage()]


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [rec for rec in failure_lines(caplog)
            if rec.getMessage().startswith("job failed: retrying")]


def sw_fields(rec: logging.LogRecord) -> dict[str, Any]:
    return dict(getattr(rec, "sw", {}))


def send(url: str, payload: dict[str, Any], key: str = "order-7") -> str:
    with sw.Producer.from_url(url) as p:
        return p.send(STREAM, payload, key=key)


@pytest.fixture(name="logs")
def _logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="streamwork")
    return caplog


@pytest.mark.parametrize("worker_cls", [Failing, SyncFailing], ids=["async", "sync"])
async def test_retry_and_dead_letter_lines_name_the_error(
        redis_url: str, r: redis.Redis, logs: pytest.LogCaptureFixture,
        worker_cls: type[Failing]) -> None:
    """A handler raising TypeError: each retry line and the one dead-letter line say
    "TypeError: <message>" in their text and fields; the dead-letter line (exactly one for
    the event) carries the traceback, shown by the text and JSON formatters."""
    send(redis_url, {"raise": "type", "order": 7})
    worker = worker_cls.from_url(redis_url)
    await run_until_idle(worker, r)
    assert r.xlen(DEAD) == 1

    retries = retry_lines(logs)
    assert len(retries) == 2, [rec.getMessage() for rec in failure_lines(logs)]
    for rec in retries:
        assert f"TypeError: {MESSAGE}" in rec.getMessage(), rec.getMessage()
        assert sw_fields(rec)["error_type"] == "TypeError"
        assert sw_fields(rec)["error"] == MESSAGE
        assert sw_fields(rec)["key"] == "order-7"

    dead = dead_lines(logs)
    assert len(dead) == 1, [(rec.levelname, rec.getMessage()) for rec in dead]
    [rec] = dead
    assert rec.levelno == logging.ERROR
    assert f"TypeError: {MESSAGE}" in rec.getMessage(), rec.getMessage()
    f = sw_fields(rec)
    assert (f["error_type"], f["error"], f["reason"], f["attempt"], f["key"]) == (
        "TypeError", MESSAGE, "max_deliveries", 3, "order-7")
    assert "duration_ms" in f
    assert "Traceback (most recent call last)" in f["traceback"]
    assert "charge_order" in f["traceback"] and f"TypeError: {MESSAGE}" in f["traceback"]
    # exactly the failure events: two retries and one dead letter
    assert len(failure_lines(logs)) == 3, [rec.getMessage() for rec in failure_lines(logs)]

    text = TextFormatter("%(levelname)s %(name)s: %(message)s").format(rec)
    assert f"TypeError: {MESSAGE}" in text and "charge_order" in text
    as_json = json.loads(JsonFormatter().format(rec))
    assert as_json["error"] == MESSAGE and as_json["error_type"] == "TypeError"
    assert "charge_order" in as_json["traceback"]
    assert as_json["event"].startswith("job dead-lettered")


async def test_long_messages_are_cut_with_a_marker(redis_url: str, r: redis.Redis,
                                                   logs: pytest.LogCaptureFixture) -> None:
    """A 20 000-character message is cut to 500 characters in the log line and the
    ``error`` field, the cut marked."""
    send(redis_url, {"raise": "long", "n": 20_000})
    worker = Failing.from_url(redis_url, max_deliveries=2)
    await run_until_idle(worker, r)
    lines = failure_lines(logs)
    assert len(lines) == 2, [rec.getMessage()[:200] for rec in lines]
    for rec in lines:
        error = sw_fields(rec)["error"]
        assert error.startswith("x" * 500) and "x" * 501 not in error, error[:600]
        assert "…" in error and "more characters" in error, error[-80:]
        assert len(rec.getMessage()) < 800 and "ValueError: xxx" in rec.getMessage()
        assert "x" * 501 not in TextFormatter().format(rec)
    [dead] = list_dead(r, STREAM)
    assert dead.error_type == "ValueError"  # the dead letter itself is not affected


@pytest.mark.parametrize(("kind", "shown"), [
    ("unprintable", "Unprintable('hidden')"),
    ("unreprable", "<unprintable Unreprable>"),
])
async def test_an_exception_whose_str_raises_still_logs(
        redis_url: str, r: redis.Redis, logs: pytest.LogCaptureFixture, kind: str,
        shown: str) -> None:
    """An exception whose ``__str__`` raises (and one whose ``__repr__`` raises too) is
    retried and dead-lettered as any other; its lines fall back to its repr, then to
    "<unprintable ...>"."""
    send(redis_url, {"raise": kind})
    worker = Failing.from_url(redis_url, max_deliveries=2)
    await run_until_idle(worker, r, timeout=20)
    [dead] = list_dead(r, STREAM)
    assert (dead.reason, dead.error_type) == ("max_deliveries", type_name(kind))
    [retry] = retry_lines(logs)
    [line] = dead_lines(logs)
    for rec in (retry, line):
        assert f"{type_name(kind)}: {shown}" in rec.getMessage(), rec.getMessage()
        assert sw_fields(rec)["error"] == shown
    assert "charge_order" in sw_fields(line)["traceback"]
    json.loads(JsonFormatter().format(line))


def type_name(kind: str) -> str:
    return {"unprintable": "Unprintable", "unreprable": "Unreprable"}[kind]


async def test_timeout_lines_say_the_time_limit(redis_url: str, r: redis.Redis,
                                                logs: pytest.LogCaptureFixture) -> None:
    """A job past its time limit: the retry and dead-letter lines name HandlerTimeout and
    the limit; one line per event."""
    send(redis_url, {"raise": "slow"})
    worker = Failing.from_url(redis_url, max_deliveries=2, timeout=0.2)
    await run_until_idle(worker, r)
    lines = failure_lines(logs)
    assert len(lines) == 2, [rec.getMessage() for rec in lines]
    retry, dead = lines
    for rec in lines:
        assert "HandlerTimeout: the handler ran longer than its time limit of 0.2 s" in (
            rec.getMessage()), rec.getMessage()
        assert sw_fields(rec)["reason"] == "timeout"
    assert retry.getMessage().startswith("job failed: retrying in ")
    assert dead.getMessage().startswith("job dead-lettered (timeout)")


async def test_ordered_retry_in_place_names_the_error(redis_url: str, r: redis.Redis,
                                                      logs: pytest.LogCaptureFixture) -> None:
    """Ordered mode retries in place: its lines name the error too; then one dead-letter
    line."""
    send(redis_url, {"raise": "type", "order": 7})
    worker = Failing.from_url(redis_url, ordered=True)
    await run_until_idle(worker, r)
    assert r.xlen(DEAD) == 1
    retries = retry_lines(logs)
    assert len(retries) == 2, [rec.getMessage() for rec in failure_lines(logs)]
    for rec in retries:
        assert "retrying in place" in rec.getMessage()
        assert f"TypeError: {MESSAGE}" in rec.getMessage(), rec.getMessage()
        assert sw_fields(rec)["error"] == MESSAGE
    [dead] = dead_lines(logs)
    assert f"TypeError: {MESSAGE}" in dead.getMessage() and sw_fields(dead)["traceback"]


@dataclasses.dataclass
class Invoice:
    order_id: int
    amount_cents: int


async def test_entries_that_never_run_get_one_line_with_their_error(
        redis_url: str, r: redis.Redis, logs: pytest.LogCaptureFixture) -> None:
    """An undecodable entry and a payload that does not validate are dead-lettered on
    arrival: one line each, naming DecodeError / InvalidPayload and the reason."""
    r.xgroup_create(STREAM, Failing.group, id="0", mkstream=True)
    garbage = r.xadd(STREAM, {b"d": b"\xc1"}).decode()
    invalid = send(redis_url, {"amount_cents": 1}, key="no-order-id")
    worker = Failing.from_url(redis_url, payload_type=Invoice)
    await run_until_idle(worker, r)
    assert r.xlen(DEAD) == 2
    lines = failure_lines(logs)
    assert len(lines) == 2, [rec.getMessage() for rec in lines]
    by_id = {sw_fields(rec)["entry_id"]: rec for rec in lines}
    assert set(by_id) == {garbage, invalid}
    assert "DecodeError: " in by_id[garbage].getMessage(), by_id[garbage].getMessage()
    assert sw_fields(by_id[garbage])["error_type"] == "DecodeError"
    bad = by_id[invalid]
    assert "InvalidPayload: Invoice" in bad.getMessage(), bad.getMessage()
    assert "order_id" in sw_fields(bad)["error"]
    assert sw_fields(bad)["key"] == "no-order-id"


def test_json_logs_of_streamwork_run_carry_error_and_traceback(
        redis_url: str, r: redis.Redis, spawn_worker: Any, tmp_path: Path) -> None:
    """``streamwork run --log-format json``: the retry lines have ``error``, the one
    dead-letter line ``error`` and ``traceback``."""
    log = tmp_path / "worker.log"
    send(redis_url, {"raise": "type", "order": 7})
    with log.open("wb") as out:
        proc = spawn_worker("tests.workers.failing:Failing", redis_url, "--log-format", "json",
                            stdout=out)
        wait_for(lambda: r.xlen(DEAD) == 1 and b"dead-lettered" in log.read_bytes(),
                 timeout=30, message="the job dead-lettered and logged")
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()
               if line.startswith("{")]
    retries = [rec for rec in records if rec["event"].startswith("job failed: retrying")]
    dead = [rec for rec in records if "dead-lettered" in rec["event"]]
    assert len(retries) == 2 and len(dead) == 1, [rec["event"] for rec in records]
    for rec in [*retries, *dead]:
        assert (rec["error_type"], rec["error"]) == ("TypeError", MESSAGE), rec
        assert f"TypeError: {MESSAGE}" in rec["event"]
    assert "charge_order" in dead[0]["traceback"], dead[0]
    assert dead[0]["level"] == "error"
