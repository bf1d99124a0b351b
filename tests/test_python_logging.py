"""A worker run from Python (``run()``) in an application that configured no logging
shows what ``streamwork run`` shows (an outage, a dead job) on stderr; logging an
application configured, before or after the worker started, is left alone; JSON lines
carry UTC times with their zone.

Each case runs in a child process: pytest's own log capture is a handler on the root
logger, which is "logging the application configured"."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

from streamwork._redis.server import free_port
from streamwork._telemetry.logs import JsonFormatter

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import logging, sys, threading, time
import redis
import streamwork as sw

class Emails(sw.StreamWorker):
    stream, group = "py-logs", "mailer"
    max_deliveries = 1
    async def handle(self, msg):
        raise RuntimeError("smtp refused")

def stop_when(worker, done, limit=60.0):
    def watch():
        deadline = time.monotonic() + limit
        while not done() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.stop()
    threading.Thread(target=watch, daemon=True).start()
"""


def _python(code: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", WORKER + textwrap.dedent(code)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_an_outage_is_logged_when_nothing_is_configured() -> None:
    """``Emails.from_url(...).run()`` with Redis down and no logging set up: the outage's
    WARNING is on stderr, in `streamwork run`'s text form (it used to print nothing)."""
    done = _python(f"""
        w = Emails.from_url("redis://127.0.0.1:{free_port()}/0")
        stop_when(w, lambda: False, limit=2.0)
        w.run()
    """)
    assert done.returncode == 0, done.stderr
    assert "WARNING streamwork.worker: redis unavailable, retrying with backoff" in \
        done.stderr, done.stderr
    assert "stream=py-logs group=mailer" in done.stderr, done.stderr


def test_a_dead_job_is_logged_when_nothing_is_configured(redis_url: str) -> None:
    """A job whose handler raises, with max_deliveries=1: its dead-lettering is on stderr
    (INFO lines too: "worker started")."""
    done = _python(f"""
        url = {redis_url!r}
        with sw.Producer.from_url(url) as p:
            p.send("py-logs", {{"to": "a@example.com"}}, key="mail-1")
        w = Emails.from_url(url)
        r = redis.Redis.from_url(url)
        stop_when(w, lambda: r.xlen("{{py-logs}}:dead") == 1)
        w.run()
    """)
    assert done.returncode == 0, done.stderr
    assert "INFO streamwork.worker: worker started" in done.stderr, done.stderr
    assert f"server={redis_url}" in done.stderr, done.stderr  # which Redis it serves
    dead = [line for line in done.stderr.splitlines() if "mail-1" in line]
    assert dead and "dead" in dead[0] and "smtp refused" in dead[0], done.stderr


def test_logging_the_application_configured_is_left_alone() -> None:
    """An application with its own handler (basicConfig to stdout, at WARNING) sees each
    streamwork line once, through its handler alone, at its level; stderr stays empty."""
    done = _python(f"""
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING,
                            format="APP %(levelname)s %(message)s")
        w = Emails.from_url("redis://127.0.0.1:{free_port()}/0")
        stop_when(w, lambda: False, limit=2.0)
        w.run()
    """)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert done.stdout.count("APP WARNING redis unavailable") == 1, done.stdout
    assert "INFO" not in done.stdout, done.stdout  # its level, not ours
    assert logging.getLogger("streamwork").level == logging.NOTSET


def test_logging_configured_after_the_worker_started_takes_over() -> None:
    """The lines set up for an unconfigured application step aside once it configures
    its own: a later line appears once, through the application's handler, at its
    level (the first line after the change too)."""
    done = _python("""
        from streamwork._telemetry.logs import ensure_logging
        log = logging.getLogger("streamwork.worker")
        ensure_logging()
        log.info("before the app configured logging")
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="APP %(message)s")
        log.info("the first line after the change")
        log.info("an info line the app's level hides")
        log.warning("after the app configured logging")
        print("level", logging.getLogger("streamwork").level)
    """)
    assert done.returncode == 0, done.stderr
    assert "INFO streamwork.worker: before the app configured logging" in done.stderr
    assert "after" not in done.stderr and "hides" not in done.stderr, done.stderr
    assert "the first line" not in done.stderr, done.stderr
    assert done.stdout.count("APP after the app configured logging") == 1, done.stdout
    assert "hides" not in done.stdout and "level 0" in done.stdout, done.stdout
    assert "the first line" not in done.stdout, done.stdout


def test_json_lines_carry_utc_times_with_their_zone() -> None:
    """``ts`` is ISO 8601 in UTC, with its zone (Z), to the millisecond, whatever the host's
    time zone."""
    record = logging.LogRecord("streamwork.worker", logging.INFO, __file__, 1, "hello", None,
                               None)
    record.created = datetime(2026, 12, 4, 19, 26, 54, 123000, tzinfo=timezone.utc).timestamp()
    line = json.loads(JsonFormatter().format(record))
    assert line["ts"] == "2026-12-04T19:26:54.123Z", line
    parsed = datetime.fromisoformat(line["ts"].replace("Z", "+00:00"))
    assert parsed.utcoffset() is not None and parsed.timestamp() == record.created
