"""StreamWorker: subclass it, set ``stream`` and ``group``, write ``handle()`` (or
``handle_batch()``, several jobs per call), run it.

The worker is asyncio throughout: ``run()`` is ``asyncio.run(self.serve())`` with
SIGINT/SIGTERM handlers, ``serve()`` runs inside an existing loop, and ``stop()`` may be
called from any thread. A plain ``def handle`` runs in a bounded thread pool.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import signal
import socket
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from streamwork._redis import connection
from streamwork._telemetry.logs import WORKER_LOGGER, ensure_logging, fields
from streamwork._text import describe
from streamwork._wire.extensions import check_codec
from streamwork._wire.keys import check_name
from streamwork._wire.message import Message, P
from streamwork._wire.pausing import PauseState
from streamwork._wire.payloads import converter
from streamwork._wire.schedules import check_schedules
from streamwork._worker.config import (
    WorkerConfig,
    WorkerOptions,
    check_attributes,
    check_handler,
)
from streamwork._worker.core import looplag
from streamwork._worker.core.batch_runner import AnyHandler, BatchHandler, check_batch
from streamwork._worker.core.consumer import Consumer
from streamwork._worker.core.done_cache import local_cache
from streamwork._worker.core.seam import Env
from streamwork._worker.features import FEATURES
from streamwork._worker.features.middleware import check_middleware, worker_started, worker_stopped
from streamwork._worker.features.pause import Pausing
from streamwork._worker.partitioned import Partitioned
from streamwork.errors import ConfigError, WorkerFailed

__all__ = ["Health", "StreamWorker"]

W = TypeVar("W", bound="StreamWorker")

#: options a worker takes as class attributes besides WorkerOptions' (Python only)
_CLASS_OPTIONS = ("local_cache", "payload_type", "concurrency_key", "schedules", "codec",
                  "middleware")
log = logging.getLogger(WORKER_LOGGER)


def consumer_name() -> str:
    """A unique consumer name: host-pid-random."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class Health:
    """A worker's health, for probes: ``alive`` - serving, every internal task running;
    ``ready`` - alive, group joined, Redis answering, not draining; ``paused`` - why and
    since when its group is paused (None: it runs), which leaves it ready: a pause is
    deliberate, not a fault; ``locks_ok`` - the lock quorum (``lock_urls``) answers, or
    there is none (while it does not, the worker is not ready)."""

    alive: bool
    ready: bool
    draining: bool
    redis_ok: bool
    dead_tasks: tuple[str, ...]
    paused: PauseState | None = None
    locks_ok: bool = True


