"""The seam between a worker's delivery core and its optional features.

A feature is a subclass of `Feature` that overrides the hooks it needs; every hook of the
base class does nothing. The consumer builds its features once (`Feature.build` answers
None when the worker's options leave the feature off) and keeps, per hook, only the
features that override it (`Hooks`), so a job's path pays for what is configured and
nothing else. The core calls hooks; it never names a feature.

Where the hooks sit on a delivery's way (see consumer.py and start.py):

* ``loops``: background tasks of the feature, supervised like the core's own;
* ``on_join``: the group is joined (at start, and again after Redis came back empty);
* ``read``: a feature may take over a read round (reading several sources at once);
* ``end_report``: what to write with a job's end, whatever it is (asked as it is vetted);
* ``on_admit``: deliveries just read and vetted; ``route``: which of them may be queued
  now (the others are the feature's to queue later, through `Parts.queue`);
* ``check_start`` (synchronous, cheap) and ``before_start`` (may wait on Redis): the
  decision to start, taken before the start is committed: `GO`, `Wait` (looked at again
  later, no attempt used), `Fail` (fails as if the handler had raised) or `Drop` (ends the
  job without running it, its record saying why); ``after_run``: the job of a delivery
  whose ``before_start`` said go has ended (or did not start after all);
* ``wrap_call``: wraps the handler call (user middleware);
* ``on_failure``: a failed job's fate, before it is written; a feature may take it over;
* ``before_done``: successes about to be written (a feature finishes what it staged, or
  refuses one); ``on_done``: a success Redis recorded; ``on_leave``: any delivery leaving;
* ``on_stop``: the worker stops, before the drain.

Worker-wide services (periodic jobs, moving chained jobs between slots) are not per
consumer: `Service` runs beside the consumers of a worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol

if TYPE_CHECKING:
    from streamwork._wire.extensions import Codec
    from streamwork._wire.message import Sender
    from streamwork._worker.core.context import Context
    from streamwork._worker.core.delivery import Admit, Delivery, Entry
    from streamwork._worker.core.ends import EndReport
    from streamwork._worker.core.failure import Verdict as Fate
    from streamwork._worker.core.gate import Gate
    from streamwork._worker.core.holdings import Holdings
    from streamwork._worker.core.supervisor import Link


# ---- what a start hook answers ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Go:
    """The job may start (as far as this hook is concerned)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Not now: the delivery stays held (heartbeated, no attempt used) and is looked at
    again after ``delay`` seconds."""

    delay: float


@dataclass(frozen=True, slots=True)
class Fail:
    """The job fails with ``error`` as if its handler had raised it (retried, then
    dead-lettered)."""

    error: Exception


@dataclass(frozen=True, slots=True)
class Drop:
    """The job ends without running: acknowledged, its record (with job records) says
    ``state`` (e.g. "expired") and ``reason``; counted as ``state``."""

    state: str
    reason: str


Verdict = Go | Wait | Fail | Drop
GO: Final = Go()

#: a background loop's step: one turn; returns whether it reached Redis (supervisor.py)
Step = Callable[[], Awaitable[bool]]
#: a wrapped handler call: ``await call(msg_or_msgs)``
Call = Callable[[Any], Awaitable[Any]]


class Holder(Protocol):
    """What a feature may ask of the start path: put a delivery back to wait for an
    in-place retry, its record saying so (``Starts.hold``)."""

    def hold(self, d: Delivery, due: float) -> asyncio.Future[int]: ...


@dataclass(frozen=True, slots=True)
class Parts:
    """What a feature may use of its consumer."""

    ctx: Context
    holdings: Holdings
    gate: Gate  #: close it to stop every start (and reading); open it again
    admit: Admit  #: hand reclaimed or taken-over entries to the consumer
    queue: Callable[[list[Delivery]], None]  #: queue deliveries a feature held back (route)
    starts: Holder
    link: Link  #: what the consumer knows of Redis being up
    #: the worker's Python-only options and shared parts, by name (a feature reads its own)
    extras: Mapping[str, Any] = field(default_factory=dict)
    codec: Codec | None = None
    url: str = ""


class Feature:
    """An optional part of a worker, plugged into its consumer at the seam. Subclasses
    override ``build`` and the hooks they need; the options they declare are listed in
    ``options`` (a class of annotated defaults, which `StreamWorker` inherits)."""

    #: the worker options this feature declares: a class whose annotated attributes are
    #: the options and their defaults (None: it declares none)
    options: ClassVar[type | None] = None
    #: one line of help per option it declares (``streamwork run --help``)
    help: ClassVar[Mapping[str, str]] = {}
    #: the feature's worker-wide part, if it has one (runs beside the worker's consumers)
    service: ClassVar[Service | None] = None

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Refuse bad values of the options this feature declares (ConfigError)."""

    @classmethod
    def check_handler(cls, cfg: Any, batch: bool, name: str) -> None:
        """Refuse options that do not go with the worker's kind of handler (``batch``:
        it defines ``handle_batch``; ``name``: the worker class's)."""

    @classmethod
    def build(cls, parts: Parts) -> Feature | None:
        """This feature for one consumer, or None when the worker's options leave it off."""
        return None

    def loops(self) -> Iterable[tuple[str, Step]]:
        """Background loops stopped with the reader (before the drain)."""
        return ()

    def keepers(self) -> Iterable[tuple[str, Step]]:
        """Background loops that run until what is held was written (after the drain)."""
        return ()

    async def on_join(self) -> None:
        """The group was joined (at start, or created again after Redis lost it)."""

    async def read(self, count: int) -> list[tuple[bytes, list[Entry]]] | None:
        """Read up to ``count`` entries for the consumer, or None to let it read its
        stream and retry stream as usual. [(stream, entries), ...]"""
        return None

    def sender(self) -> Sender | None:
        """What ``msg.send`` stages jobs through (None: not this feature's)."""
        return None

    def end_report(self, options: Mapping[str, Any], job_key: str) -> EndReport | None:
        """What to write with the end of a job sent with ``options`` (non-empty), whatever
        that end is (`core.ends`), or None. Asked when an entry is vetted; a job that has
        one is never skipped as known done by the done-cache (its end is reported)."""
        return None

    def on_admit(self, fresh: list[Delivery]) -> None:
        """Deliveries just read and vetted, before their leases are taken."""

    def route(self, ds: list[Delivery]) -> list[Delivery]:
        """Of ``ds`` (leased, ready to run), those that may be queued now; the feature
        queues the others later through `Parts.queue`."""
        return ds

    def check_start(self, d: Delivery) -> Verdict:
        """A cheap, synchronous check right before ``d``'s start is committed."""
        return GO

    async def before_start(self, d: Delivery) -> Verdict:
        """A check that may wait (on Redis) before ``d``'s start is committed; a runner
        makes it. A feature with this hook makes starts wait for a runner."""
        return GO

    async def after_run(self, d: Delivery) -> None:
        """``d``'s job ended, or did not start after all, once ``before_start`` hooks ran
        for it: undo what this feature's ``before_start`` took (nothing if it took none)."""

    def wrap_call(self, call: Call) -> Call:
        """The handler call, wrapped (or as it is)."""
        return call

    def on_failure(self, d: Delivery, fate: Fate, error: Exception) -> bool:
        """``d``'s job failed and ``fate`` was decided; True when this feature takes the
        failure over (it is then not written as usual)."""
        return False

    async def before_done(self, ds: list[Delivery]) -> list[tuple[Delivery, Exception]]:
        """Successes about to be written: finish what their handlers staged through this
        feature (I/O allowed: it runs in the flusher, not in a handler). Returns those it
        refuses, each with the error it fails with (as if its handler had raised it); a
        transient Redis error it raises makes the flusher try again later."""
        return []

    def on_done(self, d: Delivery) -> None:
        """Redis recorded ``d``'s success (acknowledged, done record written)."""

    def on_leave(self, d: Delivery) -> None:
        """``d`` leaves what the consumer holds (written, or let go)."""

    async def on_stop(self) -> None:
        """The worker stops: called before the drain."""

    def state(self) -> Any:
        """What this feature reports of itself (health)."""
        return None


