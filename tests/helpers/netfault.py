"""Network faults for tests: a TCP forwarder per test in front of a test-owned redis-server,
and the faults a network does to the connections through it.

`NetFaults` (a context manager; one per test, see the ``net`` fixtures of the test modules)
owns everything: each `Forwarder` listens on a free loopback port and relays every
connection to the server's port (an asyncio loop on a thread of the test process), so a
client given ``forwarder.url`` talks to Redis through it. The faults:

* `NetFaults.partition` - a silent partition both ways: iptables DROP rules on the
  forwarder's port only (packets to it and from it), no RST, nothing closed: every
  connection through it just stops hearing back, as across a real partition;
* `NetFaults.partition` with ``replies_only`` - the reply path only: requests still reach
  Redis (and are executed), their replies never come back;
* `Forwarder.impair` - latency (100 ms +- 30 ms by default, each direction, order kept)
  with 2 % of the chunks "lost": the forwarder itself holds such a chunk back one TCP
  retransmission timeout more (a lost segment on a TCP connection is resent after the RTO,
  never dropped from the byte stream). The kernel here has no netem; this is what a lossy
  link looks like to the two ends of a TCP connection.

Every rule carries the comment ``streamwork-netfault:<pid>:<port>`` (`TAG`), and is
removed when its partition heals, when the NetFaults closes (its ``finally``: the fixture's
teardown) and, for a process that died with rules in place, by the next NetFaults started
(`remove_leftovers`: rules of a pid that no longer runs). Rules of a live process, and
ports the test does not own, are never touched. Where iptables is missing or not
permitted (not root, no CAP_NET_ADMIN, no nf_tables), `NetFaults.partition` skips the test
with the reason (`iptables_problem`); latency needs nothing of the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import pytest

from streamwork._redis.server import free_port

TAG: Final = "streamwork-netfault"
IPTABLES_CANDIDATES: Final = ("/usr/sbin/iptables", "/sbin/iptables")
#: seconds a "lost" chunk is held back on top of its latency: Linux's minimum TCP
#: retransmission timeout (200 ms) plus a little, as a resent segment would arrive
RETRANSMIT_DELAY: Final = (0.2, 0.3)
_CHUNK: Final = 65536


def iptables() -> str | None:
    """The iptables binary, or None."""
    for path in IPTABLES_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("iptables")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    binary = iptables()
    assert binary is not None
    # -w: wait for the xtables lock (tests on other xdist workers edit rules too)
    return subprocess.run([binary, "-w", "5", *args], capture_output=True, text=True,
                          timeout=30, check=False)


_problem: list[str | None] = []


def iptables_problem() -> str | None:
    """Why partitions cannot be made here (None: they can). Checked once per process by
    adding a rule for a port nobody uses and removing it again."""
    if _problem:
        return _problem[0]
    reason: str | None = None
    if iptables() is None:
        reason = "iptables is not installed (apt-get install iptables)"
    else:
        probe = free_port()
        spec = _spec("INPUT", "--dport", probe, f"{TAG}:{os.getpid()}:{probe}:probe")
        added = _run("-I", *spec)
        if added.returncode != 0:
            reason = (f"iptables may not add rules here (root with CAP_NET_ADMIN and "
                      f"nf_tables needed): {(added.stderr or added.stdout).strip()}")
        else:
            _run("-D", *spec)
    _problem.append(reason)
    return reason


def _spec(chain: str, match: str, port: int, comment: str) -> list[str]:
    """An iptables rule dropping TCP packets to (``--dport``) or from (``--sport``) ``port``
    on loopback, tagged with ``comment``."""
    return [chain, "-i", "lo", "-p", "tcp", match, str(port), "-m", "comment",
            "--comment", comment, "-j", "DROP"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tagged_rules() -> list[str]:
    """Every rule (``iptables -S`` lines) carrying `TAG`, of any process."""
    listed = _run("-S", "INPUT")
    return [line for line in listed.stdout.splitlines() if TAG in line]


def remove_leftovers() -> int:
    """Remove the tagged rules of processes that no longer run (a test process killed
    before its teardown); how many. Rules of live processes are left alone."""
    removed = 0
    for line in tagged_rules():
        found = re.search(rf"{TAG}:(\d+):", line)
        if found is None or _alive(int(found.group(1))):
            continue
        if _run("-D", *shlex.split(line)[1:]).returncode == 0:
            removed += 1
    return removed


@dataclass
class Impairment:
    """Latency ``mean`` +- ``jitter`` seconds per chunk and direction, and the share of
    chunks ``loss`` held back one retransmission timeout more."""

    mean: float = 0.1
    jitter: float = 0.03
    loss: float = 0.02

    def delay(self, rnd: random.Random) -> float:
        extra = rnd.uniform(*RETRANSMIT_DELAY) if rnd.random() < self.loss else 0.0
        return max(0.0, rnd.uniform(self.mean - self.jitter, self.mean + self.jitter)) + extra


class Forwarder:
    """Relays each connection made to ``127.0.0.1:port`` to ``127.0.0.1:target``, on its
    own asyncio loop thread; `impair` adds latency and loss, `close` ends everything."""

    def __init__(self, target: int, *, seed: int = 0) -> None:
        self.target = target
        self.port = free_port()
        self.impairment: Impairment | None = None
        self.connections = 0  #: connections accepted so far
        self._rnd = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._upstream: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), daemon=True,
                                        name=f"forwarder :{self.port}->:{target}")
        self._thread.start()
        if not started.wait(10) or self._server is None:
            raise RuntimeError(f"forwarder on port {self.port} did not start")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def impair(self, impairment: Impairment | None = None) -> None:
        """Add latency and loss to every chunk from now on (default 100 +- 30 ms, 2 %)."""
        self.impairment = impairment or Impairment()

    def heal(self) -> None:
        """No more latency nor loss (chunks already held back still arrive, in order)."""
        self.impairment = None

    def upstream_ports(self) -> set[int]:
        """The local ports of its open connections to the server (what the server's CLIENT
        LIST shows as their ``addr``): which server clients are this forwarder's."""
        ports = set()
        for up in list(self._upstream):
            name = up.get_extra_info("sockname")
            if name:
                ports.add(int(name[1]))
        return ports

    def _main(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def listen() -> None:
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
            started.set()

        self._loop.run_until_complete(listen())
        try:
            self._loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        self._upstream.add(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy one direction; with an impairment each chunk waits its delay, never
        overtaking the one before it (a TCP stream keeps its order)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(queue, dst))
        last_due = 0.0
        try:
            while chunk := await src.read(_CHUNK):
                imp = self.impairment
                due = time.monotonic() + (imp.delay(self._rnd) if imp else 0.0)
                last_due = max(last_due, due)
                queue.put_nowait((last_due, chunk))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait((0.0, b""))  # end: the sender closes dst once all is sent
            with contextlib.suppress(Exception):
                await sender

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes]],
                    dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(dst)
            self._upstream.discard(dst)
            dst.close()

    def close(self) -> None:
        """Stop listening and end every relayed connection; the loop thread exits."""
        if not self._loop.is_running():
            return

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
            for writer in list(self._writers):
                writer.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class NetFaults:
    """The forwarders and iptables rules of one test; `close` (or leaving the ``with``)
    heals every partition, removes every rule and closes every forwarder."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.forwarders: list[Forwarder] = []
        self._rules: list[list[str]] = []
        self._swept = False
        self._lock = threading.Lock()

    def __enter__(self) -> NetFaults:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def forwarder(self, target: int) -> Forwarder:
        """A new forwarder to the server on port ``target``."""
        fwd = Forwarder(target, seed=self.seed + len(self.forwarders))
        self.forwarders.append(fwd)
        return fwd

    @staticmethod
    def require_iptables() -> None:
        """Skip the test (with the reason) where partitions cannot be made."""
        problem = iptables_problem()
        if problem is not None:
            pytest.skip(f"network partitions need iptables: {problem}")

    def cut(self, fwd: Forwarder, *, replies_only: bool = False) -> None:
        """Start a silent partition of ``fwd``: DROP what goes to its port and what comes
        from it (``replies_only``: only what comes from it, the reply path)."""
        self.require_iptables()
        if fwd not in self.forwarders:
            raise ValueError("only a forwarder of this NetFaults may be cut")
        if not self._swept:
            self._swept = True
            remove_leftovers()
        comment = f"{TAG}:{os.getpid()}:{fwd.port}"
        matches = ("--sport",) if replies_only else ("--sport", "--dport")
        for match in matches:
            spec = _spec("INPUT", match, fwd.port, comment)
            done = _run("-I", *spec)
            if done.returncode != 0:
                raise RuntimeError(f"iptables -I {' '.join(spec)}: {done.stderr.strip()}")
            with self._lock:
                self._rules.append(spec)

    def heal(self, fwd: Forwarder | None = None) -> None:
        """End the partition of ``fwd`` (None: of every forwarder): remove its rules."""
        with self._lock:
            mine = [s for s in self._rules if fwd is None or str(fwd.port) in s]
            self._rules = [s for s in self._rules if s not in mine]
        failed = [s for s in mine if _run("-D", *s).returncode != 0]
        if failed:
            raise RuntimeError(f"iptables rules not removed: {failed}")

    @contextlib.contextmanager
    def partition(self, *forwarders: Forwarder, replies_only: bool = False) -> Iterator[None]:
        """A partition of ``forwarders`` for the block; healed however the block ends."""
        try:
            for fwd in forwarders:
                self.cut(fwd, replies_only=replies_only)
            yield
        finally:
            for fwd in forwarders:
                self.heal(fwd)

    def close(self) -> None:
        try:
            if self._rules:
                self.heal()
        finally:
            for fwd in self.forwarders:
                fwd.close()
            self.forwarders.clear()
