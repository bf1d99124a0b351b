"""The ``streamwork`` command: send, run (with SIGTERM drain) and demo, on real servers."""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import click
import pytest
import redis
from click.testing import CliRunner, Result

import streamwork as sw
from streamwork._cli.main import main
from streamwork._redis.server import free_port
from streamwork._wire.codec import BODY_FIELD, decode_body
from streamwork._worker.config import HELP, WorkerConfig
from streamwork.testing import Ledger, wait_for
from tests.workers.ledger import STREAM, LedgerWorker

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_send_enqueues_the_json_payload_with_its_key(redis_url: str, r: redis.Redis) -> None:
    """`streamwork send STREAM JSON --key k` XADDs one entry decoding to that key and payload,
    and prints its entry id."""
    code, out = cli("send", "orders", '{"order_id": 7, "tags": ["a", "b"], "paid": null}',
                    "--key", "order-7", "--url", redis_url)
    assert code == 0, out
    [(entry_id, fields)] = r.xrange("orders")
    assert out.strip() == entry_id.decode()
    env = decode_body(fields[BODY_FIELD])
    assert env.key == "order-7"
    assert env.payload == {"order_id": 7, "tags": ["a", "b"], "paid": None}


def test_send_takes_url_from_environment(redis_url: str, r: redis.Redis) -> None:
    """Without --url, `send` uses $REDIS_URL; without --key the key is a fresh uuid hex."""
    result = CliRunner(env={"REDIS_URL": redis_url}).invoke(main, ["send", "orders", "42"])
    assert result.exit_code == 0, result.output
    env = decode_body(r.xrange("orders")[0][1][BODY_FIELD])
    assert env.payload == 42 and len(env.key) == 32


def test_send_bad_json_fails_clearly_and_enqueues_nothing(redis_url: str,
                                                          r: redis.Redis) -> None:
    """Invalid JSON exits non-zero with an error naming the problem; nothing is enqueued."""
    code, out = cli("send", "orders", "{order_id: 7", "--key", "k", "--url", redis_url)
    assert code != 0
    assert "not valid JSON" in out
    assert "Traceback" not in out
    assert not r.exists("orders")


def test_run_rejects_bad_option_naming_it(redis_url: str) -> None:
    """`streamwork run W --concurrency 0` exits non-zero naming the option."""
    code, out = cli("run", "tests.workers.ledger:LedgerWorker", "--url", redis_url,
                    "--concurrency", "0")
    assert code != 0
    assert "concurrency" in out


def test_run_rejects_a_target_that_is_not_a_worker() -> None:
    """A target that cannot be imported, or is not a StreamWorker, is a clear error."""
    for target in ("tests.workers.ledger", "no_such_module:Worker", "tests.workers.ledger:STREAM"):
        code, out = cli("run", target, "--url", "redis://127.0.0.1:1/0")
        assert code != 0, target
        assert "Traceback" not in out


class RecordingWorker(sw.StreamWorker):
    """A worker whose run() only records the config it was built with (no Redis needed)."""

    stream = "cli-options"
    group = "recorders"
    timeout = 60.0
    started: ClassVar[list[WorkerConfig]] = []

    async def handle(self, msg: sw.Message) -> None:
        pass

    def run(self) -> None:
        RecordingWorker.started.append(self.config)


class FailingWorker(RecordingWorker):
    """run() fails the way a worker whose reader broke does."""

    def run(self) -> None:
        raise sw.WorkerFailed("reader", RuntimeError("boom: ERR unknown command 'XFOO'"))


@pytest.fixture(name="run_in_process")
def _run_in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Result]]:
    """`streamwork run` through CliRunner in this process: gc.freeze() is a no-op here and
    the root logger is put back afterwards."""
    monkeypatch.setattr(gc, "freeze", lambda: None)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    RecordingWorker.started.clear()

    def invoke(worker: str, *args: str) -> Result:
        return CliRunner().invoke(main, ["run", f"{__name__}:{worker}", "--url",
                                         "redis://127.0.0.1:1/0", *args])

    yield invoke
    root.handlers[:] = handlers
    root.setLevel(level)


def test_every_worker_option_is_a_run_option() -> None:
    """Each WorkerConfig field has a `streamwork run` option of the same name, with its own
    help line: a new worker option without a CLI form fails here."""
    run_command = main.commands["run"]
    params = {p.name: p for p in run_command.params}
    for name in WorkerConfig.option_names():
        assert name in params, f"worker option {name!r} has no `run` option"
        param = params[name]
        assert isinstance(param, click.Option)
        assert param.help and param.help == HELP.get(name), (
            f"give {name!r} a one-line description in config.HELP")
        assert param.default is None or param.multiple, name
    assert "--lock-url" in params["lock_urls"].opts
    assert params["lock_urls"].multiple
    assert params["heartbeat"].secondary_opts == ["--no-heartbeat"]