def _overrides(feature: Feature, hook: str) -> bool:
    return getattr(type(feature), hook) is not getattr(Feature, hook)


class Hooks:
    """The hooks of a consumer's features, each a tuple of the features' bound methods
    that override it (in the features' order): built once, looked at per job."""

    __slots__ = ("admit", "after", "before", "before_done", "check", "done", "ends",
                 "failure", "features", "join", "leave", "reads", "routes", "stop", "wraps")

    def __init__(self, features: Sequence[Feature]) -> None:
        self.features = tuple(features)

        def having(hook: str) -> tuple[Any, ...]:
            return tuple(getattr(f, hook) for f in self.features if _overrides(f, hook))

        self.join: tuple[Callable[[], Awaitable[None]], ...] = having("on_join")
        self.reads: tuple[Callable[[int], Awaitable[Any]], ...] = having("read")
        self.admit: tuple[Callable[[list[Delivery]], None], ...] = having("on_admit")
        self.ends: tuple[Callable[[Mapping[str, Any], str], EndReport | None], ...] = having(
            "end_report")
        self.routes: tuple[Callable[[list[Delivery]], list[Delivery]], ...] = having("route")
        self.check: tuple[Callable[[Delivery], Verdict], ...] = having("check_start")
        self.before: tuple[Callable[[Delivery], Awaitable[Verdict]], ...] = having(
            "before_start")
        self.after: tuple[Callable[[Delivery], Awaitable[None]], ...] = having("after_run")
        self.wraps: tuple[Callable[[Call], Call], ...] = having("wrap_call")
        self.failure: tuple[Callable[[Delivery, Fate, Exception], bool], ...] = having(
            "on_failure")
        self.before_done: tuple[Callable[[list[Delivery]], Awaitable[
            list[tuple[Delivery, Exception]]]], ...] = having("before_done")
        self.done: tuple[Callable[[Delivery], None], ...] = having("on_done")
        self.leave: tuple[Callable[[Delivery], None], ...] = having("on_leave")
        self.stop: tuple[Callable[[], Awaitable[None]], ...] = having("on_stop")

    def find(self, kind: type[Feature]) -> Feature | None:
        """The feature of type ``kind``, if built."""
        return next((f for f in self.features if isinstance(f, kind)), None)

    def sender(self) -> Sender | None:
        """What ``msg.send`` uses: the first feature that gives one."""
        return next((s for f in self.features if (s := f.sender()) is not None), None)

    def check_start(self, d: Delivery) -> Verdict:
        """The synchronous start checks of ``d``: the first answer that is not go."""
        for check in self.check:
            verdict = check(d)
            if verdict is not GO:
                return verdict
        return GO

    def end_report_of(self) -> Callable[[Mapping[str, Any], str], EndReport | None] | None:
        """What asks the features for a job's end report: None when none may have one."""
        if not self.ends:
            return None
        ends = self.ends
        if len(ends) == 1:
            return ends[0]
        return lambda options, key: next(
            (r for e in ends if (r := e(options, key)) is not None), None)

    def start_check(self) -> Callable[[Delivery], Verdict] | None:
        """What checks a start synchronously, cheapest form: None when no feature does,
        the one feature's hook when one does, else `check_start`."""
        if not self.check:
            return None
        return self.check[0] if len(self.check) == 1 else self.check_start

    def wrap(self, call: Call) -> Call:
        """The handler call wrapped by every feature that wraps it (the first outermost)."""
        for wrap in reversed(self.wraps):
            call = wrap(call)
        return call


@dataclass(frozen=True, slots=True)
class Env:
    """What a worker-wide `Service` gets: the worker's options, where Redis is, its
    consumer name, the event that stops it, what it knows of Redis being up."""

    cfg: Any
    url: str
    consumer: str
    stop: asyncio.Event
    link: Link | None
    codec: Codec | None
    extras: Mapping[str, Any]


class Service(Protocol):
    """A worker-wide feature: ``serve`` awaits ``main`` (the worker's consumers) with the
    service beside it, either one failing stops both."""

    def __call__(self, main: Awaitable[None], env: Env) -> Awaitable[None]: ...
