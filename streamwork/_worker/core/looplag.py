"""Event-loop stalls, named: an ``async def`` handler that blocks (``time.sleep``, a sync
client, heavy CPU) holds up every worker of its process - no reads, no heartbeats, no
other job - and its Redis calls time out for no fault of Redis.

A monitor task wakes every `TICK` and measures how late it woke (expected against actual
wake-up). A watchdog thread looks while the loop is stuck: which task holds it
(``asyncio.current_task(loop)``), the job a runner task is running then, and where the
code is. Once the loop runs again, one WARNING names the handler, the job(s) and how long
it blocked. A Redis timeout seen across such a stall is the stall's doing (`excuses`):
the `Link` does not call it an outage.

One watch per event loop, shared by the workers it serves (`watching`); the runners say
which job each runs (`Watch.running`). Nothing here knows a feature.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import sysconfig
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from types import FrameType
from typing import Any, Final

import redis.exceptions

from streamwork._telemetry.logs import WORKER_LOGGER, fields, seconds

log = logging.getLogger(WORKER_LOGGER)

TICK: Final = 0.1  #: s between the monitor's wake-ups
STALL: Final = 1.0  #: s late: a stall worth naming
#: s between two WARNINGs about one handler (or task) blocking the loop; the stalls
#: in between are logged at DEBUG and counted in the next WARNING
QUIET: Final = 60.0
_SKIP: Final = (os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep,
                os.path.dirname(asyncio.__file__) + os.sep,
                sysconfig.get_paths()["stdlib"] + os.sep)
#: the errors a stall causes (a reply read late past its deadline)
_TIMEOUTS: Final = (redis.exceptions.TimeoutError, TimeoutError)


class Watch:
    """The stalls of one event loop: when, how long, and who held it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        self.beat = time.monotonic()  # when the monitor last woke
        self.stalls: deque[tuple[float, float]] = deque(maxlen=8)  # (began, ended)
        #: what each runner task runs now (set around each handler call): a delivery-like
        #: object with ``msg``, and the runner's handler name and stream
        self.running: dict[asyncio.Task[Any], Any] = {}
        self.names: dict[asyncio.Task[Any], tuple[str, str]] = {}
        #: beat -> what the watchdog saw holding the loop since then: (when, who, fields)
        self._seen: dict[float, list[tuple[float, str, dict[str, Any]]]] = {}
        self._warned: dict[str, tuple[float, int]] = {}  # culprit -> (last WARNING, since)
        self._thread_id = threading.get_ident()
        self._done = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._task = self.loop.create_task(self._monitor(), name="streamwork-looplag")
        self._thread = threading.Thread(target=self._watchdog, name="streamwork-looplag",
                                        daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._done.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def excuses(self, exc: BaseException, since: float) -> float | None:
        """How long the loop stalled (s) since ``since`` (monotonic), when a call made
        then met ``exc``, a timeout, that the stalls explain: they took at least `STALL`
        s and at least half the time since the call began (its reply sat unread while the
        loop was held; a real outage with a short stall at its end is still one). None
        otherwise (no timeout, or no such stall)."""
        if not isinstance(exc, _TIMEOUTS):
            return None
        now = time.monotonic()
        spans = list(self.stalls)
        if now - self.beat >= STALL:  # stuck until just now (the monitor has not run yet)
            spans.append((self.beat + TICK, now))
        stalled = sum(max(0.0, min(ended, now) - max(began, since)) for began, ended in spans)
        if stalled >= STALL and stalled >= (now - since) / 2:
            return stalled
        return None

    async def _monitor(self) -> None:
        while True:
            before = self.beat = time.monotonic()
            await asyncio.sleep(TICK)
            now = time.monotonic()
            late = now - before - TICK
            if late >= STALL:
                self.stalls.append((before + TICK, now))
                self._report(late, self._seen.pop(before, []))
            self._seen.clear()

    def _watchdog(self) -> None:
        """While the loop is stuck, note twice a `TICK` who holds it (the thread only
        reads; the loop thread is the one blocked)."""
        while not self._done.wait(TICK / 2):
            beat = self.beat
            if time.monotonic() - beat < STALL / 2:
                continue
            try:
                sample = self._sample()
            except Exception:  # the loop moved on meanwhile: nothing to note
                continue
            if sample is not None:
                self._seen.setdefault(beat, []).append(sample)

    def _sample(self) -> tuple[float, str, dict[str, Any]] | None:
        """Who holds the loop now: a handler and its job, or another task; where."""
        task = asyncio.current_task(self.loop)
        if task is None:
            return None
        now = time.monotonic()
        where = _where(sys._current_frames().get(self._thread_id))
        at = f", at {where}" if where else ""
        name = self.names.get(task)
        job = self.running.get(task)
        if name is not None and job is not None:
            msg = job.msg
            return (now, f"handler {name[0]} (job key={msg.key} entry_id={msg.id}{at})",
                    {"stream": name[1], "key": msg.key, "entry_id": msg.id})
        return now, f"task {task.get_name()}{at}", {}

    def _report(self, late: float, samples: list[tuple[float, str, dict[str, Any]]]) -> None:
        """One line for a stall of ``late`` s: a WARNING naming who blocked the loop when
        the watchdog saw the same handler (or task of the application) hold it, in the
        same place, for at least half a `STALL` (a loop stuck there, not one that moved on
        in a process starved of CPU); else DEBUG (streamwork's own tasks too)."""
        took = round(late * 1000)
        spans: dict[str, tuple[float, float]] = {}
        for when, what, _ in samples:
            first, _last = spans.get(what, (when, when))
            spans[what] = (first, when)
        held = [what for what, (first, last) in spans.items() if last - first >= STALL / 2]
        if not held or all(what.startswith("task streamwork-") for what in held):
            log.debug("the event loop ran %s s late (%s)", seconds(late),
                      f"held by {' and '.join(held)}" if held else "nothing seen holding "
                      "it: the process was paused or starved of CPU",
                      extra=fields(duration_ms=took))
            return
        held = [what for what in held if not what.startswith("task streamwork-")]
        extra = next(x for _, what, x in samples if what == held[0])
        handler = held[0].startswith("handler ")
        who = held[0].partition(" (")[0]  # the handler or task, not its job
        now = time.monotonic()
        last, quiet = self._warned.get(who, (-QUIET, 0))
        if now - last < QUIET:
            self._warned[who] = (last, quiet + 1)
            log.debug("the event loop was blocked for %s s by %s", seconds(late),
                      " and ".join(held), extra=fields(**extra, duration_ms=took))
            return
        self._warned[who] = (now, 0)
        more = (f" ({quiet} more stall{'s' if quiet != 1 else ''} by it in the last "
                f"{seconds(now - last)} s, logged at DEBUG)" if quiet else "")
        advice = ("an async def handler must not block: await instead (asyncio.sleep, an "
                  "async client), move blocking calls to asyncio.to_thread, or make handle "
                  "a plain def, which runs in a thread" if handler else
                  "code on the event loop must not block: await instead, or move blocking "
                  "calls to asyncio.to_thread")
        log.warning("the event loop was blocked for %s s by %s%s: every worker of this "
                    "process stood still meanwhile (no reads, no heartbeats, no other job; "
                    "Redis calls timing out then are not an outage); %s", seconds(late),
                    " and ".join(held), more, advice, extra=fields(**extra, duration_ms=took))


def _where(frame: FrameType | None) -> str:
    """``file:line in function`` of the innermost frame of the user's code (not asyncio's,
    the standard library's or streamwork's) in the stack of ``frame``."""
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP) and not path.startswith("<"):
            return f"{os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


