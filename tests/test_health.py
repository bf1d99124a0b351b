"""`streamwork run --health-port` (GET /livez, /readyz) and `--metrics-host`, on real
redis-server processes: readiness follows Redis going down and coming back and a drain,
liveness stays 200 through both; with --processes the supervisor aggregates its children."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

import streamwork as sw
from streamwork._redis.server import RedisServer, free_port
from streamwork.testing import stream_idle, wait_for
from tests.workers.ops import OTHER_STREAM, STREAM, OpsWorker, ledger_key

ROOT = Path(__file__).resolve().parent.parent
OPS = "tests.workers.ops:OpsWorker"
OTHER = "tests.workers.ops:OtherOpsWorker"
Spawn = Callable[..., subprocess.Popen[bytes]]


def probe(port: int, path: str) -> tuple[int, dict[str, Any]] | None:
    """(HTTP status, JSON body) of GET ``path``; None while nothing listens on ``port``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    except ConnectionRefusedError:
        return None
    finally:
        conn.close()


def wait_probe(port: int, path: str, status: int, *, live_too: bool = False,
               timeout: float = 60) -> dict[str, Any]:
    """Wait until ``path`` answers ``status``; its body. With ``live_too``, /livez must
    answer 200 at every look meanwhile."""

    def look() -> dict[str, Any] | None:
        if live_too:
            live = probe(port, "/livez")
            assert live is not None and live[0] == 200, f"/livez failed meanwhile: {live}"
        got = probe(port, path)
        return got[1] if got is not None and got[0] == status else None

    return wait_for(look, timeout, interval=0.05, message=f"{path} answering {status}")


def test_ready_follows_redis_down_and_back_while_live_stays_200(
        make_server: Callable[..., RedisServer], spawn_worker: Spawn) -> None:
    """/readyz goes 503 (redis_ok false) while the worker's Redis is stopped and back to
    200 once it runs again on the same port; /livez answers 200 throughout."""
    server = make_server()
    port = free_port()
    proc = spawn_worker(OPS, server.url, "--health-port", str(port))
    body = wait_probe(port, "/readyz", 200)
    [entry] = body["workers"]
    assert body["status"] == "ok"
    assert entry["worker"] == "tests.workers.ops.OpsWorker"
    assert (entry["stream"], entry["group"], entry["state"]) == (STREAM, "ops", "serving")
    assert entry["ready"] and entry["alive"] and entry["redis_ok"]
    live = probe(port, "/livez")
    assert live is not None and live[0] == 200 and live[1]["loop"] == "responsive"

    server.stop()
    down = wait_probe(port, "/readyz", 503, live_too=True)
    assert down["status"] == "fail" and "redis unreachable" in down["reason"]
    assert down["workers"][0]["redis_ok"] is False
    assert down["workers"][0]["state"] == "serving"

    server.start()
    wait_probe(port, "/readyz", 200, live_too=True)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_during_a_drain_live_is_200_and_ready_503(
        redis_url: str, r: redis.Redis, spawn_worker: Spawn) -> None:
    """SIGTERM while a job runs: until the job ends, /livez is 200 and /readyz 503, both
    saying draining; then the job completes once and the process exits 0."""
    port = free_port()
    proc = spawn_worker(OPS, redis_url, "--health-port", str(port))
    wait_probe(port, "/readyz", 200)
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(STREAM, {"hold_until": "release"}, key="held")
        wait_for(lambda: producer.status(STREAM, "held", group="ops").state == "running", 30,
                 message="the held job running")
    os.kill(proc.pid, signal.SIGTERM)
    ready = wait_probe(port, "/readyz", 503)
    assert ready["workers"][0]["state"] == "draining", ready
    assert "draining" in ready["reason"]
    live = probe(port, "/livez")
    assert live is not None and live[0] == 200, live
    assert live[1]["workers"][0]["draining"] is True
    assert proc.poll() is None, "the drain must still be waiting for the held job"
    r.set("release", 1)
    assert proc.wait(timeout=30) == 0
    assert r.hgetall(ledger_key(STREAM)) == {b"held": b"1"}


