"""Health probes for ``streamwork run --health-port``: ``GET /livez`` and ``GET /readyz``.

Served by the standard library's ``ThreadingHTTPServer`` on a daemon thread: the worker
core gains no web framework, and a probe is answered even when the event loop is stuck,
which is exactly what ``/livez`` has to notice. Each probe schedules one call on the loop
(``call_soon_threadsafe``) and waits at most `LOOP_TIMEOUT` for it; that call reads every
worker's `Health` on the loop itself, so the answer is one consistent snapshot.

``/livez`` is 200 while the loop answers and no worker has failed (an internal task died,
or ``serve()`` ended on an error): starting (joining the group, Redis not reachable yet),
serving and draining are all live, because restarting the process would not help any of
them. ``/readyz`` is 200 while every worker is ready: group joined, Redis answering, its
lock quorum answering (``lock_urls``), not draining. So during a drain ``/livez`` stays
200 and ``/readyz`` is 503. Both bodies are JSON: ``status`` (``ok``/``fail``), ``reason``
when failing, and one entry per worker with the fields of `Health`. A worker whose group
is paused stays ready (a pause is deliberate): its entry says ``"paused": true`` with
``pause_reason`` and ``paused_since``, and the body lists the paused workers' groups under
``paused``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

from streamwork._worker.worker import StreamWorker
from streamwork.errors import StreamworkError

log = logging.getLogger("streamwork.health")

#: where the probes listen unless --health-host says otherwise: loopback, so nothing is
#: exposed beyond the machine by default (a Kubernetes probe needs 0.0.0.0 or the pod IP)
DEFAULT_HEALTH_HOST: Final = "127.0.0.1"

#: s a probe waits for the event loop to run one call before it calls the loop stuck;
#: give the orchestrator's probe a timeout above it (Kubernetes: timeoutSeconds >= 2)
LOOP_TIMEOUT: Final = 1.0

#: the probes, by path: what each one asks of a worker
PROBES: Final = {"/livez": "live", "/readyz": "ready"}

#: (healthy, JSON body) of one probe; ``"live"`` or ``"ready"`` in, so a probe source can be
#: in-process workers (`LoopProbe`) or the children of a supervisor
Verdict = tuple[bool, dict[str, Any]]
Probe = Callable[[str], Verdict]


@dataclass(eq=False)
class Watched:
    """A hosted worker as the probes see it: its ``serve()`` task once started, and whether
    it has been alive yet (not yet: it is starting, which is live but not ready)."""

    worker: StreamWorker
    task: asyncio.Task[None] | None = None
    was_alive: bool = False


def judge(w: Watched) -> dict[str, Any]:
    """The probe entry of one worker: its `Health` fields, a ``state`` (starting, serving,
    draining, stopped, failed), ``live``, ``ready`` and a ``reason`` when not ready. Runs
    on the worker's event loop."""
    h = w.worker.health()
    w.was_alive = w.was_alive or h.alive
    task = w.task
    ended = task is not None and task.done()
    error = task.exception() if ended and task is not None and not task.cancelled() else None
    reason = ""
    if error is not None:
        state, reason = "failed", f"stopped on an error: {type(error).__name__}: {error}"
    elif h.dead_tasks:
        state, reason = "failed", f"internal tasks ended: {', '.join(h.dead_tasks)}"
    elif ended:
        state, reason = "stopped", "stopped: the process is about to exit"
    elif h.draining:
        state, reason = "draining", "draining: finishing the jobs in flight, reading no more"
    elif h.alive:
        state = "serving"
        if not h.ready:
            reason = ("redis unreachable: retrying with backoff" if not h.redis_ok
                      else "lock quorum unreachable (lock_urls): starting no job, handing "
                      "back those it cannot lock" if not h.locks_ok else "not ready")
    elif not w.was_alive:
        state, reason = "starting", "starting: joining the group (is Redis reachable?)"
    else:
        state, reason = "failed", "no longer serving: an internal loop met an error"
    worker = w.worker
    entry: dict[str, Any] = {
        "worker": worker.worker_name, "stream": worker.config.stream,
        "group": worker.config.group, "consumer": worker.consumer_name, "state": state,
        "live": state != "failed", "ready": h.ready and state == "serving",
        "alive": h.alive, "draining": h.draining, "redis_ok": h.redis_ok,
        "locks_ok": h.locks_ok,
        "dead_tasks": list(h.dead_tasks), "paused": h.paused is not None}
    if h.paused is not None:  # deliberate: still ready, but say so
        entry["pause_reason"] = h.paused.reason
        entry["paused_since"] = h.paused.since
    if reason and not entry["ready"]:
        entry["reason"] = reason
    return entry


