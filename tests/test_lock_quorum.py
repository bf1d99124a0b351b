"""A worker cut off from its lock masters (``lock_urls``) while another reaches them.

Two `streamwork run` processes share the stream's Redis and three Redlock masters; one
reaches the masters through a forwarder in this file, which the test cuts: connections
stay open and new ones are accepted, but nothing is relayed either way (a silent hang,
as a network partition looks). The cut-off worker must not hoard jobs it cannot lock:
it says so in one WARNING, /readyz answers 503, it hands what it read back and reads
nothing new, so the other worker runs every job during the partition; once the masters
answer again it logs "available again", is ready and serves again. The ledger shows each
job applied once.
"""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

import streamwork as sw
from streamwork._redis.server import free_port
from streamwork.testing import Ledger, wait_for
from tests.test_health import wait_probe

WORKER = "tests.workers.dedup:StagedLedgerWorker"
STREAM = "jobs"
VISIBILITY = 3.0  #: s: lease TTL; per-master timeout a tenth of it
JOBS = 300
LOST = "lock quorum unreachable"
BACK = "lock quorum available again"
#: s the other worker may take to run every job while the first is cut off (today's code
#: held up to concurrency + batch_size of them, heartbeated, for the whole partition)
RUN_ALL_WITHIN = 30.0
Spawn = Callable[..., subprocess.Popen[bytes]]


