"""``streamwork run --processes N``: N worker processes under one supervisor process.

Each child is a re-exec of ``python -m streamwork run`` with the same targets and options
(minus ``--processes``): subprocess rather than multiprocessing, so a child is exactly the
process a user would start by hand and shares no state with the supervisor.

* SIGINT or SIGTERM to the supervisor reaches every child as SIGTERM; each drains, and the
  supervisor exits 0 when all exited 0, else 1.
* A child that dies unexpectedly (killed by a signal, crashed, or stopped while nobody
  asked) is restarted after a backoff: `BACKOFF_FIRST` doubling to `BACKOFF_MAX`, back to
  the start once a child ran `BACKOFF_RESET` fine. Each restart is counted and logged.
* A child that exits with status 1 failed for good (``WorkerFailed``: an error no backoff
  cures, the CLI's exit status 1): the supervisor stops the others and exits 1, as a
  single process would, so the orchestrator sees the failure.
* No orphans: on Linux each child asks the kernel for SIGTERM when the supervisor dies
  (``prctl(PR_SET_PDEATHSIG)`` via ctypes, then checks its parent is still the one that
  started it); elsewhere a daemon thread polls ``getppid()``. A SIGKILLed supervisor's
  children therefore drain and exit.
* ``--metrics-port P``: child i serves its metrics on port P + i. ``--health-port``: the
  supervisor serves the probes and asks each child's own probes (on a loopback port it
  picks per start) in parallel: live while every child is live or being restarted, ready
  while every child is up and ready.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

from streamwork._hosting.health import (
    LOOP_TIMEOUT,
    ProbeServer,
    Verdict,
    paused_groups,
    summarise,
)
from streamwork._redis.server import free_port
from streamwork._telemetry.logs import fields

log = logging.getLogger("streamwork.processes")

BACKOFF_FIRST: Final = 0.5  #: s before the first restart of a child that died
BACKOFF_MAX: Final = 30.0  #: s, the cap of the doubling restart delay
BACKOFF_RESET: Final = 60.0  #: s a child must run fine for its next restart to wait BACKOFF_FIRST
TICK: Final = 0.1  #: s between looks at the children (a signal wakes the supervisor at once)
FAILED_STATUS: Final = 1  #: a child's exit status for "failed, restarting won't help"
#: set in a child's environment to the supervisor's pid: the child then watches its parent
SUPERVISOR_ENV: Final = "STREAMWORK_SUPERVISOR_PID"
_PR_SET_PDEATHSIG: Final = 1  #: from <linux/prctl.h>


@dataclass(eq=False)
class Child:
    """One slot of the supervisor: its current process (None between a death and its
    restart), when that started, and how often the slot was restarted."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0  # monotonic
    restarts: int = 0
    delay: float = 0.0  # s waited before the last restart (0: none yet)
    due: float | None = None  # monotonic time of the next restart
    health_port: int | None = None


