"""``@sw.worker``: a worker made of one function, for a stream whose handler is a few lines.

The decorator turns the function into a `StreamWorker` subclass named after it (module,
name, qualified name and docstring are the function's), so the decorated name is a worker
class like any other: ``send_email.from_url(url).run()``, ``await ....serve()``,
``streamwork run myapp:send_email``; the function itself stays callable as
``send_email.fn(msg)``. Options are checked when the decorator runs, by the same checks a
worker class gets when it is built. ``@sw.batch_worker`` does the same for a function
taking a list of messages: the worker's ``handle_batch``.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypedDict, cast, overload

from typing_extensions import TypeVar, Unpack

from streamwork._wire.extensions import Codec
from streamwork._wire.message import Message, P
from streamwork._wire.payloads import kind_of
from streamwork._wire.schedules import Cron, Every
from streamwork._worker.config import WorkerConfig, did_you_mean
from streamwork._worker.features.middleware import Middleware
from streamwork._worker.worker import _CLASS_OPTIONS, StreamWorker
from streamwork.errors import ConfigError

__all__ = ["BatchFunctionWorker", "FunctionWorker", "WorkerKeywords", "batch_worker", "worker"]

#: what the decorated function returns (its job's result; a coroutine for an async def)
R = TypeVar("R", default=Any)

#: the URL of the worker the decorator builds to check the options: building a worker
#: touches no server, so nothing is ever sent there
_CHECK_URL = "redis://127.0.0.1:6379/0"

#: lifecycle hooks the decorator takes: functions of no arguments (the class API's methods)
_HOOKS = ("on_start", "on_stop")

#: options that are functions: kept on the class as static methods, so that Python does
#: not pass them the worker as a first argument
_FUNCTIONS = ("concurrency_key", *_HOOKS)

#: every keyword the decorator takes besides the stream, group and payload_type
KEYWORDS: tuple[str, ...] = (
    *(n for n in WorkerConfig.option_names() if n not in ("stream", "group")),
    *(n for n in _CLASS_OPTIONS if n != "payload_type"),
    *_HOOKS,
)


class WorkerKeywords(TypedDict, total=False):
    """The options ``@sw.worker`` takes as keywords besides the stream, ``group`` and
    ``payload_type``: every option of a worker class, and the hooks ``on_start`` and
    ``on_stop`` as functions of no arguments (``async def`` or plain ``def``). Typed here
    so a type checker sees a misspelt option or a wrong type."""

    concurrency: int
    visibility_timeout: float
    max_deliveries: int
    dedup: bool
    dedup_window: float
    retry_delay: float
    retry_max_delay: float
    batch_size: int
    read_block: float
    drain_timeout: float
    heartbeat: bool
    reclaim_interval: float | None
    retention: float | None
    consumer_idle_timeout: float
    max_payload_bytes: int
    local_cache_size: int
    local_cache_ttl: float
    lock_urls: Sequence[str] | None
    timeout: float | None
    max_result_bytes: int
    partitions: int
    ordered: bool
    only_partitions: Sequence[int] | None
    cancel_running: bool
    rate_limit: str | None
    concurrency_per_key: int
    catch_up: str
    batch_max: int
    batch_wait: float
    priority_order: str
    priority_weights: str
    local_cache: Any
    concurrency_key: Callable[[Message[Any]], str] | None
    schedules: Sequence[Every | Cron]
    codec: Codec | None
    middleware: Sequence[Middleware]
    on_start: Callable[[], Any] | None
    on_stop: Callable[[], Any] | None


class FunctionWorker(StreamWorker[P], Generic[P, R]):
    """The class ``@sw.worker`` makes of a function: a `StreamWorker` whose handler is the
    function, called with each `Message` (a plain ``def`` in the worker's thread pool, as
    a plain ``def handle`` would be)."""

    #: the decorated function, callable as it was: ``send_email.fn(msg)``
    fn: Callable[[Message[P]], R]


class BatchFunctionWorker(StreamWorker[P], Generic[P, R]):
    """The class ``@sw.batch_worker`` makes of a function: a `StreamWorker` whose
    ``handle_batch`` is the function, called with a list of up to ``batch_max`` messages."""

    #: the decorated function, callable as it was: ``save_rows.fn(msgs)``
    fn: Callable[[list[Message[P]]], R]


@overload
def worker(stream: str, *, group: str, payload_type: None = None,
           **options: Unpack[WorkerKeywords],
           ) -> Callable[[Callable[[Message[P]], R]], type[FunctionWorker[P, R]]]: ...


@overload
def worker(stream: str, *, group: str, payload_type: type[P],
           **options: Unpack[WorkerKeywords],
           ) -> Callable[[Callable[[Message[P]], R]], type[FunctionWorker[P, R]]]: ...


def worker(stream: str, *, group: str | None = None, payload_type: Any = None,
           **options: Any) -> Callable[[Callable[..., Any]], type[FunctionWorker[Any, Any]]]:
    """Make a worker of a function: ``@sw.worker("emails", group="mailer",
    concurrency=32)`` over ``async def send_email(msg: sw.Message) -> None`` (or a plain
    ``def``, run in a thread pool). Every option of a worker class can be given as a
    keyword (``payload_type=Invoice`` makes ``msg.payload`` an ``Invoice``: annotate the
    parameter ``sw.Message[Invoice]``), and ``on_start``/``on_stop`` as functions of no
    arguments. The decorated name is a `StreamWorker` subclass named after the function
    (run it with ``from_url(url).run()`` or ``streamwork run module:name``), the function
    stays callable as ``.fn``. A bad option raises `ConfigError` naming it, here."""
    if "batch_max" in options or "batch_wait" in options:
        option = "batch_max" if "batch_max" in options else "batch_wait"
        raise ConfigError(option, "is an option of batch handlers: decorate a function "
                                  "taking a list of messages with @sw.batch_worker(...) "
                                  "instead of @sw.worker(...)")
    return _decorator("worker", stream, group, payload_type, options)


@overload
def batch_worker(stream: str, *, group: str, payload_type: None = None,
                 **options: Unpack[WorkerKeywords],
                 ) -> Callable[[Callable[[list[Message[P]]], R]],
                               type[BatchFunctionWorker[P, R]]]: ...


@overload
def batch_worker(stream: str, *, group: str, payload_type: type[P],
                 **options: Unpack[WorkerKeywords],
                 ) -> Callable[[Callable[[list[Message[P]]], R]],
                               type[BatchFunctionWorker[P, R]]]: ...


def batch_worker(stream: str, *, group: str | None = None, payload_type: Any = None,
                 **options: Any
                 ) -> Callable[[Callable[..., Any]], type[BatchFunctionWorker[Any, Any]]]:
    """Make a worker of a batch handler: ``@sw.batch_worker("rows", group="loader",
    batch_max=500)`` over ``async def save_rows(msgs: list[sw.Message]) -> None`` (or a
    plain ``def``), called with up to ``batch_max`` messages at a time and returning as a
    worker class's ``handle_batch`` does: None (each succeeded) or one result or
    exception per message. Otherwise as `worker`: every option as a keyword, the function
    callable as ``.fn``, a bad option raising `ConfigError` here."""
    return _decorator("batch_worker", stream, group, payload_type, options)


def _decorator(kind: str, stream: str, group: str | None, payload_type: Any,
               options: dict[str, Any]) -> Callable[[Callable[..., Any]], Any]:
    """What ``@sw.worker(...)`` and ``@sw.batch_worker(...)`` (``kind``) return: the
    options checked, a function making the class."""
    if callable(stream) and not isinstance(stream, str):
        raise TypeError(f"@sw.{kind} takes the stream and group first: "
                        f"@sw.{kind}('emails', group='mailer') above the function")
    for name, value in (("stream", stream), ("group", group)):
        if not isinstance(value, str) or not value:
            raise ConfigError(name, f"must be a non-empty str, got {value!r}: "
                                    f"@sw.{kind}('emails', group='mailer')")
    unknown = sorted(set(options) - set(KEYWORDS))
    if unknown:
        raise ConfigError(unknown[0], f"is not an option of @sw.{kind}"
                                      f"{did_you_mean(unknown[0], KEYWORDS)}; known options: "
                                      f"payload_type, {', '.join(KEYWORDS)}")
    assert group is not None

    def decorate(fn: Callable[..., Any]) -> Any:
        return _make_class(fn, stream, group, payload_type, options, kind == "batch_worker")

    return decorate


def _make_class(fn: Callable[..., Any], stream: str, group: str, payload_type: Any,
                options: dict[str, Any], batch: bool = False) -> type[StreamWorker[Any]]:
    """The `FunctionWorker` subclass of ``fn`` with these options as its class attributes
    (so ``from_url`` and ``streamwork run --option`` still override them), checked by
    building one worker of it, which is where a worker class's options are checked.
    ``batch``: ``fn`` is the worker's ``handle_batch``, else its ``handle``."""
    name = _check_function(fn, batch)
    attrs: dict[str, Any] = {
        "__module__": getattr(fn, "__module__", None) or __name__,
        "__qualname__": getattr(fn, "__qualname__", None) or name,
        "__doc__": getattr(fn, "__doc__", None),
        "stream": stream,
        "group": group,
        "payload_type": payload_type,
        "fn": staticmethod(fn),
        "handle_batch" if batch else "handle": staticmethod(_handler(fn)),
    }
    for option, value in options.items():
        if option in _HOOKS:
            _check_hook(option, value)
            if value is None:
                continue  # no hook: the class's own, which does nothing
        if option in _FUNCTIONS and value is not None:
            value = staticmethod(value)
        attrs[option] = value
    base = BatchFunctionWorker if batch else FunctionWorker
    cls = cast("type[StreamWorker[Any]]", type(name, (base,), attrs))
    cls(_CHECK_URL)  # every check a worker class gets when built; a bad option raises here
    _check_annotation(fn, payload_type, batch)
    return cls