class Forwarder:
    """Relays connections from a loopback port to ``target``'s; `cut` makes it silent
    (held connections and new ones get no byte through, in either direction), `heal`
    drops every connection held meanwhile (their clients gave up on them) and relays
    again."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="forwarder").start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _keep(self, *socks: socket.socket) -> None:
        with self._lock:
            self._socks.extend(socks)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._keep(client)
            if self._cut.is_set():
                continue  # accepted, never answered
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            self._keep(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                if self._cut.is_set():
                    time.sleep(0.01)  # read nothing, send nothing
                    continue
                ready, _, _ = select.select([src], [], [], 0.05)
                if not ready or self._cut.is_set():
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):  # closed by heal or close (ValueError: fd -1)
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        with self._lock:
            held, self._socks = self._socks, []
        for s in held:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.heal()


def _spawn(spawn_worker: Spawn, url: str, lock_urls: list[str], log: Path,
           port: int) -> subprocess.Popen[bytes]:
    args = [a for u in lock_urls for a in ("--lock-url", u)]
    with log.open("wb") as out:  # the child writes to its own copy of the descriptor
        return spawn_worker(WORKER, url, *args, "--log-level", "INFO", "--visibility-timeout",
                            str(VISIBILITY), "--health-port", str(port), stdout=out)


def test_a_worker_cut_off_from_its_lock_masters_hoards_nothing(
    redis_url: str, r: redis.Redis, make_server: Any, spawn_worker: Spawn, tmp_path: Path
) -> None:
    """Worker A reaches the masters through forwarders, B directly. A is cut off, then
    jobs are sent: B runs them all while A stays cut off (A hands back what it read), A
    logs one WARNING, /readyz 503 throughout; healed, A logs that the quorum is back, is
    ready again and runs jobs again; every job applied once."""
    masters = [make_server() for _ in range(3)]
    forwarders = [Forwarder(m.port) for m in masters]
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    port_a, port_b = free_port(), free_port()
    producer = sw.Producer.from_url(redis_url)
    try:
        _spawn(spawn_worker, redis_url, [f.url for f in forwarders], log_a, port_a)
        _spawn(spawn_worker, redis_url, [m.url for m in masters], log_b, port_b)
        for port in (port_a, port_b):
            wait_probe(port, "/readyz", 200)
        for f in forwarders:
            f.cut()
        keys = [f"p{i}" for i in range(JOBS)]
        producer.send_many(STREAM, [{}] * JOBS, keys=keys)
        started = time.monotonic()
        wait_for(lambda: len(Ledger(r).counts()) == JOBS, timeout=RUN_ALL_WITHIN,
                 message="the worker with the quorum to run every job while the other is "
                         "cut off")
        took = time.monotonic() - started
        down = wait_probe(port_a, "/readyz", 503, live_too=True, timeout=5)
        assert "lock quorum" in down["reason"], down
        wait_probe(port_b, "/readyz", 200, timeout=5)
        reclaimed = [ln for ln in log_b.read_text(errors="replace").splitlines()
                     if "reclaimed" in ln]
        assert reclaimed, "B took over nothing A read: A never read any job?"
        cut_off = log_a.read_text(errors="replace")  # what A logged while it was cut off
        for f in forwarders:
            f.heal()
        wait_probe(port_a, "/readyz", 200, live_too=True, timeout=30)
        wait_for(lambda: BACK in log_a.read_text(errors="replace"), timeout=10,
                 message="A to say the lock quorum is back")
        more = [f"q{i}" for i in range(JOBS)]
        producer.send_many(STREAM, [{}] * JOBS, keys=more)
        wait_for(lambda: len(Ledger(r).counts()) == 2 * JOBS, timeout=60,
                 message="every job sent after the partition to run")
        report = Ledger(r).report(keys + more)
        assert report.exactly_once, (report.lost[:3], list(report.twice.items())[:3])
        text_a = log_a.read_text(errors="replace")
        # one WARNING and one INFO per outage: the partition's, and on a loaded machine
        # perhaps a short one after it (a master answering later than its timeout)
        outages = [ln for ln in text_a.splitlines() if LOST in ln]
        assert 1 <= len(outages) == text_a.count(BACK), outages
        # cut off, A never took the outage for contention (after the heal, a job B took
        # over from a loaded A may be: that is contention)
        assert "job lease held elsewhere" not in cut_off
        assert LOST not in log_b.read_text(errors="replace")
        print(f"\nB ran all {JOBS} jobs within {took:.1f} s of their sending, A cut off; "
              f"B's reclaims of what A handed back: {reclaimed}")
    finally:
        producer.close()
        for f in forwarders:
            f.close()


def test_leases_lost_in_a_lock_quorum_outage_are_folded_into_it(
    redis_url: str, r: redis.Redis, make_server: Any, spawn_worker: Spawn, tmp_path: Path
) -> None:
    """A is cut off while its handlers run and it reads nothing new: its heartbeats find
    the outage (/readyz 503, one WARNING); their leases run out (their outcomes are not
    written), the jobs run again at B, once each, and A logs at most one line for the
    leases it lost meanwhile, no ERROR per lost lease; healed, A is ready again."""
    masters = [make_server() for _ in range(3)]
    forwarders = [Forwarder(m.port) for m in masters]
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    port_a, port_b = free_port(), free_port()
    producer = sw.Producer.from_url(redis_url)
    try:
        _spawn(spawn_worker, redis_url, [f.url for f in forwarders], log_a, port_a)
        wait_probe(port_a, "/readyz", 200)
        slow = [f"s{i}" for i in range(8)]  # one per handler of A
        producer.send_many(STREAM, [{"sleep": 3 * VISIBILITY}] * len(slow), keys=slow)
        wait_for(lambda: r.llen("granted") == len(slow), timeout=20,
                 message="A to run every slow job")
        _spawn(spawn_worker, redis_url, [m.url for m in masters], log_b, port_b)
        wait_probe(port_b, "/readyz", 200)
        for f in forwarders:
            f.cut()
        down = wait_probe(port_a, "/readyz", 503, live_too=True, timeout=15)
        assert "lock quorum" in down["reason"], down
        fresh = [f"f{i}" for i in range(50)]  # A reads none: its gate is closed
        producer.send_many(STREAM, [{}] * len(fresh), keys=fresh)
        wait_for(lambda: Ledger(r).report(slow + fresh).applied == len(slow + fresh),
                 timeout=60, message="B to run every job, the slow ones again")
        report = Ledger(r).report(slow + fresh)
        assert report.exactly_once, (report.lost[:3], list(report.twice.items())[:3])
        text_a = log_a.read_text(errors="replace")
        assert text_a.count(LOST) == 1, [ln for ln in text_a.splitlines() if LOST in ln]
        lost_lines = [ln for ln in text_a.splitlines() if "lease lost" in ln]
        assert not [ln for ln in lost_lines if " ERROR " in ln], lost_lines
        assert len(lost_lines) <= 1, lost_lines
        for f in forwarders:
            f.heal()
        wait_probe(port_a, "/readyz", 200, live_too=True, timeout=30)
        print(f"\nA's lines about lost leases: {lost_lines}")
    finally:
        producer.close()
        for f in forwarders:
            f.close()


def test_the_forwarder_relays_and_goes_silent(make_server: Any) -> None:
    """The harness itself: commands pass through, hang while cut, pass again healed."""
    server = make_server()
    forwarder = Forwarder(server.port)
    client = redis.Redis.from_url(forwarder.url, socket_timeout=0.5,
                                  socket_connect_timeout=0.5)
    try:
        assert client.ping()
        forwarder.cut()
        with pytest.raises(redis.exceptions.TimeoutError):
            client.ping()
        forwarder.heal()
        assert wait_for(lambda: _pings(client), timeout=5)
    finally:
        client.close()
        forwarder.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
