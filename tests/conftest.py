"""Fixtures: private redis-server processes on free loopback ports, clients, worker processes.

Server order: redis-server on PATH, else the `embedded` extra's Valkey binary, else
$REDIS_URL (a server we cannot kill or restart: fault tests skip), else testcontainers where
Docker runs. On CI (CI=true) a missing server is a failure, not a skip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from streamwork._redis.server import (
    PORT_RANGE_ENV,
    RedisServer,
    _ephemeral_low,
    find_server_binary,
)
from streamwork.errors import StreamworkError

ROOT = Path(__file__).resolve().parent.parent


def _own_port_band() -> None:
    """Under pytest-xdist, give this worker process (and the processes it starts) its own
    band of ports for `free_port`: a port picked here and bound a moment later by a server
    or a worker's probes cannot be picked meanwhile by a test on another xdist worker."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or os.environ.get(PORT_RANGE_ENV):
        return
    lo, hi = 10000, min(_ephemeral_low(), 65536)
    width = (hi - lo) // int(count)
    start = lo + int(worker.removeprefix("gw")) * width
    os.environ[PORT_RANGE_ENV] = f"{start}-{start + width - 1}"


_own_port_band()


def no_server(why: str) -> None:
    """Skip locally, but fail on CI (CI=true): a missing server must not pass silently."""
    if os.environ.get("CI"):
        pytest.fail(f"no Redis server for the tests on CI: {why}")
    pytest.skip(f"no Redis server available: {why}")


def _have_binary() -> bool:
    try:
        find_server_binary()
    except StreamworkError:
        return False
    return True


@pytest.fixture(scope="session")
def _session_redis() -> Iterator[str]:
    if _have_binary():
        with RedisServer() as server:
            yield server.url
        return
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    try:
        from testcontainers.redis import RedisContainer  # type: ignore[import-not-found]
    except ImportError:
        no_server("no redis-server on PATH, no 'embedded' extra, no $REDIS_URL, no testcontainers")
    with RedisContainer("redis:7") as container:  # pragma: no cover - needs Docker
        host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
        yield f"redis://{host}:{port}/0"


@pytest.fixture(name="redis_url")
def _redis_url(_session_redis: str) -> str:
    """URL of a clean Redis (FLUSHALL before each test)."""
    client = redis.Redis.from_url(_session_redis)
    client.flushall()
    client.close()
    return _session_redis


@pytest.fixture(name="r")
def _r(redis_url: str) -> Iterator[redis.Redis]:
    """A sync client on the clean Redis."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(name="make_server")
def _make_server() -> Iterator[Callable[..., RedisServer]]:
    """Factory of private servers this test may kill and restart; all closed afterwards."""
    if not _have_binary():
        no_server("fault tests need a server binary they can kill and restart")
    made: list[RedisServer] = []

    def make(**kwargs: Any) -> RedisServer:
        server = RedisServer(**kwargs).start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


@pytest.fixture(name="spawn_worker")
def _spawn_worker() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Factory: ``spawn_worker("tests.workers.ledger:LedgerWorker", url, "--concurrency", "4")``
    starts ``streamwork run`` in a child process; every child is ended by pid afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(target: str, url: str, *args: str, env: dict[str, str] | None = None,
              stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamwork", "run", target, "--url", url,
             "--log-level", "WARNING", *args],
            cwd=ROOT, env=full_env, stdout=stdout, stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


#: the modules that keep one xdist worker busy longest (15-110 s each, measured with
#: --durations=0), longest first. With --dist loadfile a module runs whole on one worker,
#: in collection order, so these start first: a long module started last would be the
#: run's tail while the other workers sit idle (longest-first scheduling)
SLOW_MODULES = [
    "tests/test_outage.py", "tests/test_sentinel.py", "tests/test_pause.py",
    "tests/test_bench_scaling.py", "tests/test_cluster_failover.py",
    "tests/faults/test_nemesis.py", "tests/test_batch_handlers.py", "tests/test_bench.py",
    "tests/test_chains_cluster.py", "tests/test_examples.py", "tests/test_function_worker.py",
    "tests/faults/test_fault_matrix.py", "tests/test_dedup.py", "tests/test_processes.py",
    "tests/test_health.py", "tests/test_docs.py", "tests/test_redlock_leases.py",
    "tests/test_cluster.py", "tests/faults/test_redis_restart.py", "tests/test_dashboard.py",
    "tests/faults/test_nemesis_cluster.py", "tests/test_recovery.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the slowest modules first (`SLOW_MODULES`); the others keep their order."""
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}

    def module_rank(item: pytest.Item) -> int:
        path = Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
        return rank.get(path, len(rank))

    items.sort(key=module_rank)
