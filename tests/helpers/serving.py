"""Serving a worker for the length of a block in an async test: the one helper every test
that does so uses, so starting, stopping and error reporting work the same everywhere."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import streamwork as sw
from streamwork.testing import await_for


@contextlib.asynccontextmanager
async def serving(worker: sw.StreamWorker, *, ready: bool = False,
                  release: Callable[[], object] | None = None,
                  exit_timeout: float | None = None) -> AsyncIterator[asyncio.Task[None]]:
    """Serve ``worker`` on this loop for the block and yield its serve() task (with
    ``ready``, once the worker says it is ready). On the way out: ``release()`` (to free
    handlers the test kept blocked), stop the worker and wait for serve() to return,
    re-raising its error. With ``exit_timeout``, a serve() still running that many seconds
    later is cancelled, and its error is left to the test, which has the task."""
    task = asyncio.create_task(worker.serve(), name=f"serving {type(worker).__name__}")
    try:
        if ready:
            await await_for(lambda: task.done() or worker.health().ready,
                            message="the worker to be ready")
            if task.done():
                task.result()
        yield task
    finally:
        if release is not None:
            release()
        worker.stop()
        if exit_timeout is None:
            await task
        else:
            done, _ = await asyncio.wait({task}, timeout=exit_timeout)
            if not done:
                task.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task
            elif not task.cancelled():
                task.exception()  # retrieved: the test body reports what matters
