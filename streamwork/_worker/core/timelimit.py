"""The time limit of one runner's jobs: one timer per runner, not one per job; and how
the runner withdraws the cancellation it made when a limit passed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class TimeLimit(Generic[T]):
    """Calls ``on_due(job)`` when the running job passes its limit. The timer stays armed
    across jobs and, when it fires before the running job's limit, re-arms for that limit;
    so a job past its limit is stopped at its limit, as with a timer of its own, without a
    timer made and cancelled per job."""

    __slots__ = ("due", "job", "loop", "on_due", "timer", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_due: Callable[[T], None]) -> None:
        self.loop = loop
        self.on_due = on_due
        self.job: T | None = None  # the running job, if it has a time limit
        self.due = 0.0  # its limit, loop time
        self.timer: asyncio.TimerHandle | None = None
        self.when = 0.0  # when the timer fires, loop time

    def start(self, job: T, due: float) -> None:
        """``job`` runs until ``due`` (loop time) at most."""
        self.job = job
        self.due = due
        if self.timer is None or self.when > due:
            if self.timer is not None:
                self.timer.cancel()
            self.when = due
            self.timer = self.loop.call_at(due, self._fire)

    def stop(self) -> None:
        """The running job ended (the timer stays armed for the next one)."""
        self.job = None

    def _fire(self) -> None:
        self.timer = None
        job = self.job
        if job is None:
            return
        if self.due <= self.when:
            self.on_due(job)
        else:
            self.when = self.due
            self.timer = self.loop.call_at(self.due, self._fire)

    def close(self) -> None:
        self.job = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def uncancel(task: asyncio.Task[Any]) -> None:
    """Withdraw a cancellation this worker made itself (a time limit), on Pythons that
    count them (3.11+), so later timeouts inside handlers are not confused."""
    withdraw = getattr(task, "uncancel", None)
    if withdraw is not None:
        withdraw()
