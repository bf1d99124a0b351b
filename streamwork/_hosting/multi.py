"""Several workers in one process (``streamwork run A:Worker B:Worker``), and the health
probes of ``--health-port``.

The workers share one event loop and nothing else: each keeps its own options, Redis
client and ``concurrency`` budget. They stop together: SIGINT/SIGTERM drains every one,
and when one ends on its own (an error it cannot ride out, or a ``stop()`` from its own
code) the others are stopped too, so a process is never half-serving; the first error is
then raised (the CLI exits 1).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence

from streamwork._hosting.health import LoopProbe, ProbeServer, Watched
from streamwork._telemetry.logs import WORKER_LOGGER, fields
from streamwork._worker.worker import StreamWorker

log = logging.getLogger(WORKER_LOGGER)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def serve_all(workers: Sequence[StreamWorker],
                    health: tuple[str, int] | None = None) -> None:
    """Serve ``workers`` on the running loop until SIGINT/SIGTERM or until one of them
    ends; then stop the rest, wait for every drain, and raise the first error, if any.

    ``health`` = ``(host, port)``: serve ``/livez`` and ``/readyz`` there meanwhile (bound
    before any worker starts, so a port in use fails at once)."""
    loop = asyncio.get_running_loop()
    watched = [Watched(w) for w in workers]

    def stop_all() -> None:
        for w in workers:
            w.stop()

    probes = ProbeServer(*health, LoopProbe(loop, watched)).start() if health else None
    for sig in _SIGNALS:
        loop.add_signal_handler(sig, stop_all)
    try:
        for item in watched:
            item.task = loop.create_task(item.worker.serve(),
                                         name=f"streamwork-serve-{item.worker.worker_name}")
        tasks = {item.task: item.worker for item in watched if item.task is not None}
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                _ended(tasks[task], task, bool(pending))
            stop_all()  # one ended: the others stop too (a no-op for those stopping)
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)
        if probes is not None:
            probes.close()
    errors = [e for e in map(_error, tasks) if e is not None]
    if errors:
        raise errors[0]


def _error(task: asyncio.Task[None]) -> BaseException | None:
    """What a finished ``serve()`` task raised (None: it returned)."""
    return None if task.cancelled() else task.exception()


def _ended(worker: StreamWorker, task: asyncio.Task[None], others: bool) -> None:
    """Log how one hosted worker ended when the others still run."""
    if not others:
        return
    error = _error(task)
    cfg = worker.config
    if error is not None:
        log.error("worker %s failed (%s: %s); stopping the other workers", worker.worker_name,
                  type(error).__name__, error, extra=fields(stream=cfg.stream, group=cfg.group,
                                                            consumer=worker.consumer_name))
    else:
        log.info("worker %s stopped; stopping the other workers", worker.worker_name,
                 extra=fields(stream=cfg.stream, group=cfg.group,
                              consumer=worker.consumer_name))
