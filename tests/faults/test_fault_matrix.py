"""Fault matrix: one test per class of error Redis can return, each against a real
redis-server put in that state while a worker runs under load.

The rule (a worker is whole, or it exits): transient errors (connection
loss, timeouts, LOADING, BUSY, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, OOM) -> back
off and retry; a vanished group or stream (FLUSHALL, a server back empty) -> recreate the
group and go on; anything else -> the worker stops loudly: ``serve()`` raises
WorkerFailed and ``streamwork run`` exits non-zero.

A fault the worker must ride out ends with every job whose send Redis acknowledged applied
exactly once (the ledger is fed by a staged write, so effects are once-only by
construction), nothing pending, no dead letter, the ``serve()`` task still running and
``worker.health()`` alive with no dead internal task. Workers run in-process, so every
call that blocks on a stalled server (DEBUG SLEEP, a busy script, CLIENT PAUSE, a restart)
runs in a thread: the event loop, and the worker on it, keeps going meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._redis.server import RedisServer
from streamwork._wire.keys import StreamKeys
from streamwork.errors import WorkerFailed
from streamwork.testing import Ledger, await_for, stream_idle, wait_for
from tests.helpers.looks import safe
from tests.helpers.serving import serving
from tests.workers.faults import LEDGER, STREAM, FaultLedgerWorker

GROUP = FaultLedgerWorker.group
KEYS = StreamKeys.for_stream(STREAM)
TARGET = "tests.workers.faults:FaultLedgerWorker"

FAULT_SECONDS = 2.0  #: how long a stalled or refusing server stays that way
PROGRESS_TIMEOUT = 45.0  #: s to wait for the next sign of progress (a loaded 2-core CI box)
SETTLE_TIMEOUT = 60.0  #: s for every sent job to be applied and acknowledged
EXIT_TIMEOUT = 30.0  #: s a worker has to stop (asked to, or on a fatal error)
BEFORE = 40  #: jobs handled before the fault: jobs are flowing when it strikes
AFTER = 40  #: jobs handled after the fault: the worker still reads, runs and completes
#: slow jobs running when the data vanishes: half the runners, so the reader still has room
#: and sits blocked in XREADGROUP (a FLUSHALL then answers it UNBLOCKED)
HELD = FaultLedgerWorker.concurrency // 2
JOB: dict[str, Any] = {"sleep": 0.05}  #: each job holds its delivery 50 ms: some are always held

#: a read-only script that keeps the server busy for ARGV[1] microseconds, then returns
BUSY_LUA = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  local now = redis.call('TIME')
until now[1] * 1000000 + now[2] - start >= tonumber(ARGV[1])
return 1
"""

#: replies a sender may retry (the same list the worker must ride out)
_RETRYABLE = (
    redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
    redis.exceptions.BusyLoadingError, redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError, redis.exceptions.MasterDownError,
)


# ---- helpers ------------------------------------------------------------------------


@pytest.fixture(name="connect")
def _connect() -> Iterator[Callable[..., redis.Redis]]:
    """Factory of sync clients for the test's own looks and injections; closed afterwards."""
    made: list[redis.Redis] = []

    def connect(url: str, timeout: float = 30.0) -> redis.Redis:
        client = redis.Redis.from_url(url, socket_timeout=timeout)
        made.append(client)
        return client

    yield connect
    for client in made:
        client.close()


def _retryable(exc: redis.exceptions.ResponseError) -> bool:
    return isinstance(exc, _RETRYABLE) or str(exc).startswith("BUSY ")