_watches: dict[asyncio.AbstractEventLoop, Watch] = {}


def current() -> Watch | None:
    """The watch of the running loop, if one runs."""
    try:
        return _watches.get(asyncio.get_running_loop())
    except RuntimeError:
        return None


def runs(runner: asyncio.Task[Any], handler: str, stream: str,
         is_async: bool) -> dict[asyncio.Task[Any], Any]:
    """Where runner task ``runner`` notes the job it runs (``busy[runner] = delivery``
    around each handler call), for a stall to name with ``handler`` and ``stream``: the
    watch's, for an async handler (a plain def runs in a thread: it cannot block the
    loop); a dict nobody reads otherwise."""
    watch = current()
    if watch is None or not is_async:
        return {}
    watch.names[runner] = (handler, stream)
    return watch.running


def ran(runner: asyncio.Task[Any]) -> None:
    """Runner task ``runner`` ended: forget it."""
    watch = current()
    if watch is not None:
        watch.names.pop(runner, None)
        watch.running.pop(runner, None)


def excuses(exc: BaseException, since: float) -> float | None:
    """`Watch.excuses` of the running loop's watch (None without one)."""
    watch = current()
    return None if watch is None else watch.excuses(exc, since)


@contextlib.asynccontextmanager
async def watching() -> AsyncIterator[Watch]:
    """The running loop's watch, started by its first user and stopped by its last (the
    workers of one process share it)."""
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None:
        watch = _watches[loop] = Watch(loop)
        watch.start()
    watch.users += 1
    try:
        yield watch
    finally:
        watch.users -= 1
        if watch.users == 0:
            _watches.pop(loop, None)
            await watch.stop()
