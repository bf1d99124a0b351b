"""Middleware: the application's own hooks around every job of a worker (a log context, an
error reporter, a database session per job, a metric), on the same seam as the worker's
features.

Each job runs in a context of its own (`contextvars`): the ``before`` hooks run in it, in
order, then the handler (a plain ``def`` handler in its thread, in a copy of it), then
``on_failure`` (when it failed) and ``after`` in reverse order. A value a ``before`` hook
sets in a context variable is seen by the handler and the later hooks, and by nothing
else. The hooks run inside the job's time limit. A ``before`` hook that raises fails the
job as a handler error would (the handler is not called; ``on_failure`` and ``after`` are,
so what ``before`` opened can be closed); an ``after`` or ``on_failure`` hook that raises
is logged with its error, and the job's outcome stands.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from streamwork._telemetry.logs import WORKER_LOGGER, describe, error_message
from streamwork._wire.message import Message
from streamwork._worker.core.batch_runner import per_message
from streamwork._worker.core.seam import Call, Feature, Parts
from streamwork.errors import ConfigError

__all__ = ["Middleware", "Outcome", "check_middleware"]

log = logging.getLogger(WORKER_LOGGER)

#: the per-job hooks a middleware may define
JOB_HOOKS: Final = ("before", "after", "on_failure")
#: the hooks run once per worker, as it starts serving and after it stopped
WORKER_HOOKS: Final = ("on_worker_start", "on_worker_stop")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of a job's handler call, as an ``after`` hook sees it.

    ``state``: "done" (it returned ``result``), "failed" (it raised ``error``), "timeout"
    (it ran past the job's time limit), "cancelled" (its job was cancelled while it ran)
    or "interrupted" (the worker stopped while it ran). ``duration`` is in seconds, hooks
    included. Whether a failed job is retried follows from the worker's options
    (``msg.attempt`` against ``max_deliveries``) and the exception (`Retry`,
    `DeadLetter`)."""

    state: str
    result: Any = None
    error: BaseException | None = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.state == "done"


class Middleware:
    """Hooks around every job of a worker; subclass it and define those you need, as
    ``def`` or ``async def``. Give a worker a list of them: ``middleware = [...]``.

    * ``before(msg)``: before the handler, in the job's own context;
    * ``after(msg, outcome)``: after the handler, whatever it did (an `Outcome`), also when
  a ``before`` hook raised (the handler was not called then);
    * ``on_failure(msg, error)``: after a handler that raised, timed out or was cancelled,
      before ``after``;
    * ``on_worker_start(worker)`` / ``on_worker_stop(worker)``: once, as the worker starts
      serving (an error stops it from starting) and after it stopped.

    A plain ``def`` hook runs on the worker's event loop: keep it quick, or make it
    ``async def``. A batch handler's jobs each get their hooks, around the one call."""

    def before(self, msg: Message[Any]) -> Awaitable[None] | None:
        """Called before the handler (an error fails the job as the handler's would)."""
        return None

    def after(self, msg: Message[Any], outcome: Outcome) -> Awaitable[None] | None:
        """Called after the handler, with its outcome (an error is logged)."""
        return None

    def on_failure(self, msg: Message[Any], error: BaseException) -> Awaitable[None] | None:
        """Called when the handler raised, timed out or was cancelled (an error is logged)."""
        return None

    def on_worker_start(self, worker: Any) -> Awaitable[None] | None:
        """Called once as the worker starts serving (an error: it does not start)."""
        return None

    def on_worker_stop(self, worker: Any) -> Awaitable[None] | None:
        """Called once after the worker stopped (an error is logged)."""
        return None


def _defines(mw: object, hook: str) -> bool:
    """Whether ``mw`` has hook ``hook`` of its own (not `Middleware`'s no-op)."""
    found = getattr(type(mw), hook, None)
    return callable(found) and found is not getattr(Middleware, hook, None)


def check_middleware(given: object) -> tuple[Any, ...]:
    """The worker's ``middleware`` option as a tuple, each item checked to define at least
    one hook; ConfigError otherwise, saying what to give."""
    if given is None:
        return ()
    if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
        raise ConfigError("middleware", f"must be a list of middleware objects "
                                        f"(streamwork.Middleware subclasses), got {given!r}")
    for mw in given:
        if isinstance(mw, type):
            raise ConfigError("middleware", f"{mw.__qualname__} is a class: give an "
                                            f"instance, {mw.__qualname__}()")
        if not any(_defines(mw, hook) for hook in (*JOB_HOOKS, *WORKER_HOOKS)):
            raise ConfigError("middleware", (
                f"{mw!r} defines none of the hooks {', '.join((*JOB_HOOKS, *WORKER_HOOKS))}: "
                "subclass streamwork.Middleware and define the ones you need"))
    return tuple(given)


