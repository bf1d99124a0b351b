"""The cluster benchmark (`python -m benchmarks.cluster`): a tiny run on 1 and 2 masters
reports every scenario for each master count, with every job produced and acknowledged.
Figures are checked for shape, never for speed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cluster import SCENARIOS, markdown
from benchmarks.cluster_nodes import slot_ranges
from streamwork._redis.server import find_server_binary
from streamwork.errors import StreamworkError
from tests.conftest import no_server

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
JOBS = 300
BENCH_TIMEOUT = 140  #: s; within the suite's 180 s per test (the fixture's setup counts)


def test_slot_ranges_are_redis_clis() -> None:
    """The hand-made 1- and 2-master layouts use redis-cli's formula, which for 3 masters
    gives what `redis-cli --cluster create` prints."""
    assert slot_ranges(1) == [(0, 16383)]
    assert slot_ranges(2) == [(0, 8191), (8192, 16383)]
    assert slot_ranges(3) == [(0, 5460), (5461, 10922), (10923, 16383)]


@pytest.fixture(scope="module")
def tiny_run() -> dict[str, Any]:
    try:
        find_server_binary()
    except StreamworkError as exc:
        no_server(f"the cluster bench starts redis-server processes: {exc}")
    if shutil.which("redis-cli") is None and not Path(
            find_server_binary()).with_name("valkey-cli").exists():
        no_server("no redis-cli (or valkey-cli) to create a cluster with")
    # 8 phases, each starting worker processes: 40-60 s on a busy 2-core machine. The
    # bench runs in a process group of its own, so a time-out ends it with its
    # redis-servers and workers (killing the bench alone would leave them running).
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.cluster", "--jobs", str(JOBS), "--repeats", "1",
         "--masters", "1,2", "--no-warm-up", "--retries", "0", "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=BENCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the bench took over {BENCH_TIMEOUT} s: {err.decode()[-3000:]}")
    assert proc.returncode == 0, err.decode()[-3000:]
    result: dict[str, Any] = json.loads(out)
    return result


def test_tiny_run_counts_every_job_on_each_master_count(tiny_run: dict[str, Any]) -> None:
    """Each master count has each scenario with a positive figure and ratio; every job
    produced is in the partitions, every one is acked by the workers, none is left
    pending; the 6 partitions sit 6 on the one master, 3 and 3 on two."""
    result = tiny_run
    assert result["params"]["masters"] == [1, 2]
    assert result["params"]["jobs"] == JOBS and result["params"]["partitions"] == 6
    assert result["baseline_masters"] == 1 and result["runs_done_again"] == 0
    # the 6 partitions spread evenly over the masters
    assert result["clusters"]["1"]["partitions_per_master"] == [6]
    assert result["clusters"]["2"]["partitions_per_master"] == [3, 3]
    for m in ("1", "2"):
        assert len(result["clusters"][m]["ports"]) == int(m)
    sc = result["scenarios"]
    assert set(sc) == set(SCENARIOS)
    for name in SCENARIOS:
        assert set(sc[name]) == {"1", "2"}
        for m, one in sc[name].items():
            assert one["jobs_per_s"] > 0, (name, m)
            assert one["ratio"] > 0, (name, m)
            assert one["jobs_per_run"] == JOBS
            # produce runs before each consume mode: two per repeat
            assert len(one["runs_jobs_per_s"]) == (2 if name == "produce" else 1)
            assert 0 < one["jobs"] <= JOBS
            for counted in one["counted"]:
                assert counted["retried"] == 0  # --retries 0
                if name == "produce":
                    assert counted["in_streams"] == JOBS, counted
                    assert len(counted["per_partition"]) == 6
                else:
                    assert counted["acked"] == JOBS, counted
                    assert counted["pending_after"] == 0, counted
                    assert sum(counted["per_worker"]) == JOBS
        assert sc[name]["1"]["ratio"] == 1.0
    table = markdown(result)
    assert table.count("\n") == 2 + 2 * len(SCENARIOS) - 1
    assert "2 masters" in table