def _check_function(fn: object, batch: bool = False) -> str:
    """``fn``'s name, once it is seen to be a function taking the message (``batch``: the
    list of messages)."""
    takes = "the list of messages" if batch else "the message"
    example = ("async def save_rows(msgs: list[sw.Message])" if batch
               else "async def send_email(msg: sw.Message)")
    if not callable(fn) or isinstance(fn, type):
        raise ConfigError("handle_batch" if batch else "handle", (
            f"@sw.{'batch_worker' if batch else 'worker'}(...) decorates a function taking "
            f"{takes} (`{example}`), got {fn!r}"))
    name = getattr(fn, "__name__", None) or type(fn).__name__
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to look at (some builtins): trust it
        return name
    try:
        signature.bind(None)
    except TypeError:
        arg = "msgs: list[sw.Message]" if batch else "msg: sw.Message"
        raise ConfigError("handle_batch" if batch else "handle",
                          f"{name}{signature} must take {takes} as its one "
                          f"argument: `def {name}({arg})`") from None
    return name


def _handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """What runs each job: ``fn`` itself (the worker runs an ``async def`` on its loop and
    anything else in its thread pool, as it tells by the function), or, for an object
    whose ``__call__`` is an ``async def``, a coroutine function awaiting it."""
    if inspect.iscoroutinefunction(fn) or not inspect.iscoroutinefunction(type(fn).__call__):
        return fn

    async def handle(msg: Any) -> Any:
        return await fn(msg)
    return handle