class ProcessSupervisor:
    """Runs ``argv`` (a ``streamwork run`` command line without ``--processes``) ``n``
    times, forwards stop signals, restarts children that die; ``run()`` returns the exit
    status."""

    def __init__(self, argv: list[str], n: int, *, metrics_port: int | None = None,
                 health: tuple[str, int] | None = None) -> None:
        self.argv = argv
        self.children = [Child(i) for i in range(n)]
        self.metrics_port = metrics_port
        self.health = health
        self.stopping = False
        self.failed = False
        self.restarts = 0
        self._signals: list[int] = []
        self._wake = threading.Event()

    # ---- running -----------------------------------------------------------------------

    def run(self) -> int:
        """Start the children, supervise them until stopped; 0 if every child exited 0."""
        probes = ProbeServer(*self.health, self.probe).start() if self.health else None
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for child in self.children:
                self._start(child)
            while not (self.stopping and all(c.proc is None for c in self.children)):
                self._wake.wait(TICK)
                self._wake.clear()
                self._step()
        except BaseException:
            self._stop_all(signal.SIGKILL)  # the supervisor itself broke: leave nothing behind
            for child in self.children:
                if child.proc is not None:
                    child.proc.wait()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if probes is not None:
                probes.close()
        log.info("all worker processes stopped", extra=fields(
            count=len(self.children), restarts=self.restarts,
            outcome="failed" if self.failed else "ok"))
        return FAILED_STATUS if self.failed else 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        # only note it: the main loop forwards it, never in the middle of starting a child
        self._signals.append(signum)
        self._wake.set()

    def _step(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if not self.stopping:
                log.info("%s received: stopping %d worker processes",
                         signal.Signals(sig).name, len(self.children))
            self.stopping = True
            self._stop_all(signal.SIGTERM)
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None:
                status = child.proc.poll()
                if status is not None:
                    self._ended(child, status, now)
            elif child.due is not None and now >= child.due and not self.stopping:
                self._start(child)

    def _start(self, child: Child) -> None:
        extra: list[str] = []
        if self.metrics_port is not None:
            extra += ["--metrics-port", str(self.metrics_port + child.index)]
        if self.health is not None:
            child.health_port = free_port()
            extra += ["--health-port", str(child.health_port), "--health-host", "127.0.0.1"]
        env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
        # its own session: a Ctrl-C at the terminal reaches the supervisor alone, which
        # forwards one SIGTERM (a child still importing is not hit by a KeyboardInterrupt)
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "streamwork", "run", *self.argv, *extra],
            env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        child.started = time.monotonic()
        child.due = None
        log.info("worker process started", extra=fields(
            child=child.index, pid=child.proc.pid, restarts=child.restarts))

    def _ended(self, child: Child, status: int, now: float) -> None:
        assert child.proc is not None
        pid, child.proc = child.proc.pid, None
        how = _how(status)
        if self.stopping:
            # killed by the SIGTERM we sent before it could install its handlers: it had
            # not started serving, so nothing was in flight
            clean = status in (0, -signal.SIGTERM)
            if not clean:
                self.failed = True
            (log.info if clean else log.error)("worker process exited", extra=fields(
                child=child.index, pid=pid, restarts=child.restarts, **how))
            return
        if status == FAILED_STATUS:
            log.error("worker process failed; stopping the others", extra=fields(
                child=child.index, pid=pid, restarts=child.restarts, **how))
            self.failed = self.stopping = True
            self._stop_all(signal.SIGTERM)
            return
        ran = now - child.started
        child.delay = restart_delay(child.delay, ran)
        child.restarts += 1
        self.restarts += 1
        child.due = now + child.delay
        log.warning("worker process died; restarting it", extra=fields(
            child=child.index, pid=pid, restarts=child.restarts, ran_s=round(ran, 1),
            delay_s=child.delay, **how))

    def _stop_all(self, sig: int) -> None:
        for child in self.children:
            proc = child.proc
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # it ended just now
                    os.kill(proc.pid, sig)

    # ---- health ------------------------------------------------------------------------

    def probe(self, kind: str) -> Verdict:
        """``/livez`` or ``/readyz`` over the children, each asked on its own port."""
        with concurrent.futures.ThreadPoolExecutor(len(self.children)) as pool:
            entries = list(pool.map(lambda c: self._probe_child(c, kind), self.children))
        workers = [w for e in entries for w in e.get("workers", ())]
        return summarise(kind, entries, "processes", restarts=self.restarts,
                         **paused_groups(workers))

    def _probe_child(self, child: Child, kind: str) -> dict[str, Any]:
        proc, port = child.proc, child.health_port
        entry: dict[str, Any] = {"child": child.index, "pid": proc.pid if proc else None,
                                 "restarts": child.restarts}
        if proc is None or port is None:
            return {**entry, "live": True, "ready": False, "reason": (
                "stopped" if self.stopping else "died; restarting it")}
        path = "/livez" if kind == "live" else "/readyz"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=LOOP_TIMEOUT + 1.0)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = json.loads(resp.read() or b"{}")
        except ConnectionRefusedError:  # its probes are not up yet: it is starting
            return {**entry, "live": True, "ready": False,
                    "reason": "starting: its probes do not answer yet"}
        except (OSError, ValueError, http.client.HTTPException) as exc:
            return {**entry, "live": False, "ready": False,
                    "reason": f"its {path} did not answer: {exc!r}"}
        finally:
            conn.close()
        ok = resp.status == 200
        entry.update(live=ok if kind == "live" else True, ready=ok if kind == "ready" else True,
                     workers=body.get("workers", []))
        if not ok:
            entry["reason"] = body.get("reason", f"{path} answered {resp.status}")
        return entry


def restart_delay(previous: float, ran: float) -> float:
    """s to wait before restarting a child that died after running ``ran`` s, when the
    slot's previous restart waited ``previous`` s (0: none yet): `BACKOFF_FIRST`, doubled
    per quick death up to `BACKOFF_MAX`, back to the first after `BACKOFF_RESET` s fine."""
    if previous == 0 or ran >= BACKOFF_RESET:
        return BACKOFF_FIRST
    return min(previous * 2, BACKOFF_MAX)


def _how(status: int) -> dict[str, Any]:
    """Log fields of an exit status: ``exit_code``, or ``signal`` for a negative one."""
    if status < 0:
        try:
            return {"signal": signal.Signals(-status).name}
        except ValueError:
            return {"signal": -status}
    return {"exit_code": status}


# ---- in the child ----------------------------------------------------------------------

def watch_parent() -> None:
    """In a child of ``--processes``: get SIGTERM (a graceful drain) when the supervisor
    dies, so no child is left orphaned. Does nothing in a process started otherwise."""
    raw = os.environ.pop(SUPERVISOR_ENV, None)  # not inherited by processes a handler starts
    if not raw:
        return
    parent = int(raw)
    if not _death_signal(signal.SIGTERM):
        threading.Thread(target=_poll_parent, args=(parent,), name="streamwork-parent",
                         daemon=True).start()
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _death_signal(sig: int) -> bool:
    """Linux: have the kernel send ``sig`` when the parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _poll_parent(parent: int) -> None:
    """Where prctl is missing: SIGTERM this process once its parent is gone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
