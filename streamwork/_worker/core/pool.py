"""A thread pool for plain ``def`` handlers whose threads never hold the process up, and
how a handler is called (`Calls`).

The standard ThreadPoolExecutor joins its (non-daemon) threads at interpreter exit, so one
stuck handler kept a stopped worker's process alive for as long as it was stuck. Here the
threads are daemons, and a thread whose job was given up on (its time limit passed, or
the worker stopped) is replaced, so the pool keeps ``size`` threads for new jobs.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...]]


class DaemonPool:
    """Runs callables on up to ``size`` daemon threads (plus one per abandoned job).

    Every queued job is matched, under the lock, with exactly one thread: an idle one, a
    new one while fewer than ``size`` exist, or the next one to finish its current job.
    """

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for work that no queued job is matched with
        self._unmatched = 0  # queued jobs that wait for a busy thread to finish
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)``; returns its future."""
        future: Future[T] = Future()
        self._queue.put((future, fn, args))
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < self._size:
                self._spawn()
            else:
                self._unmatched += 1
        return future

    def abandon(self) -> None:
        """A job was given up on while its thread still runs it: allow one more thread."""
        with self._lock:
            self._size += 1
            if self._unmatched:
                self._unmatched -= 1
                self._spawn()

    def shutdown(self) -> None:
        """Stop idle threads; busy ones end with their job (daemons: they never block exit)."""
        with self._lock:
            self._closed = True
            n = self._threads
        for _ in range(n):
            self._queue.put(None)

    def _spawn(self) -> None:
        self._threads += 1
        threading.Thread(target=self._work, name=f"{self._name}-{self._threads}",
                         daemon=True).start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to the awaiting coroutine
                    future.set_exception(exc)
            del item, future, fn, args
            with self._lock:
                if self._unmatched:
                    self._unmatched -= 1
                else:
                    self._idle += 1


class Calls:
    """How a handler is called: an ``async def`` on the loop, a plain ``def`` on a
    `DaemonPool` thread, in a copy of the caller's context (so its span, and the context
    variables a middleware set for the job, are current there too)."""

    def __init__(self, handle: Callable[[Any], Any], size: int, name: str,
                 traced: Callable[[], bool]) -> None:
        self.handle = handle
        self.is_async = inspect.iscoroutinefunction(handle)
        self.pool = None if self.is_async else DaemonPool(size, name)
        self.traced = traced
        #: ``await call(msg)`` runs the handler on ``msg``
        self.call: Callable[[Any], Any] = handle if self.pool is None else self._call_sync

    async def _call_sync(self, msg: Any) -> Any:
        assert self.pool is not None
        # in a copy of the caller's context: its span, and what hooks set for the job
        ctx = contextvars.copy_context()
        return await asyncio.wrap_future(self.pool.submit(ctx.run, self.handle, msg))

    def abandon(self) -> None:
        """A call past its time limit is given up on (a thread cannot be stopped)."""
        if self.pool is not None:
            self.pool.abandon()  # its thread may still run: keep the pool's size for others

    def close(self) -> None:
        """Stop idle pool threads (busy ones end with their job; they never block exit)."""
        if self.pool is not None:
            self.pool.shutdown()
