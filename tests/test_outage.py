"""Redis outages as a worker reports them, on private redis-server processes killed while
`streamwork run --health-port` serves a producer's jobs: exactly one WARNING when Redis is
lost and one INFO line when it is back (no recovery claimed while it is down), /readyz 503
for the whole outage and 200 again soon after, and a backoff that grows meanwhile."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._redis.server import RedisServer, free_port
from streamwork._wire.partitions import partition_names
from streamwork.testing import wait_for
from tests.test_health import probe, wait_probe
from tests.workers.ops import OTHER_STREAM, STREAM, ledger_key

OPS = "tests.workers.ops:OpsWorker"
OTHER = "tests.workers.ops:OtherOpsWorker"
Spawn = Callable[..., subprocess.Popen[bytes]]

LOST = "redis unavailable, retrying with backoff"
BACK = "redis available again"
DOWN_FOR = 10.0  #: s Redis stays down in the outage test
NEVER_BACK_FOR = 7.0  #: s Redis stays down (for good) in the other test
DETECT = 2.5  #: s a worker may take to notice Redis is gone (a busy machine is slow)
SAMPLE_EVERY = 0.1  #: s between two looks at /readyz during an outage
#: failed calls per second of outage the worker may make at most: its loops that use Redis
#: each retry about every 2 s once the backoff has grown (without growth: 10 to 20 each)
MAX_FAILED_PER_S = 8.0


class Load:
    """A producer thread sending small jobs to ``streams`` until stopped; sends that fail
    (Redis is down) are dropped: the test only needs the worker busy, not every job."""

    def __init__(self, url: str, streams: list[str], partitions: int = 1) -> None:
        self.url = url
        self.streams = streams
        self.partitions = partitions
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outage-load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with sw.Producer.from_url(self.url, retry_timeout=0.2,
                                  partitions=self.partitions) as producer:
            n = 0
            while not self._stop.is_set():
                try:
                    for stream in self.streams:
                        producer.send(stream, {"sleep": 0.01}, key=f"job-{n}")
                    self.sent += 1
                except Exception:  # Redis is down: wait a little and go on
                    self._stop.wait(0.2)
                n += 1
                self._stop.wait(0.01)


def applied(url: str, streams: list[str]) -> int:
    """Jobs whose staged write landed, over the ledgers of ``streams``."""
    client = redis.Redis.from_url(url)
    try:
        return sum(client.hlen(ledger_key(s)) for s in streams)
    finally:
        client.close()


def sample_ready(port: int, seconds: float) -> list[tuple[float, int | None]]:
    """(monotonic time the request was sent, /readyz status) every `SAMPLE_EVERY` s for
    ``seconds``: the answer describes the worker at that time or later."""
    samples: list[tuple[float, int | None]] = []
    until = time.monotonic() + seconds
    while (sent := time.monotonic()) < until:
        got = probe(port, "/readyz")
        samples.append((sent, None if got is None else got[0]))
        time.sleep(SAMPLE_EVERY)  # pacing, not an assertion
    return samples


def check_down(samples: list[tuple[float, int | None]], killed: float) -> None:
    """Every look sent `DETECT` s or more after Redis was killed is 503 (there are some),
    and no 200 follows the first 503."""
    statuses = [s for _, s in samples]
    late = [s for t, s in samples if t - killed >= DETECT]
    assert late and all(s == 503 for s in late), f"/readyz during the outage: {statuses}"
    first = statuses.index(503)
    assert all(s == 503 for s in statuses[first:]), f"/readyz during the outage: {statuses}"


def events(log: Path) -> list[dict[str, Any]]:
    """The JSON log records of the worker process (other lines skipped)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "event" in record:
            out.append(record)
    return out


def lines(log: Path, text: str, stream: str | None = None) -> list[dict[str, Any]]:
    return [e for e in events(log) if text in e["event"]
            and (stream is None or e.get("stream") == stream)]


