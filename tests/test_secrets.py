"""No password printed anywhere: every ``streamwork`` command (enumerated from the click
group, so a new command is covered) and the main errors (a worker started on a bad URL, a
producer send in an outage, ConfigError paths), run with a password in the URL against a
real server with ``requirepass``, never show it in stdout, stderr or the logs."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
import redis

import streamwork as sw
from streamwork._cli.main import main
from streamwork._redis.server import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "s3cretpw-9f2e"
STREAM = "secrets"


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every leaf command of ``group``, as its path of names (``("dlq", "list")``)."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


#: the arguments each command runs with here (a command missing from this table fails
#: `test_every_command_is_run`); "{url}" is the URL with the password
ARGS: dict[tuple[str, ...], list[str]] = {
    ("bench",): [],  # a private server of its own: no --url to leak; only --help is run
    ("cancel",): [STREAM, "k-1", "--group", "g", "--url", "{url}"],
    ("dashboard",): ["--port", "{port}", "--url", "{url}"],
    ("demo",): ["--orders", "5", "--url", "{url}"],
    ("dlq", "list"): [STREAM, "--url", "{url}"],
    ("dlq", "purge"): [STREAM, "--yes", "--url", "{url}"],
    ("dlq", "replay"): [STREAM, "--all", "--url", "{url}"],
    ("inspect",): ["--url", "{url}"],
    ("job",): [STREAM, "k-1", "--url", "{url}"],
    ("pause",): [STREAM, "--group", "g", "--url", "{url}"],
    ("resume",): [STREAM, "--group", "g", "--url", "{url}"],
    ("run",): ["tests.workers.ledger:LedgerWorker", "--url", "{url}", "--log-level",
               "DEBUG"],
    ("schedules",): [STREAM, "--url", "{url}"],
    ("send",): [STREAM, '{"a": 1}', "--url", "{url}"],
    ("top",): ["--once", "--interval", "0.1", "--url", "{url}"],
}

#: commands that serve until stopped: run until they log this, then SIGTERM
SERVES: dict[tuple[str, ...], str] = {("run",): "worker started", ("dashboard",): "http"}


@pytest.fixture(name="locked")
def _locked(make_server: Callable[..., RedisServer]) -> RedisServer:
    """A server that needs a password (set once it answers PING, as RedisServer waits for
    a PONG)."""
    server = make_server()
    client = redis.Redis(port=server.port)
    client.config_set("requirepass", PASSWORD)
    client.close()
    return server


def _url(server: RedisServer, password: str = PASSWORD) -> str:
    return f"redis://:{password}@127.0.0.1:{server.port}/0"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return {**env, "PYTHONPATH": str(ROOT), "SW_TEST_STREAM": STREAM}


def _page(port: str, timeout: float = 60) -> str:
    """The dashboard's page (or its error page), as served on ``port`` (waited for: it may
    print its address a moment before it listens)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as reply:
                return str(reply.read().decode(errors="replace"))
        except urllib.error.HTTPError as exc:
            return str(exc.read().decode(errors="replace"))
        except OSError:  # not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _cli(args: list[str], *, serves: str | None = None, timeout: float = 120,
         serving: Callable[[], str] | None = None) -> tuple[int, str]:
    """``python -m streamwork ARGS`` to its end (or, for a command that ``serves``, until it
    prints that, then what ``serving()`` returns is added, then SIGTERM); its exit status
    and everything it wrote."""
    proc = subprocess.Popen([sys.executable, "-m", "streamwork", *args], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        if serves is None:
            out, _ = proc.communicate(timeout=timeout)
            return proc.returncode, out.decode(errors="replace")
        seen = b""
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        deadline = time.monotonic() + timeout
        while serves.encode() not in seen.lower() and proc.poll() is None:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            seen += proc.stdout.read() or b""
            time.sleep(0.05)
        if proc.poll() is None and serving is not None:
            seen += serving().encode()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        os.set_blocking(proc.stdout.fileno(), True)
        rest, _ = proc.communicate(timeout=timeout)
        return proc.returncode, (seen + rest).decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_every_command_is_run() -> None:
    """The table above covers every command the group has: a new command must be added
    (and so checked for leaks)."""
    assert sorted(_commands(main)) == sorted(ARGS)


@pytest.mark.parametrize("command", sorted(ARGS), ids=" ".join)
def test_no_command_prints_the_password(command: tuple[str, ...], locked: RedisServer) -> None:
    """Each command, pointed at a server that needs a password with the password in
    --url (and once with a wrong one), never prints it."""
    if command == ("bench",):
        args = ["bench", "--help"]
    else:
        port = str(free_port())
        args = [*command, *(a.replace("{url}", _url(locked)).replace("{port}", port)
                            for a in ARGS[command])]
    page = (lambda: _page(port)) if command == ("dashboard",) else None  # its HTML too
    code, out = _cli(args, serves=SERVES.get(command), serving=page)
    assert PASSWORD not in out, out
    if page is not None:
        assert "<html" in out.lower() and ":***@" in out, out
    if command != ("bench",):
        wrong = [a.replace(PASSWORD, PASSWORD + "-wrong") for a in args]
        code, out = _cli(wrong, serves=SERVES.get(command), timeout=60, serving=page)
        assert PASSWORD not in out, out
        # the demo falls back to a private server of its own
        assert command in SERVES or command == ("demo",) or code != 0, out


def test_cli_errors_never_print_the_password(locked: RedisServer) -> None:
    """A malformed URL (bad port, unknown scheme, broken sentinel URL) and an unreachable
    server: the messages show the URL masked."""
    dead_port = free_port()
    for url in (f"redis://:{PASSWORD}@127.0.0.1:notaport/0",
                f"http://:{PASSWORD}@127.0.0.1:{locked.port}/0",
                f"redis+sentinel://:{PASSWORD}@127.0.0.1:{locked.port}",
                f"redis://:{PASSWORD}@127.0.0.1:{dead_port}/0"):
        for args in (["inspect", "--url", url], ["send", STREAM, "1", "--url", url],
                     ["run", "tests.workers.ledger:LedgerWorker", "--url", url]):
            # a worker rides out an unreachable server: stopped once it has said so
            serves = "unavailable" if args[0] == "run" and str(dead_port) in url else None
            code, out = _cli(args, serves=serves, timeout=60)
            assert (serves or code != 0) and PASSWORD not in out, (args, out)


def test_python_errors_never_show_the_password(locked: RedisServer,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """From Python: a worker started with a bad URL, a producer send in an outage, the
    ConfigError paths; neither the errors nor the logs show the password."""
    caplog.set_level(logging.DEBUG)
    dead_port = free_port()
    messages: list[str] = []

    class Secret(sw.StreamWorker):
        stream, group = STREAM, "g"

        async def handle(self, msg: sw.Message) -> None:
            pass

    for url in (f"redis://:{PASSWORD}@127.0.0.1:notaport/0",
                f"http://:{PASSWORD}@127.0.0.1:{locked.port}/0",
                f"redis+sentinel://:{PASSWORD}@127.0.0.1:{locked.port}"):
        for build in (lambda u: Secret.from_url(u).run(), lambda u: sw.Producer.from_url(u).send(
                STREAM, {"a": 1})):
            with pytest.raises(Exception) as raised:
                build(url)
            messages.append(f"{raised.type.__name__}: {raised.value}")
    worker = Secret.from_url(_url(locked, PASSWORD + "-wrong"))
    with pytest.raises(Exception) as raised:
        worker.run()
    messages.append(str(raised.value))
    with sw.Producer.from_url(f"redis://:{PASSWORD}@127.0.0.1:{dead_port}/0",
                              retry_timeout=0.3) as producer, \
            pytest.raises(sw.RedisUnavailable) as unavailable:
        producer.send(STREAM, {"a": 1})
    messages.append(str(unavailable.value))
    text = "\n".join(messages) + "\n".join(r.getMessage() for r in caplog.records)
    text += "\n".join(str(getattr(r, "sw", "")) for r in caplog.records)
    assert PASSWORD not in text, text