def summarise(kind: str, entries: Sequence[dict[str, Any]], label: str,
              **extra: Any) -> Verdict:
    """The verdict over several entries (workers, or child processes): healthy when each is,
    with the reasons of those that are not."""
    bad = [e for e in entries if not e[kind]]
    body: dict[str, Any] = {"status": "fail" if bad else "ok", **extra, label: list(entries)}
    if bad:
        body["reason"] = "; ".join(
            f"{e.get('worker', e.get('child'))}: {e.get('reason', 'not ' + kind)}" for e in bad)
    return not bad, body


def paused_groups(workers: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """``{"paused": ["stream/group", ...]}`` for the workers' entries whose group is
    paused, for a probe's body; empty when none is."""
    paused = sorted({f"{w['stream']}/{w['group']}" for w in workers if w.get("paused")})
    return {"paused": paused} if paused else {}


class LoopProbe:
    """The probes of the workers one event loop serves; called from the HTTP threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop, watched: Sequence[Watched]) -> None:
        self.loop = loop
        self.watched = watched

    def look(self) -> list[dict[str, Any]] | None:
        """Every worker's entry, read on the loop; None if the loop did not run the call
        within `LOOP_TIMEOUT` (or is closed)."""
        answer: concurrent.futures.Future[list[dict[str, Any]]] = concurrent.futures.Future()

        def on_loop() -> None:
            if not answer.set_running_or_notify_cancel():
                return  # the probe gave up waiting
            try:
                answer.set_result([judge(w) for w in self.watched])
            except BaseException as exc:
                answer.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(on_loop)
        except RuntimeError:  # the loop is closed
            return None
        try:
            return answer.result(timeout=LOOP_TIMEOUT)
        except TimeoutError:
            answer.cancel()
            return None

    def __call__(self, kind: str) -> Verdict:
        entries = self.look()
        if entries is None:
            return False, {"status": "fail", "reason": (
                f"the event loop did not run a call within {LOOP_TIMEOUT:g} s: a handler "
                "blocks it (make it async, or a plain def so it runs in the thread pool)")}
        return summarise(kind, entries, "workers", loop="responsive", **paused_groups(entries))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, port: int, probe: Probe) -> None:
        if ":" in host:  # an IPv6 address such as "::"
            self.address_family = socket.AF_INET6
        self.probe = probe
        super().__init__((host, port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        kind = PROBES.get(path)
        if kind is None:
            self._send(404, {"status": "fail", "reason": (
                f"no probe at {path!r}: GET /livez (liveness) or /readyz (readiness)")})
            return
        try:
            ok, body = self.server.probe(kind)
        except Exception as exc:  # a probe that breaks is unhealthy, not a dead server
            log.exception("health probe %s failed", path)
            ok, body = False, {"status": "fail", "reason": f"probe error: {exc!r}"}
        self._send(200 if ok else 503, {"probe": path[1:], **body})

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=str).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health probe: " + format, *args)


class ProbeServer:
    """``/livez`` and ``/readyz`` on ``host:port``, answered by ``probe`` on a daemon
    thread; ``start()`` binds (a clear error if it cannot), ``close()`` stops it."""

    def __init__(self, host: str, port: int, probe: Probe) -> None:
        self.host = host
        self.port = port
        self.probe = probe
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ProbeServer:
        try:
            self._server = _Server(self.host, self.port, self.probe)
        except OSError as exc:  # in use, or not an address of this machine
            raise StreamworkError(
                f"cannot serve health probes on {self.host}:{self.port} ({exc}): give a free "
                "--health-port and a --health-host this machine has (127.0.0.1, 0.0.0.0 "
                "for every interface)") from exc
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="streamwork-health", daemon=True)
        self._thread.start()
        log.info("health probes on http://%s:%d/livez and /readyz", self.host, self.port)
        return self

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
