"""Running a worker in a test until its stream is drained, and what that run did: the
``streamwork_run`` fixture of the pytest plugin, usable without pytest too."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from streamwork._producer.shells import Producer
from streamwork._wire.records import JobStatus
from streamwork._worker.worker import StreamWorker
from streamwork.errors import ConfigError
from streamwork.testing.kit import run_until_idle

__all__ = ["WorkerRun", "WorkerRunner"]

T = TypeVar("T")


@dataclass(frozen=True)
class WorkerRun:
    """What one run of a worker until idle did."""

    worker: StreamWorker[Any]  #: the worker, stopped
    #: its counters when it stopped: ``acked``, ``retried``, ``dead_lettered``,
    #: ``deduplicated``, ``cancelled``, ``produced`` (jobs its handlers sent), ...; 0 for
    #: what did not happen
    counts: Counter[str]
    seconds: float  #: how long it served
    url: str  #: the server it ran against

    def status(self, key: str) -> JobStatus:
        """What the worker's group knows of job ``key`` (`Producer.status`): ``.state``
        ("done", "dead", "cancelled", ...), ``.result``, ``.error``, ``.attempts``."""
        cfg = self.worker.config
        with Producer.from_url(self.url) as producer:
            return producer.status(cfg.stream, key, group=cfg.group)


class WorkerRunner:
    """Serves a worker against ``url`` until its group has read and acknowledged everything
    and nothing is delayed or waiting for a retry (`run_until_idle`), then stops it and
    says what it did. Call it (``runner(Emails)``) from a plain test, or ``await
    runner.run_async(Emails)`` from an async one; ``client`` is a sync client on ``url``
    to look with (one is made, and closed, when it is not given)."""

    def __init__(self, url: str, client: Any = None) -> None:
        self.url = url
        self.client = client

    def __call__(self, worker: type[StreamWorker[Any]] | StreamWorker[Any], *,
                 timeout: float = 30.0, **options: Any) -> WorkerRun:
        """Run ``worker`` (a StreamWorker class, made with ``options`` for this server, or
        a worker made already) until idle; AssertionError when it is not idle within
        ``timeout`` seconds, the worker's own error when it stops on one. Inside a running
        event loop it serves on a loop of its own, in a thread."""
        return _run_sync(lambda: self.run_async(worker, timeout=timeout, **options))

    async def run_async(self, worker: type[StreamWorker[Any]] | StreamWorker[Any], *,
                        timeout: float = 30.0, **options: Any) -> WorkerRun:
        """`__call__`, awaited on the running loop."""
        made = _made(worker, self.url, options)
        client = self.client if self.client is not None else redis.Redis.from_url(self.url)
        started = time.monotonic()
        try:
            await run_until_idle(made, client, timeout=timeout)
        finally:
            if client is not self.client:
                client.close()
        return WorkerRun(made, Counter(made.counts), time.monotonic() - started, self.url)


def _made(worker: type[StreamWorker[Any]] | StreamWorker[Any], url: str,
          options: dict[str, Any]) -> StreamWorker[Any]:
    if isinstance(worker, StreamWorker):
        if options:
            raise ConfigError("options", f"{', '.join(options)} given with a worker made "
                              "already: pass its class to have it made with them")
        return worker
    if isinstance(worker, type) and issubclass(worker, StreamWorker):
        return worker.from_url(url, **options)
    raise ConfigError("worker", f"must be a StreamWorker subclass (or one made), got "
                                f"{worker!r}")


def _run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run(make())``, in a thread when this one already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1, "streamwork-test-run") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