def test_live_is_503_while_a_handler_blocks_the_event_loop(
        redis_url: str, r: redis.Redis, spawn_worker: Spawn) -> None:
    """A handler that blocks the event loop (a blocking call in an async def): /livez is
    503 saying the loop did not answer; once it returns, /livez is 200 again."""
    port = free_port()
    proc = spawn_worker(OPS, redis_url, "--health-port", str(port))
    wait_probe(port, "/livez", 200)
    with sw.Producer.from_url(redis_url) as producer:
        producer.send(STREAM, {"block_until": "unblock"}, key="blocker")
    stuck = wait_probe(port, "/livez", 503)
    assert "event loop did not run a call within 1 s" in stuck["reason"], stuck
    assert probe(port, "/readyz") == (503, stuck | {"probe": "readyz"})
    r.set("unblock", 1)
    wait_probe(port, "/livez", 200)
    # the blocked loop could not extend the job's lease: it may run again, once
    wait_for(lambda: stream_idle(r, STREAM, OpsWorker.group), 30, message="the job done")
    assert r.hget(ledger_key(STREAM), "blocker") == b"1"
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_several_workers_are_listed_and_must_all_be_ready(
        redis_url: str, spawn_worker: Spawn) -> None:
    """Two workers in one process: /readyz is 200 once both are ready and lists both."""
    port = free_port()
    proc = spawn_worker(OPS, redis_url, OTHER, "--health-port", str(port))
    body = wait_probe(port, "/readyz", 200)
    assert [(w["stream"], w["ready"]) for w in body["workers"]] == [
        (STREAM, True), (OTHER_STREAM, True)]
    missing = probe(port, "/nothing")
    assert missing is not None and missing[0] == 404 and "/livez" in missing[1]["reason"]
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def _acked(port: int, stream: str) -> float | None:
    """The acked-jobs counter of ``stream`` in the Prometheus text on 127.0.0.1:``port``
    (0 before the first ack); None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text: str = resp.read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("streamwork_messages_acked_total{") and f'"{stream}"' in line)


def test_metrics_host_and_port(redis_url: str, r: redis.Redis, spawn_worker: Spawn) -> None:
    """`--metrics-host 127.0.0.1 --metrics-port P` serves the counters on that address."""
    port = free_port()
    proc = spawn_worker(OPS, redis_url, "--metrics-host", "127.0.0.1", "--metrics-port",
                        str(port))
    with sw.Producer.from_url(redis_url) as producer:
        producer.send_many(STREAM, [{}] * 5)
    wait_for(lambda: (_acked(port, STREAM) or 0) >= 5, 30, message="acked_total >= 5")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_processes_aggregate_health_and_serve_metrics_per_child(
        redis_url: str, r: redis.Redis, spawn_worker: Spawn) -> None:
    """`--processes 2 --health-port H --metrics-port P`: the supervisor's /readyz is 200
    once both children are ready and lists each (pid, its workers); child i serves its
    metrics on P+i; SIGTERM stops all with status 0."""
    health, metrics = free_port(), free_port()
    while metrics + 1 == health or not _free(metrics + 1):
        metrics = free_port()
    proc = spawn_worker(OPS, redis_url, "--processes", "2", "--health-port", str(health),
                        "--metrics-port", str(metrics))
    body = wait_probe(health, "/readyz", 200)
    assert [c["child"] for c in body["processes"]] == [0, 1]
    assert all(c["pid"] and c["workers"][0]["stream"] == STREAM for c in body["processes"])
    assert body["restarts"] == 0
    live = probe(health, "/livez")
    assert live is not None and live[0] == 200, live
    with sw.Producer.from_url(redis_url) as producer:
        producer.send_many(STREAM, [{}] * 40)
    wait_for(lambda: stream_idle(r, STREAM, OpsWorker.group), 30, message="jobs done")
    # each child serves its own counters (one may have had no job); together, every job
    wait_for(lambda: sum(_acked(p, STREAM) or 0 for p in (metrics, metrics + 1)) == 40
             and None not in (_acked(metrics, STREAM), _acked(metrics + 1, STREAM)), 30,
             message="both children's metrics answering, 40 acks in all")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_port_in_use_is_a_clear_error(redis_url: str) -> None:
    """A --health-port or --metrics-port something else listens on fails at once (exit
    1), naming the address and what to do, before the worker starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for option, what in (("--health-port", "health probes"),
                             ("--metrics-port", "Prometheus metrics")):
            proc = subprocess.run(
                [sys.executable, "-m", "streamwork", "run", OPS, "--url", redis_url, option,
                 port], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                capture_output=True, text=True, timeout=60, check=False)
            assert proc.returncode == 1, proc.stderr
            assert f"cannot serve {what} on 127.0.0.1:{port}" in proc.stderr
            assert f"give a free {option}" in proc.stderr
            assert "Traceback" not in proc.stderr