async def _call(hook: Any, *args: Any) -> None:
    result = hook(*args)
    if inspect.isawaitable(result):
        await result


class Middlewares(Feature):
    """The user's middleware of one consumer: it wraps the handler call."""

    @classmethod
    def build(cls, parts: Parts) -> Middlewares | None:
        given = check_middleware(parts.extras.get("middleware"))
        if not any(_defines(mw, hook) for mw in given for hook in JOB_HOOKS):
            return None
        return cls(given, parts.ctx.fields)

    def __init__(self, middleware: Sequence[Any], fields: Any) -> None:
        self._before = [(f"{type(m).__qualname__}.before", m.before)
                        for m in middleware if _defines(m, "before")]
        self._after = [(f"{type(m).__qualname__}.after", m.after)
                       for m in reversed(middleware) if _defines(m, "after")]
        self._failure = [(f"{type(m).__qualname__}.on_failure", m.on_failure)
                         for m in reversed(middleware) if _defines(m, "on_failure")]
        self._fields = fields

    def wrap_call(self, call: Call) -> Call:
        """The handler call, each job in a context of its own with the hooks around it."""

        async def wrapped(arg: Any) -> Any:
            # a task of its own runs in a copy of the current context: what the job's
            # hooks set stays the job's
            return await asyncio.get_running_loop().create_task(self._job(call, arg))

        return wrapped

    async def _job(self, call: Call, arg: Any) -> Any:
        msgs: list[Message[Any]] = arg if isinstance(arg, list) else [arg]
        began = time.monotonic()
        try:
            for name, before in self._before:
                for msg in msgs:
                    try:
                        await _call(before, msg)
                    except Exception as exc:
                        log.warning("middleware %s raised %s; the job fails as if its "
                                    "handler had raised it", name, describe(exc),
                                    extra=self._fields(
                                        key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                                        error_type=type(exc).__name__,
                                        error=error_message(exc)))
                        raise
            answer = await call(arg)
        except BaseException as exc:
            state = _failed_state(exc, msgs[0])
            took = time.monotonic() - began
            for msg in msgs:
                await self._ended(msg, Outcome(state, None, exc, took))
            raise
        took = time.monotonic() - began
        if isinstance(arg, list):  # a batch: each job's own outcome from the answer
            for msg, one in zip(msgs, per_message(answer, len(msgs)), strict=True):
                failed = isinstance(one, Exception)
                await self._ended(msg, Outcome("failed" if failed else "done",
                                               None if failed else one,
                                               one if failed else None, took))
        else:
            await self._ended(msgs[0], Outcome("done", answer, None, took))
        return answer

    async def _ended(self, msg: Message[Any], outcome: Outcome) -> None:
        """The ``on_failure`` and ``after`` hooks of one job, each error contained."""
        hooks: list[tuple[str, Any, tuple[Any, ...]]] = []
        if outcome.error is not None:
            hooks += [(name, hook, (msg, outcome.error)) for name, hook in self._failure]
        hooks += [(name, hook, (msg, outcome)) for name, hook in self._after]
        for name, hook, args in hooks:
            try:
                await _call(hook, *args)
            except Exception as exc:  # the user's hook: logged, the outcome stands
                log.error("middleware %s raised %s; the job's outcome stands", name,
                          describe(exc), exc_info=exc, extra=self._fields(
                              key=msg.key, entry_id=msg.id, attempt=msg.attempt,
                              error_type=type(exc).__name__, error=error_message(exc)))


def _failed_state(exc: BaseException, msg: Message[Any]) -> str:
    """How a handler call that raised ``exc`` ended, as `Outcome.state` says it."""
    if not isinstance(exc, asyncio.CancelledError):
        return "failed"
    if msg.cancelled:
        return "cancelled"
    if msg.lock_lost:  # its time limit passed (the delivery was given up)
        return "timeout"
    return "interrupted"


async def worker_started(middleware: Sequence[Any], worker: Any) -> None:
    """Every middleware's ``on_worker_start``, in order (an error propagates: the worker
    does not start)."""
    for mw in middleware:
        if _defines(mw, "on_worker_start"):
            await _call(mw.on_worker_start, worker)


async def worker_stopped(middleware: Sequence[Any], worker: Any, fields: Any) -> None:
    """Every middleware's ``on_worker_stop``, in reverse order, each error logged."""
    for mw in reversed(middleware):
        if _defines(mw, "on_worker_stop"):
            try:
                await _call(mw.on_worker_stop, worker)
            except Exception as exc:
                log.error("middleware %s.on_worker_stop raised %s", type(mw).__qualname__,
                          describe(exc), exc_info=exc, extra=fields)