@pytest.mark.parametrize(("args", "expected"), [
    ([], {"timeout": 60.0, "heartbeat": True, "local_cache_size": 100_000,
          "retention": 86400.0, "lock_urls": None, "dedup": True}),
    (["--no-heartbeat"], {"heartbeat": False}),
    (["--timeout", "none"], {"timeout": None}),
    (["--timeout", "None"], {"timeout": None}),
    (["--timeout", "2.5"], {"timeout": 2.5}),
    (["--local-cache-size", "0", "--local-cache-ttl", "5"],
     {"local_cache_size": 0, "local_cache_ttl": 5.0}),
    (["--retention", "none", "--reclaim-interval", "0.5"],
     {"retention": None, "reclaim_interval": 0.5}),
    (["--no-dedup", "--concurrency", "3", "--stream", "other", "--group", "g2"],
     {"dedup": False, "concurrency": 3, "stream": "other", "group": "g2"}),
    (["--lock-url", "redis://127.0.0.1:7001", "--lock-url", "redis://127.0.0.1:7002"],
     {"lock_urls": ("redis://127.0.0.1:7001", "redis://127.0.0.1:7002")}),
])
def test_run_options_reach_the_worker_config(run_in_process: Callable[..., Result],
                                             args: list[str], expected: dict[str, Any]) -> None:
    """Options given to `streamwork run` become the worker's config; options not given keep
    the class attribute (timeout = 60 here, not the default 300)."""
    result = run_in_process("RecordingWorker", *args)
    assert result.exit_code == 0, result.output
    [config] = RecordingWorker.started
    assert {k: getattr(config, k) for k in expected} == expected


@pytest.mark.parametrize(("args", "option"), [
    (["--timeout", "soon"], "--timeout"),
    (["--concurrency", "none"], "--concurrency"),
    (["--timeout", "0"], "timeout"),
])
def test_run_rejects_a_bad_option_value(run_in_process: Callable[..., Result],
                                        args: list[str], option: str) -> None:
    """A value of the wrong kind, or `none` where None is not allowed, fails naming the
    option; the worker never runs."""
    result = run_in_process("RecordingWorker", *args)
    assert result.exit_code != 0
    assert option in result.output
    assert "Traceback" not in result.output
    assert RecordingWorker.started == []


def test_run_reports_a_worker_failure_and_exits_1(
        run_in_process: Callable[..., Result]) -> None:
    """When worker.run() raises a StreamworkError (WorkerFailed), `streamwork run` prints
    its message on stderr, without a traceback, and exits with status 1."""
    result = run_in_process("FailingWorker")
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit), result.exception
    assert "WorkerFailed" in result.stderr
    assert "boom: ERR unknown command 'XFOO'" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_sigterm_drains_the_job_in_flight(
        redis_url: str, r: redis.Redis,
        spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """SIGTERM to `streamwork run` while a 1.5 s job runs: it finishes, is acked once, exit 0."""
    assert LedgerWorker.drain_timeout > 1.5
    proc = spawn_worker("tests.workers.ledger:LedgerWorker", redis_url)
    code, out = cli("send", STREAM, '{"sleep": 1.5}', "--key", "slow", "--url", redis_url)
    assert code == 0, out
    wait_for(lambda: r.exists("attempt-times:slow"), 60, message="the slow job started")
    assert Ledger(r).counts() == {}, "the job must still be running when SIGTERM arrives"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert Ledger(r).counts() == {"slow": 1}
    assert r.xpending(STREAM, LedgerWorker.group)["pending"] == 0


def test_sigint_also_drains(redis_url: str, r: redis.Redis,
                            spawn_worker: Callable[..., subprocess.Popen[bytes]]) -> None:
    """SIGINT (Ctrl-C) is a graceful stop too: the running job finishes, exit 0."""
    proc = spawn_worker("tests.workers.ledger:LedgerWorker", redis_url)
    cli("send", STREAM, '{"sleep": 0.5}', "--key", "ctrl-c", "--url", redis_url)
    wait_for(lambda: r.exists("attempt-times:ctrl-c"), 60, message="the job started")
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    assert Ledger(r).counts() == {"ctrl-c": 1}
    assert r.xpending(STREAM, LedgerWorker.group)["pending"] == 0


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_demo_starts_its_own_server_when_none_answers() -> None:
    """`streamwork demo` with a dead --url starts a private server, prints the summary,
    exits 0, and stops that server afterwards."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "REDIS_URL": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "streamwork", "demo", "--url", f"redis://127.0.0.1:{port}/0",
         "--orders", "300"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    first = out.splitlines()[0]
    assert re.search(r"\(a private (redis|valkey)-server the demo started", first), out
    for line in ("orders charged", "orders charged twice", "retries", "orders dead-lettered",
                 "throughput", "left pending"):
        assert line in out, f"summary line {line!r} missing:\n{out}"
    assert "OK" in out
    assert re.search(r"orders\s*│?\s*300\b", out), out
    assert re.search(r"charged twice\s*│?\s*0\b", out), out
    assert re.search(r"left pending\s*│?\s*0\b", out), out
    used = re.search(r"Using Redis at redis://127\.0\.0\.1:(\d+)/", out)
    assert used, out
    assert int(used.group(1)) != port
    assert _port_closed(int(used.group(1))), "the demo's private server was left running"
