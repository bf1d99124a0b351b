"""The Node.js producer of examples/node-producer/, written from the wire-format and keys
pages alone, against a real server: its plain, keyed (sent twice), delayed, high-priority
and failing jobs are run by the Python worker of the example as the docs say, and the
statuses it reads from the job records agree with `Producer.status`.

Needs ``node`` and ``npm`` (skipped, saying so, where either is missing); ``npm ci``
installs the locked versions of ``redis`` and ``@msgpack/msgpack`` from the npm registry.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import streamwork as sw
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "node-producer"
STREAM, GROUP = "node-jobs", "py"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="node and npm are not installed (.ci/run installs them)")


@pytest.fixture(scope="module")
def node_modules() -> None:
    """``npm ci``: the example's locked dependencies, once for the module."""
    proc = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=EXAMPLE,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"npm ci failed:\n{proc.stdout}\n{proc.stderr}"


def _node(script: str, *args: str, url: str, timeout: float = 120) -> str:
    proc = subprocess.run(["node", script, *args], cwd=EXAMPLE, capture_output=True,
                          text=True, timeout=timeout, check=False,
                          env={**os.environ, "REDIS_URL": url})
    assert proc.returncode == 0, f"node {script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture()
def worker(redis_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The example's Python worker, as its README runs it; ended by its pid."""
    with (tmp_path / "worker.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, str(EXAMPLE / "worker.py")], cwd=EXAMPLE,
                                env={**os.environ, "REDIS_URL": redis_url,
                                     "PYTHONPATH": str(ROOT)},
                                stdout=log, stderr=subprocess.STDOUT)
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def _agrees(node: dict[str, Any], py: sw.JobStatus) -> None:
    """A status Node read says what `Producer.status` says of the same record."""
    assert node["state"] == py.state
    assert node["attempts"] == py.attempts
    assert node["reason"] == py.reason and node["error"] == py.error
    assert node["deadLetterId"] == py.dead_letter_id
    assert node["fencingToken"] == py.fencing_token
    assert node["updatedAt"] == pytest.approx(py.updated_at)


def test_node_jobs_run_by_a_python_worker(node_modules: None, redis_url: str,
                                          r: redis.Redis, worker: subprocess.Popen[bytes]
                                          ) -> None:
    """Plain, keyed (twice), delayed, high-priority and failing jobs sent from Node run as
    documented, and Node reads their statuses back."""
    lines = [json.loads(line) for line in _node("demo.mjs", url=redis_url).splitlines()]
    assert worker.poll() is None, "the worker exited"
    jobs = {line["job"]: line for line in lines}
    assert set(jobs) == {"plain", "keyed", "delayed", "urgent", "failing"}

    with sw.Producer.from_url(redis_url) as producer:
        for line in lines:
            _agrees(line["status"], producer.status(STREAM, line["key"], group=GROUP))

    plain, keyed = jobs["plain"], jobs["keyed"]
    assert len(plain["key"]) == 32 and int(plain["key"], 16) >= 0  # a random key
    assert plain["status"]["result"]["payload"] == {"kind": "plain", "n": 1}
    # the keyed job: sent twice, run once; its options and ext types reached the worker
    runs = {k.decode(): int(v) for k, v in r.hgetall("{node-jobs}:runs").items()}
    assert runs == {jobs[j]["key"]: 1 for j in ("plain", "keyed", "delayed", "urgent")}
    result = keyed["status"]["result"]
    assert result["timeout"] == 2.5 and result["order_key"].startswith("customer-")
    assert result["types"] == {"amount": "Decimal", "at": "datetime", "day": "date",
                               "kind": "str"}
    assert result["payload"]["amount"] == {"$decimal": "12.50"}
    assert result["payload"]["at"] == "2026-12-01T06:00:00.000Z"
    # the delayed job went through {S}:delayed, the urgent one through {S}:p:high
    assert jobs["delayed"]["status"]["result"]["kind"] == "delayed"
    assert r.zcard("{node-jobs}:delayed") == 0
    assert jobs["urgent"]["status"]["result"]["priority"] == "high"
    assert r.xlen("{node-jobs}:p:high") == 1
    failing = jobs["failing"]["status"]
    assert failing["state"] == "dead" and failing["reason"] == "dead_letter: asked to fail"


def test_node_reads_a_cancelled_and_an_unknown_job(node_modules: None, redis_url: str) -> None:
    """A cancel recorded by the Python producer reads as cancelled from Node, with its
    reason; a key the group never saw reads as unknown."""
    with sw.Producer.from_url(redis_url) as producer:
        assert producer.cancel(STREAM, "order-9", group=GROUP, reason="customer left") \
            == "unknown"
        cancelled = json.loads(_node("status.mjs", STREAM, GROUP, "order-9", url=redis_url))
        _agrees(cancelled, producer.status(STREAM, "order-9", group=GROUP))
        assert cancelled["state"] == "cancelled" and cancelled["reason"] == "customer left"
        unknown = json.loads(_node("status.mjs", STREAM, GROUP, "never-sent", url=redis_url))
        assert unknown["state"] == "unknown"