class Feeder:
    """Sends jobs from a thread, paced, until stopped. ``sent`` holds the keys whose send
    returned (acknowledged by Redis): those must not be lost. A refused send (OOM, BUSY,
    READONLY...) is tried again; connection errors are the Producer's own retries."""

    def __init__(self, url: str, prefix: str, payload: dict[str, Any], every: float = 0.01):
        self.url, self.prefix, self.payload, self.every = url, prefix, payload, every
        self.sent: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"feeder-{prefix}", daemon=True)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with sw.Producer.from_url(self.url, retry_timeout=60) as producer:
                for i in itertools.count():
                    key = f"{self.prefix}-{i}"
                    if not self._send(producer, key, i):
                        return
                    self.sent.append(key)
                    if self._stop.wait(self.every):
                        return
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def _send(self, producer: sw.Producer, key: str, i: int) -> bool:
        while True:
            try:
                producer.send(STREAM, {**self.payload, "i": i}, key=key)
                return True
            except redis.exceptions.ResponseError as exc:
                if not _retryable(exc):
                    raise
            if self._stop.wait(0.02):
                return False  # refused and no longer wanted: not sent

    def stop(self) -> list[str]:
        """Stop sending; the acknowledged keys. Raises if the feeder failed."""
        self.close()
        assert not self._thread.is_alive(), "the feeder thread is stuck in a send"
        if self.errors:
            raise AssertionError(f"feeder {self.prefix!r} failed: {self.errors[0]!r}")
        return list(self.sent)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(90)


def _describe(exc: BaseException | None) -> str:
    return "nothing" if exc is None else f"{type(exc).__name__}: {exc}"