def spawn_logged(spawn_worker: Spawn, log: Path, targets: list[str], url: str,
                 *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return spawn_worker(targets[0], url, *targets[1:], *args, "--log-level", "INFO",
                            "--log-format", "json", stdout=out)


#: (worker targets, extra CLI options, producer partitions, streams fed, the log field
#: "stream" of each worker's outage lines)
SHAPES = {
    "one worker": ([OPS], [], 1, [STREAM], [STREAM]),
    "partitioned": ([OPS], ["--partitions", "2"], 2, [STREAM], [STREAM]),
    "two workers in one process": ([OPS, OTHER], [], 1, [STREAM, OTHER_STREAM],
                                   [STREAM, OTHER_STREAM]),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_outage_truth(make_server: Callable[..., RedisServer], spawn_worker: Spawn,
                      tmp_path: Path, shape: str) -> None:
    """Redis SIGKILLed for 10 s under load, then restarted on the same port: /readyz is
    503 at every look during the outage (after a moment to notice) and 200 again after;
    the log says once that Redis was lost and once that it is back (how long, after how
    few failed calls: the backoff grew), with no recovery claimed in between."""
    targets, options, partitions, fed, names = SHAPES[shape]
    ledgers = [n for s in fed for n in partition_names(s, partitions)]
    server = make_server(appendfsync="everysec")
    port = free_port()
    log = tmp_path / "worker.log"
    proc = spawn_logged(spawn_worker, log, targets, server.url, "--health-port", str(port),
                        *options)
    wait_probe(port, "/readyz", 200)
    with Load(server.url, fed, partitions):
        wait_for(lambda: applied(server.url, ledgers) >= 20, 60, message="jobs done")
        server.kill()
        killed = time.monotonic()
        samples = sample_ready(port, DOWN_FOR)
        server.start()
        check_down(samples, killed)
        wait_probe(port, "/readyz", 200, timeout=60)
        before = applied(server.url, ledgers)
        wait_for(lambda: applied(server.url, ledgers) >= before + 20, 60,
                 message="jobs done after the outage")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    for stream in names:
        lost, back = lines(log, LOST, stream), lines(log, BACK, stream)
        assert len(lost) == 1, [e["event"] for e in lost]
        assert len(back) == 1, [e["event"] for e in back]
        assert lost[0]["level"] == "warning" and back[0]["level"] == "info", (lost, back)
        down_s, failed = back[0]["duration_ms"] / 1000, back[0]["count"]
        assert DOWN_FOR - DETECT <= down_s <= DOWN_FOR + 30, back[0]
        assert 1 <= failed <= MAX_FAILED_PER_S * down_s, back[0]


@pytest.mark.parametrize("processes", [1, 2])
def test_no_recovery_claimed_while_redis_stays_down(
        make_server: Callable[..., RedisServer], spawn_worker: Spawn,
        tmp_path: Path, processes: int) -> None:
    """Redis SIGKILLed under load and never restarted: for 7 s /readyz is 503 at every
    look (with --processes 2: the supervisor's, over its children's), and the log says
    once per worker process that Redis was lost and never that it is available again
    (also while the workers drain on SIGTERM, Redis still down)."""
    server = make_server()
    port = free_port()
    log = tmp_path / "worker.log"
    more = ["--processes", str(processes)] if processes > 1 else []
    proc = spawn_logged(spawn_worker, log, [OPS], server.url, "--health-port", str(port),
                        *more)
    wait_probe(port, "/readyz", 200)
    with Load(server.url, [STREAM]):
        wait_for(lambda: applied(server.url, [STREAM]) >= 20, 60, message="jobs done")
        server.kill()
        killed = time.monotonic()
        samples = sample_ready(port, NEVER_BACK_FOR)
    check_down(samples, killed)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    lost = lines(log, LOST)
    assert sorted({e["consumer"] for e in lost}) == sorted(e["consumer"] for e in lost), lost
    assert len(lost) == processes, [e["event"] for e in lost]
    assert lines(log, BACK) == []


def test_sigterm_while_redis_is_down_and_outcomes_wait_exits(
        make_server: Callable[..., RedisServer], spawn_worker: Spawn,
        tmp_path: Path) -> None:
    """SIGTERM while Redis is down and finished jobs' outcomes wait to be written: the
    worker drains within drain_timeout (plus the final flush) and exits 0. Before, a loop
    still running during the drain retried without pause (a stop cut its backoff short)
    and swallowed the cancellations meant to end it: the process never exited."""
    server = make_server()
    log = tmp_path / "worker.log"
    proc = spawn_logged(spawn_worker, log, [OPS], server.url)
    with Load(server.url, [STREAM]):
        wait_for(lambda: applied(server.url, [STREAM]) >= 20, 60, message="jobs done")
        server.kill()
        wait_for(lambda: lines(log, LOST), 30, message="the worker to notice Redis is down")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert [e for e in events(log) if e["event"] == "worker stopped"], "no clean stop logged"


def test_one_line_per_outage_not_one_per_held_job(make_server: Callable[..., RedisServer],
                                                  spawn_worker: Spawn, tmp_path: Path) -> None:
    """A 6 s outage while 50 handlers run, each lease of 3 s lapsing meanwhile: the log
    says once that Redis was lost, once that it is back, once that leases lapse in the
    outage and once what it cost; not a line per held job (at WARNING or above)."""
    server = make_server(appendfsync="everysec")
    log = tmp_path / "worker.log"
    proc = spawn_logged(spawn_worker, log, [OPS], server.url, "--concurrency", "50",
                        "--visibility-timeout", "3")
    client = redis.Redis.from_url(server.url)
    with sw.Producer.from_url(server.url) as producer:
        producer.send_many(STREAM, [{"sleep": 1.0}] * 300)
        wait_for(lambda: client.hlen(ledger_key(STREAM)) >= 50, 60, message="jobs running")
        server.kill()
        time.sleep(6.0)  # the outage: every lease (3 s) lapses meanwhile
        server.start()
        wait_for(lambda: client.hlen(ledger_key(STREAM)) >= 300, 120,
                 message="every job done after the outage")
        wait_for(lambda: lines(log, "the Redis outage cost"), 30,
                 message="the outage's cost summed up")
    client.close()
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    loud = [e for e in events(log) if e["level"] in ("warning", "error", "critical")]
    per_job = [e["event"] for e in loud if e.get("key")]
    assert len(per_job) <= 1, per_job
    assert len(lines(log, LOST)) == 1 and len(lines(log, BACK)) == 1
    [cost] = lines(log, "the Redis outage cost")
    assert cost["count"] >= 20, cost
    assert len(loud) <= 6, [e["event"] for e in loud]