def _check_hook(option: str, hook: object) -> None:
    """``on_start``/``on_stop``: None or a function called with no arguments."""
    if hook is None:
        return
    ok = callable(hook)
    if ok:
        try:
            inspect.signature(cast("Callable[..., Any]", hook)).bind()
        except TypeError:
            ok = False
        except ValueError:  # no signature to look at: trust it
            pass
    if not ok:
        raise ConfigError(option, f"must be a function of no arguments (`async def` or "
                                  f"`def`), called once per worker, got {hook!r}")


def _check_annotation(fn: Callable[..., Any], payload_type: Any, batch: bool = False) -> None:
    """Refuse a function whose parameter says ``sw.Message[Invoice]`` for a payload type
    the worker does not convert to: without ``payload_type=Invoice`` its ``msg.payload``
    would be the decoded map, and fail only when a job runs. Annotations that cannot be
    resolved (names defined later) are not looked at. ``batch``: the parameter is a list
    of messages (``list[sw.Message[Invoice]]``)."""
    try:
        params = list(inspect.signature(fn).parameters)
        hint = typing.get_type_hints(fn).get(params[0]) if params else None
    except Exception:  # an annotation naming what is not there yet, no signature, ...
        return
    if batch and typing.get_origin(hint) is list and typing.get_args(hint):
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) is not Message or not typing.get_args(hint):
        return
    declared = typing.get_args(hint)[0]
    if not _is_payload_class(declared):
        return  # Any, dict, dict[str, Any], ...: nothing for the worker to convert to
    name = getattr(fn, "__qualname__", repr(fn))
    if payload_type is None:
        raise ConfigError("payload_type", (
            f"{name} takes sw.Message[{declared.__name__}] but payload_type is not set, so "
            f"msg.payload would be the decoded map, not an instance of it: give "
            f"@sw.worker(..., payload_type={declared.__name__})"))
    if not (isinstance(payload_type, type) and issubclass(payload_type, declared)):
        raise ConfigError("payload_type", (
            f"is {getattr(payload_type, '__name__', payload_type)!s}, but {name} takes "
            f"sw.Message[{declared.__name__}]: make them the same type"))


def _is_payload_class(t: object) -> bool:
    """Whether ``t`` is a type a worker converts payloads to (dataclass, Struct, model)."""
    try:
        kind_of(t)
    except ConfigError:
        return False
    return True