def _internal_tasks() -> list[asyncio.Task[Any]]:
    """The worker's internal tasks as asyncio names them, so a dead one is reported at
    once (health() says the same once it exists)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("streamwork-")]


@dataclass
class Watched:
    """A worker serving in this loop, and the internal tasks it had once started."""

    worker: FaultLedgerWorker
    task: asyncio.Task[None]
    internal: list[asyncio.Task[Any]] = field(default_factory=list)

    def note_tasks(self) -> None:
        self.internal = _internal_tasks()

    def dead_tasks(self) -> list[str]:
        return [f"{t.get_name()}: {_describe(t.exception())}" for t in self.internal
                if t.done() and not t.cancelled() and t.exception() is not None]

    def check_whole(self) -> None:
        """Fail now, not at a timeout, if serve() ended or the worker is half-alive."""
        if self.task.done():
            exc = None if self.task.cancelled() else self.task.exception()
            raise AssertionError(f"serve() ended by itself with {_describe(exc)}; it had to "
                                 "ride the fault out") from exc
        dead = self.dead_tasks()
        if dead:
            raise AssertionError(f"half-alive worker: internal tasks died while serve() runs "
                                 f"on: {dead}")
        health = getattr(self.worker, "health", None)
        if health is not None and health().dead_tasks:
            raise AssertionError(f"half-alive worker: {health()}")



def _applied(r: redis.Redis, prefix: str = "job-") -> int:
    """Distinct job keys (with ``prefix``) the ledger has seen applied."""
    return sum(1 for k in Ledger(r, name=LEDGER).counts() if k.startswith(prefix))


def _reading(r: redis.Redis) -> bool:
    """The worker created its group and is blocked in XREADGROUP on it (a blocked read
    creates no consumer on Redis 7.0, so the client list is the place to look)."""
    return _group_exists(r) and _blocked_reader(r)


def _group_exists(r: redis.Redis) -> bool:
    try:
        return any(g["name"].decode() == GROUP for g in r.xinfo_groups(STREAM))
    except redis.exceptions.ResponseError:
        return False


def _pending(r: redis.Redis) -> int:
    try:
        return int(r.xpending(STREAM, GROUP)["pending"])
    except redis.exceptions.ResponseError:
        return 0


def _blocked_reader(r: redis.Redis) -> bool:
    return any(c.get("cmd") == "xreadgroup" and "b" in c["flags"] for c in r.client_list())


def _errors(r: redis.Redis, code: str) -> int:
    """How many error replies starting with ``code`` the server has sent (INFO errorstats)."""
    return int(r.info("errorstats").get(f"errorstat_{code}", {}).get("count", 0))


def _settled(r: redis.Redis, expected: list[str]) -> bool:
    """Every expected key applied, and the group has read and acknowledged everything."""
    if r.hlen(LEDGER) < len(expected):
        return False
    counts = Ledger(r, name=LEDGER).counts()
    if any(counts.get(k, 0) == 0 for k in expected):
        return False
    return bool(r.exists(STREAM)) and stream_idle(r, STREAM, GROUP)


def _state(r: redis.Redis, w: Watched, expected: list[str]) -> str:
    try:
        counts = Ledger(r, name=LEDGER).counts()
        missing = [k for k in expected if counts.get(k, 0) == 0]
        return (f"{len(missing)} of {len(expected)} sent jobs not applied (e.g. {missing[:3]}), "
                f"pending {_pending(r)}, worker counts {dict(w.worker.counts)}, "
                f"dead internal tasks {w.dead_tasks()}")
    except redis.exceptions.RedisError as exc:
        return f"state unreadable: {exc!r}"


async def _until(w: Watched, what: str, predicate: Callable[[], Any],
                 timeout: float = PROGRESS_TIMEOUT,
                 state: Callable[[], str] = lambda: "") -> None:
    """Wait for ``predicate``; fail at once if the worker ends or goes half-alive."""
    def look() -> Any:
        w.check_whole()
        return safe(predicate)
    try:
        await await_for(look, timeout, message=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}. {state()}") from None


async def _settle_and_check(w: Watched, r: redis.Redis, expected: list[str]) -> None:
    """Every sent job applied exactly once, nothing pending, nothing dead, serve() still
    running with every internal task alive."""
    await _until(w, "every sent job applied and acknowledged", lambda: _settled(r, expected),
                 SETTLE_TIMEOUT, lambda: _state(r, w, expected))
    report = Ledger(r, name=LEDGER).report(expected)
    assert not report.lost, f"{len(report.lost)} acknowledged jobs lost: {report.lost[:5]}"
    assert not report.twice, f"jobs applied more than once: {dict(list(report.twice.items())[:5])}"
    assert _pending(r) == 0
    assert r.xlen(KEYS.dead) == 0, f"dead letters: {r.xrange(KEYS.dead, count=3)}"
    w.check_whole()


async def _healthy_then_stop(w: Watched) -> None:
    """health() says alive with no dead task; then the worker stops cleanly when asked."""
    health = w.worker.health()
    assert health.alive, health
    assert not health.dead_tasks, health
    assert not w.task.done(), "serve() ended by itself"
    w.worker.stop()
    await asyncio.wait_for(w.task, EXIT_TIMEOUT)


async def _ride_out(url: str, inject: Callable[[], Awaitable[None]], r: redis.Redis,
                    payload: dict[str, Any] = JOB) -> None:
    """Jobs flow to a worker, ``inject`` puts the server in a fault and returns once the
    fault is over; more jobs flow; then every sent job must be applied exactly once."""
    worker = FaultLedgerWorker.from_url(url)
    async with serving(worker, exit_timeout=EXIT_TIMEOUT) as task:
        w = Watched(worker, task)
        await _until(w, "the worker reading", lambda: _reading(r))
        w.note_tasks()
        feeder = Feeder(url, "job", payload).start()
        try:
            await _until(w, f"{BEFORE} jobs handled before the fault",
                         lambda: _applied(r) >= BEFORE)
            await inject()
            mark = _applied(r)
            await _until(w, f"{AFTER} more jobs handled after the fault",
                         lambda: _applied(r) >= mark + AFTER,
                         state=lambda: _state(r, w, list(feeder.sent)))
        except BaseException:
            feeder.close()
            raise
        sent = feeder.stop()
        await _settle_and_check(w, r, sent)
        await _healthy_then_stop(w)


async def _data_vanishes(url: str, inject: Callable[[], Awaitable[None]],
                         r: redis.Redis) -> None:
    """The worker holds slow jobs (and its reader is blocked) when ``inject`` wipes the
    server's data. Jobs sent before are gone with it; the worker must recreate its group by
    itself, then handle every job sent afterwards exactly once, and report what vanished."""
    worker = FaultLedgerWorker.from_url(url)
    async with serving(worker, exit_timeout=EXIT_TIMEOUT) as task:
        w = Watched(worker, task)
        await _until(w, "the worker reading", lambda: _reading(r))
        w.note_tasks()
        with sw.Producer.from_url(url) as producer:
            producer.send_many(STREAM, [{"sleep": 1.0}] * HELD,
                               keys=[f"held-{i}" for i in range(HELD)])
        await _until(w, f"{HELD} slow jobs held", lambda: _pending(r) >= HELD)
        await _until(w, "the reader blocked in XREADGROUP", lambda: _blocked_reader(r))
        await inject()  # no await before it starts: the reader is still blocked
        await _until(w, "the group recreated by the worker (nothing was sent since)",
                     lambda: _group_exists(r))
        feeder = Feeder(url, "job", JOB).start()
        try:
            await _until(w, f"{AFTER} jobs sent after the data vanished handled",
                         lambda: _applied(r) >= AFTER,
                         state=lambda: _state(r, w, list(feeder.sent)))
        except BaseException:
            feeder.close()
            raise
        sent = feeder.stop()
        await _settle_and_check(w, r, sent)
        vanished = worker.counts["vanished"]
        assert 0 < vanished <= HELD, (
            f"counts['vanished'] is {vanished}: the worker held {HELD} deliveries whose "
            "entries vanished and must report them")
        await _healthy_then_stop(w)


def _wrongtype(r: redis.Redis) -> None:
    """Replace the stream with a string in one step: every stream command now gets WRONGTYPE."""
    pipe = r.pipeline(transaction=True)
    pipe.delete(STREAM)
    pipe.set(STREAM, "not a stream")
    pipe.execute()


# ---- transient: back off and retry -----------------------------------------------------


async def test_oom_is_ridden_out(make_server: Callable[..., RedisServer],
                                 connect: Callable[..., redis.Redis]) -> None:
    """OOM (maxmemory reached, noeviction) is transient: the worker backs off and retries,
    keeps finished outcomes until they are written, and every job is applied once."""
    server = make_server()
    r, admin = connect(server.url), connect(server.url)

    def refuses_writes() -> bool:
        try:
            admin.set("{faults}:probe", "x")
        except redis.exceptions.OutOfMemoryError:
            return True
        return False

    async def inject() -> None:
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used + 64 * 1024)
        try:
            await await_for(refuses_writes, PROGRESS_TIMEOUT, message="Redis refusing with OOM")
            await asyncio.sleep(FAULT_SECONDS)  # how long the fault lasts, not a check
        finally:
            admin.config_set("maxmemory", 0)
        assert _errors(admin, "OOM") > 1

    # padded jobs, so the stream fills the little room left quickly
    await _ride_out(server.url, inject, r, payload={**JOB, "pad": "x" * 1000})


async def test_busy_script_is_ridden_out(make_server: Callable[..., RedisServer],
                                         connect: Callable[..., redis.Redis]) -> None:
    """BUSY (another client's script runs past busy-reply-threshold) is transient: the
    worker backs off and retries; every job is applied once."""
    server = make_server()
    r, admin = connect(server.url), connect(server.url)
    try:
        admin.config_set("busy-reply-threshold", 100)
    except redis.exceptions.ResponseError:  # before Redis 7: the old name
        admin.config_set("lua-time-limit", 100)

    def busy() -> None:
        client = redis.Redis.from_url(server.url, socket_timeout=FAULT_SECONDS + 30)
        try:
            client.eval(BUSY_LUA, 0, round(FAULT_SECONDS * 1_000_000))
        finally:
            client.close()

    async def inject() -> None:
        await asyncio.to_thread(busy)
        assert _errors(admin, "BUSY") > 0, "nobody was refused with BUSY"

    await _ride_out(server.url, inject, r)


async def test_debug_sleep_is_ridden_out(make_server: Callable[..., RedisServer],
                                         connect: Callable[..., redis.Redis]) -> None:
    """A server that stalls (DEBUG SLEEP, longer than the visibility timeout) loses no job
    and applies none twice; the worker carries on afterwards."""
    server = make_server(extra_args=["--enable-debug-command", "local"])
    r = connect(server.url)

    def stall() -> float:
        client = redis.Redis.from_url(server.url, socket_timeout=FAULT_SECONDS + 30)
        try:
            started = time.monotonic()
            client.execute_command("DEBUG", "SLEEP", FAULT_SECONDS)
            return time.monotonic() - started
        finally:
            client.close()

    async def inject() -> None:
        assert await asyncio.to_thread(stall) >= FAULT_SECONDS * 0.9

    await _ride_out(server.url, inject, r)


async def test_client_pause_is_ridden_out(make_server: Callable[..., RedisServer],
                                          connect: Callable[..., redis.Redis]) -> None:
    """CLIENT PAUSE ALL (every client's commands held for 2 s) loses no job and applies
    none twice; the worker carries on afterwards."""
    server = make_server()
    r, admin = connect(server.url), connect(server.url)

    def held_ping() -> float:
        client = redis.Redis.from_url(server.url, socket_timeout=FAULT_SECONDS + 30)
        try:
            started = time.monotonic()
            client.ping()
            return time.monotonic() - started
        finally:
            client.close()

    async def inject() -> None:
        admin.execute_command("CLIENT", "PAUSE", round(FAULT_SECONDS * 1000), "ALL")
        # a PING from another client returns when the pause ends
        assert await asyncio.to_thread(held_ping) >= FAULT_SECONDS * 0.5

    await _ride_out(server.url, inject, r)


async def test_readonly_replica_is_ridden_out_until_promoted(
        make_server: Callable[..., RedisServer], connect: Callable[..., redis.Redis]) -> None:
    """READONLY (the worker's URL points at a replica) is transient: the worker keeps
    retrying instead of dying; once the replica is promoted, every job sent to the master
    before and to the new master after is applied once."""
    master, replica = make_server(), make_server()
    rm, rr = connect(master.url), connect(replica.url)
    rr.execute_command("REPLICAOF", "127.0.0.1", master.port)
    rr.config_set("replica-read-only", "yes")
    wait_for(lambda: rr.info("replication").get("master_link_status") == "up", PROGRESS_TIMEOUT,
             interval=0.05, message="the replica in sync with its master")

    worker = FaultLedgerWorker.from_url(replica.url)
    async with serving(worker, exit_timeout=EXIT_TIMEOUT) as task:
        w = Watched(worker, task)
        await _until(w, "the worker refused with READONLY",
                     lambda: _errors(rr, "READONLY") > 0)
        feeder = Feeder(master.url, "job", JOB).start()
        try:
            await _until(w, f"{BEFORE} jobs sent to the master",
                         lambda: len(feeder.sent) >= BEFORE)
        except BaseException:
            feeder.close()
            raise
        before = feeder.stop()
        await _until(w, "the jobs replicated", lambda: rr.xlen(STREAM) >= len(before))
        refused = _errors(rr, "READONLY")
        await _until(w, "the worker still trying", lambda: _errors(rr, "READONLY") > refused)
        assert not _applied(rr), "nothing can be applied on a read-only replica"

        rr.execute_command("REPLICAOF", "NO", "ONE")  # failover: the replica is the master
        await _until(w, "jobs handled on the promoted replica",
                     lambda: _applied(rr) >= len(before))
        w.note_tasks()
        feeder = Feeder(replica.url, "after", JOB).start()
        try:
            await _until(w, f"{AFTER} jobs sent after the promotion handled",
                         lambda: _applied(rr, "after-") >= AFTER)
        except BaseException:
            feeder.close()
            raise
        after = feeder.stop()
        await _settle_and_check(w, rr, before + after)
        await _healthy_then_stop(w)
    assert not rm.exists(LEDGER), "the worker wrote to the master it was never pointed at"


# ---- the data vanished: recreate the group and go on ----------------------------------


async def test_flushall_mid_run_recreates_the_group(
        make_server: Callable[..., RedisServer], connect: Callable[..., redis.Redis]) -> None:
    """FLUSHALL while the worker holds jobs and its reader is blocked (UNBLOCKED, then
    NOGROUP): the worker recreates its group (MKSTREAM) by itself, handles every job sent
    afterwards exactly once, reports the deliveries that vanished, and stays whole."""
    server = make_server()
    r, admin = connect(server.url), connect(server.url)

    async def inject() -> None:
        admin.flushall()

    await _data_vanishes(server.url, inject, r)
    assert _errors(r, "UNBLOCKED") + _errors(r, "NOGROUP") > 0, "the worker never noticed"


async def test_restart_without_persistence_recreates_the_group(
        make_server: Callable[..., RedisServer], connect: Callable[..., redis.Redis]) -> None:
    """The server restarts empty (no persistence) while the worker holds jobs: after
    reconnecting, the worker recreates its group by itself, handles every job sent
    afterwards exactly once, reports the deliveries that vanished, and stays whole."""
    server = make_server(appendfsync=None)
    r = connect(server.url)

    async def inject() -> None:
        await asyncio.to_thread(server.restart)
        assert not r.xlen(STREAM), "the restarted server should have come back empty"

    await _data_vanishes(server.url, inject, r)


# ---- anything else: stop loudly ---------------------------------------------------------


async def test_wrongtype_stops_serve_with_worker_failed(
        make_server: Callable[..., RedisServer], connect: Callable[..., redis.Redis],
        caplog: pytest.LogCaptureFixture) -> None:
    """A non-transient error (another client replaced the stream with a string: WRONGTYPE)
    is not ridden out: serve() stops by itself within bounded time and raises WorkerFailed
    naming the cause, after logging it; it does not linger half-alive."""
    caplog.set_level(logging.ERROR, logger="streamwork")
    server = make_server()
    r = connect(server.url)
    worker = FaultLedgerWorker.from_url(server.url)
    async with serving(worker, exit_timeout=EXIT_TIMEOUT) as task:
        w = Watched(worker, task)
        await _until(w, "the worker reading", lambda: _reading(r))
        w.note_tasks()
        with sw.Producer.from_url(server.url) as producer:
            producer.send_many(STREAM, [JOB] * 20, keys=[f"job-{i}" for i in range(20)])
        await _until(w, "the first jobs handled", lambda: _applied(r) >= 20)
        _wrongtype(r)
        done, _ = await asyncio.wait({w.task}, timeout=EXIT_TIMEOUT)
        assert w.task in done, (
            f"serve() still running {EXIT_TIMEOUT:g}s after every stream command began to fail "
            f"with WRONGTYPE; dead internal tasks: {w.dead_tasks()}")
        exc = w.task.exception()
        assert isinstance(exc, WorkerFailed), f"serve() raised {exc!r}, not WorkerFailed"
        assert "WRONGTYPE" in str(exc), exc
    logged = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert any("WRONGTYPE" in rec.getMessage() or "WRONGTYPE" in str(rec.exc_info)
               for rec in logged), "the cause was not logged"


def test_wrongtype_makes_streamwork_run_exit_nonzero(
        make_server: Callable[..., RedisServer], connect: Callable[..., redis.Redis],
        spawn_worker: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    """`streamwork run` whose worker meets a non-transient error (WRONGTYPE) exits by
    itself with a non-zero code within bounded time, and its log names the cause."""
    server = make_server()
    r = connect(server.url)
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = spawn_worker(TARGET, server.url, stdout=log)
        wait_for(lambda: proc.poll() is not None or _reading(r), PROGRESS_TIMEOUT,
                 interval=0.05, message="the worker process reading")
        assert proc.poll() is None, f"the worker exited at start: {log_path.read_text()}"
        with sw.Producer.from_url(server.url) as producer:
            producer.send_many(STREAM, [JOB] * 20, keys=[f"job-{i}" for i in range(20)])
        wait_for(lambda: _applied(r) >= 20, PROGRESS_TIMEOUT, interval=0.05,
                 message="the first jobs handled")
        _wrongtype(r)
        try:
            code = proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
    output = log_path.read_text(errors="replace")
    assert code is not None, (f"`streamwork run` still running {EXIT_TIMEOUT:g}s after "
                              f"WRONGTYPE; log tail:\n{output[-2000:]}")
    assert code != 0, f"`streamwork run` exited 0 after a fatal error; log:\n{output[-2000:]}"
    assert "WRONGTYPE" in output, f"the log does not name the cause:\n{output[-2000:]}"