class StreamWorker(WorkerOptions, Generic[P]):
    """Base class of job workers; class attributes are the defaults of its options.

    Delivery is at-least-once: a job is acknowledged only after ``handle`` returned. With
    ``dedup`` on, a job key's effect is taken once per group: a job record (the lease,
    then the done record) and a fencing token stop a duplicate or redelivered job from
    running again after success (docs/explanations/guarantees.md says what that covers
    and what it does not).
    """

    # the options (stream, group, concurrency, visibility_timeout, ...) and their defaults
    # are declared once, in config.WorkerOptions; a subclass overrides them as attributes

    #: the in-process cache of keys completed recently (dedup on): None - the built-in one
    #: (``local_cache_size``/``local_cache_ttl``); False - none; or any mutable mapping
    #: such as ``cachetools.TTLCache(maxsize=100_000, ttl=60)``. Keep its TTL below
    #: ``dedup_window``: a key it holds is acked as a duplicate without asking Redis.
    local_cache: Any = None

    #: the type handlers get as ``msg.payload``: a dataclass, a ``msgspec.Struct`` or a
    #: pydantic model class (None: the decoded MessagePack value as it is). A payload that
    #: does not validate is dead-lettered at once (reason ``payload:invalid``, never
    #: retried); ``StreamWorker[Invoice]`` types ``msg.payload`` for the type checker.
    #: Python only (attribute or ``from_url(payload_type=...)``).
    payload_type: Any = None

    #: ``concurrency_per_key`` caps the jobs in flight per the key this returns, across
    #: every worker of the group: a method ``def concurrency_key(self, msg) -> str``, or a
    #: function of ``msg`` given to ``from_url(concurrency_key=...)`` (None: no cap).
    concurrency_key: Any = None

    #: periodic jobs: ``[sw.Every(60, payload=...), sw.Cron("*/5 * * * *", tz="UTC")]``;
    #: each tick is enqueued once across all the group's workers (missed ticks: see
    #: ``catch_up``). Python only (attribute or ``from_url(schedules=[...])``).
    schedules: Any = ()

    #: your own types in payloads and results: a ``sw.Codec`` registering each with a
    #: MessagePack ext code and its encoder and decoder (give producers the same one). A
    #: payload its decoder fails on is dead-lettered (``payload:invalid``). Decimal, UUID,
    #: date and aware datetime need none. Python only (attribute or ``from_url(codec=...)``).
    codec: Any = None

    #: your own hooks around every job (a log context, an error reporter, a session per
    #: job): a list of ``sw.Middleware`` instances, run in order (``after`` hooks in
    #: reverse). Python only (attribute, ``from_url(middleware=[...])``, ``@sw.worker``).
    middleware: Any = ()

    def __init__(self, url: str | None = None, *, consumer: str | None = None,
                 **options: Any) -> None:
        check_attributes(type(self), StreamWorker, _CLASS_OPTIONS)  # misspelt options
        self.url = connection.resolve_url(url)
        cache_option = options.pop("local_cache", type(self).local_cache)
        self.payload_type = options.pop("payload_type", type(self).payload_type)
        self._convert = None if self.payload_type is None else converter(self.payload_type)
        self._key_of = _key_function(self, options.pop("concurrency_key", None))
        self.codec = check_codec(options.pop("codec", type(self).codec))
        schedules = options.pop("schedules", type(self).schedules)
        self.middleware = check_middleware(options.pop("middleware", type(self).middleware))
        self.config = WorkerConfig.build(type(self), options)
        self._batch = _check_handle(type(self))
        check_batch(self.config, self._batch, type(self).__qualname__)
        check_handler(self.config, self._batch, type(self).__qualname__)
        self.schedules = check_schedules(schedules, self.config.max_payload_bytes,
                                         self._convert, self.codec)
        self.local_cache = cache_option
        cache = local_cache(cache_option, self.config.local_cache_size,
                            self.config.local_cache_ttl)  # checked whatever dedup says
        self._cache = cache if self.config.dedup else None
        self.consumer_name = check_name("consumer", consumer) if consumer else consumer_name()
        self.worker_name = f"{type(self).__module__}.{type(self).__qualname__}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self._consumer: Consumer | None = None
        self._partitioned: Partitioned | None = None
        self._counts: Counter[str] = Counter()

    @classmethod
    def from_url(cls: type[W], url: str | None = None, **options: Any) -> W:
        """A worker for ``url`` (default ``$REDIS_URL``, else redis://127.0.0.1:6379/0);
        ``options`` override the class attributes and are checked here."""
        return cls(url, **options)

    async def handle(self, msg: Message[P]) -> Any:
        """Process one job; return to acknowledge it, raise to retry or dead-letter it."""
        raise NotImplementedError(
            f"{type(self).__name__} must define `async def handle(self, msg)` (or a plain def)"
        )

    async def handle_batch(self, msgs: list[Message[P]]) -> Any:
        """Instead of ``handle``: process up to ``batch_max`` jobs in one call. Return None
        (each succeeded) or a list of one item per message, in order: its job's result, or
        an exception instance (that job alone fails: retried, then dead-lettered). If it
        raises, each job of the call fails with that error."""
        raise NotImplementedError(f"{type(self).__name__} defines no handle_batch")

    async def on_start(self) -> None:
        """Called once in ``serve()`` before the first read: open pools and clients here.
        May be a plain ``def``. If it raises, the worker does not start: ``serve()``
        raises `WorkerFailed` (its ``cause`` is the error) and ``on_stop`` is not called."""

    async def on_stop(self) -> None:
        """Called once after the worker drained and closed its connections, also when it
        stops on an error: close what ``on_start`` opened. May be a plain ``def``. An error
        it raises is logged; the worker has stopped all the same."""

    def health(self) -> Health:
        """Whether the worker is whole (every internal loop running) and ready for work."""
        p = self._partitioned
        if p is not None:
            alive, ready = p.health()
            return Health(alive, ready, p.stopping, p.redis_ok, p.dead_tasks(), p.paused(),
                          all(c.quorum.up for c in p.consumers.values()))
        c = self._consumer
        if c is None:
            return Health(False, False, False, False, ())
        alive, ready = c.health()
        pausing = c.feature(Pausing)
        return Health(alive, ready and c.quorum.up, c.stopping,
                      not c.sup.failures and c.joined, tuple(c.sup.dead_tasks),
                      pausing.state() if pausing else None, c.quorum.up)

    @property
    def counts(self) -> Counter[str]:
        """Live counters: consumed, acked, retried, dead_lettered, deduplicated, ..."""
        if self._partitioned is not None:
            return self._partitioned.counts
        return self._consumer.counts if self._consumer else self._counts

    @property
    def partitions_served(self) -> list[int]:
        """The partitions this worker serves now (in ordered mode: those it owns)."""
        if self._partitioned is not None:
            return self._partitioned.owned()
        return [0] if self._consumer is not None and not self._consumer.stopped else []

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM or ``stop()``, then drain and return (blocking). In
        an application that configured no logging, its lines go to stderr as with
        ``streamwork run`` (see `serve`)."""
        ensure_logging()
        asyncio.run(self.serve(install_signal_handlers=True))

    async def serve(self, *, install_signal_handlers: bool = False) -> None:
        """Serve inside the running event loop until ``stop()``; returns once drained.

        Raises `WorkerFailed` (after draining) if an internal loop met an error that
        backing off cannot cure; transient Redis errors are ridden out.

        If the application configured no logging at all (no handler on the root logger
        or a streamwork logger), the worker's lines (INFO and up) go to stderr as with
        ``streamwork run``, until the application configures its own."""
        ensure_logging()
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stop_requested.is_set():
            self._stop_event.set()
        if install_signal_handlers:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._loop.add_signal_handler(sig, self.stop)
        cfg = self.config
        handle: AnyHandler = BatchHandler(self.handle_batch) if self._batch else self.handle
        extras = {"concurrency_key": self._key_of, "schedules": self.schedules,
                  "middleware": self.middleware}
        runner: Consumer | Partitioned
        if cfg.partitions > 1 or cfg.ordered:
            runner = self._partitioned = Partitioned(
                handle, cfg, self.url, self.consumer_name, self.worker_name, self._cache,
                convert=self._convert, codec=self.codec, extras=extras)
        else:
            runner = self._consumer = Consumer(
                handle, cfg, self.url, self.consumer_name, self.worker_name,
                cache=self._cache, features=FEATURES, convert=self._convert,
                codec=self.codec, extras=extras)
        env = Env(cfg, self.url, self.consumer_name, self._stop_event, runner.link,
                  self.codec, extras)
        try:
            await _start_hook(self.on_start, cfg, self.consumer_name)
            await _start_hook(lambda: worker_started(self.middleware, self), cfg,
                              self.consumer_name, "middleware on_worker_start")
            try:
                main: Awaitable[None] = runner.run(self._stop_event)
                for feature in FEATURES:  # the worker-wide services, beside the consumers
                    if feature.service is not None:
                        main = feature.service(main, env)
                async with looplag.watching():  # a handler blocking the loop is named
                    await main
            finally:
                await worker_stopped(self.middleware, self, fields(
                    stream=cfg.stream, group=cfg.group, consumer=self.consumer_name))
                await _stop_hook(self.on_stop, cfg, self.consumer_name)
        finally:
            self._counts = Counter(runner.counts)
            if install_signal_handlers:
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self._loop.remove_signal_handler(sig)

    def stop(self) -> None:
        """Ask the worker to stop reading, finish in-flight jobs and return; any thread."""
        self._stop_requested.set()
        loop, event = self._loop, self._stop_event
        if loop is None or event is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(event.set)

    def __repr__(self) -> str:
        c = self.counts
        return (
            f"<{type(self).__name__} stream={self.config.stream!r} group={self.config.group!r} "
            f"consumer={self.consumer_name!r} acked={c['acked']} retried={c['retried']} "
            f"dead_lettered={c['dead_lettered']} deduplicated={c['deduplicated']}>"
        )


def _check_handle(cls: type[StreamWorker[Any]]) -> bool:
    """Whether ``cls`` runs a batch handler; refuse one that defines neither ``handle`` nor
    ``handle_batch`` (it would start, then fail every job), or both (which one runs?)."""
    single = cls.handle is not StreamWorker.handle
    batch = cls.handle_batch is not StreamWorker.handle_batch
    if single and batch:
        raise ConfigError("handle_batch", (
            f"{cls.__qualname__} defines both handle() and handle_batch(): define one "
            "(handle runs each job alone, handle_batch runs up to batch_max jobs per call)"))
    if not (single or batch):
        raise ConfigError("handle", (
            f"{cls.__qualname__} does not define handle(): give the class an "
            "`async def handle(self, msg)` (or a plain def), which runs each job, or an "
            "`async def handle_batch(self, msgs)`, which runs a list of them"))
    return batch


def _key_function(worker: StreamWorker[Any], given: Any) -> Callable[[Message], str] | None:
    """The worker's concurrency key function: ``from_url(concurrency_key=f)``, else the
    class's ``concurrency_key`` (a method of ``(self, msg)``, or a function of ``msg``
    alone, e.g. a lambda, which Python would otherwise bind to the worker)."""
    if given is None:
        raw = inspect.getattr_static(worker, "concurrency_key", None)
        if raw is None:
            return None
        if isinstance(raw, staticmethod):
            given = raw.__func__
        elif inspect.isfunction(raw) and len(inspect.signature(raw).parameters) == 1:
            given = raw  # `concurrency_key = lambda msg: ...` in the class body
        else:
            given = worker.concurrency_key
    if not callable(given):
        raise ConfigError("concurrency_key", f"must be a function of the message returning "
                                             f"a str, got {given!r}")
    fn: Callable[[Message], str] = given
    return fn


async def _call_hook(hook: Callable[[], Any]) -> None:
    """Run a lifecycle hook written as ``async def`` or as a plain ``def``."""
    result = hook()
    if inspect.isawaitable(result):
        await result


async def _start_hook(hook: Callable[[], Any], cfg: WorkerConfig, consumer: str,
                      what: str = "on_start") -> None:
    """Run ``on_start`` (or the middleware's ``on_worker_start``): if the user's code
    raises, the worker does not start, and says so (WorkerFailed naming the hook, the
    traceback logged)."""
    try:
        await _call_hook(hook)
    except Exception as exc:
        log.error("%s raised %s; the worker does not start", what, describe(exc),
                  exc_info=exc, extra=fields(stream=cfg.stream, group=cfg.group,
                                             consumer=consumer))
        raise WorkerFailed(what, exc, started=False) from exc


async def _stop_hook(hook: Callable[[], Any], cfg: WorkerConfig, consumer: str) -> None:
    """Run ``on_stop``: the worker has stopped whatever it raises, so an error is logged
    rather than raised (which would turn a clean stop into a failed one)."""
    try:
        await _call_hook(hook)
    except Exception as exc:
        log.error("on_stop raised %s; the worker has stopped all the same", describe(exc),
                  exc_info=exc, extra=fields(stream=cfg.stream, group=cfg.group,
                                             consumer=consumer))
