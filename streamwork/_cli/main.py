"""The ``streamwork`` command: run (one or several workers, ``--processes``, health probes),
demo; send, dlq, inspect, top, job, cancel, pause, resume, schedules, dashboard and bench
register from their own modules."""

from __future__ import annotations

import asyncio
import difflib
import gc
import importlib
import inspect
import os
import re
import sys
import traceback
import types
import typing
from pathlib import Path
from typing import Any, Final

import click

from streamwork._cli import bench as _bench_cli
from streamwork._cli import dashboard as cli_dashboard
from streamwork._cli import dlq as cli_dlq
from streamwork._cli import ops as cli_ops
from streamwork._cli import pause as cli_pause
from streamwork._cli import schedules as cli_schedules
from streamwork._cli import send as cli_send
from streamwork._cli.common import Main, fail, url_option
from streamwork._hosting import processes as processes_mod
from streamwork._hosting.health import DEFAULT_HEALTH_HOST
from streamwork._hosting.multi import serve_all
from streamwork._hosting.reload import Reloader, app_dirs
from streamwork._redis import connection
from streamwork._telemetry import logs
from streamwork._telemetry import sdk as otel
from streamwork._worker import config
from streamwork._worker.function import BatchFunctionWorker, FunctionWorker
from streamwork._worker.worker import StreamWorker
from streamwork.errors import StreamworkError

#: what `--timeout none` (and the like) parses to: the option is given, its value is None
_NONE: Final = object()

#: the base classes of workers, which are no workers themselves
_BASES: Final = (StreamWorker, FunctionWorker, BatchFunctionWorker)

#: the most worker processes `run --processes` starts (more is a typo, not a plan)
MAX_PROCESSES: Final = 256


def _or_none(inner: click.ParamType[Any], name: str) -> Any:
    """Option callback: a value of type ``inner``, or the word ``none`` (-> _NONE); any
    other word is refused naming both forms and what ``none`` means for this option."""
    kind = "a number of seconds" if inner is click.FLOAT else "a whole number"
    example = getattr(config.WorkerOptions, name, None)
    example = f" (e.g. {example:g})" if isinstance(example, (int, float)) else ""
    means = re.search(r"\(none: (.*)\)", config.HELP.get(name, ""))
    none = f"'none' ({means.group(1)})" if means else "'none'"

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        if value.strip().lower() == "none":
            return _NONE
        try:
            return inner.convert(value, param, ctx)
        except click.BadParameter:
            raise click.BadParameter(
                f"{value!r} is neither {kind} nor 'none': give {kind}{example}, or "
                f"{none}", ctx=ctx, param=param) from None

    return convert


class _WorkerOption(click.Option):
    """A `run` option for a worker option: its own default is None (not given: the worker
    class's attribute stands), and help shows the default WorkerOptions declares."""

    def __init__(self, *args: Any, shown_default: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shown_default = shown_default

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if self.shown_default is not None:
            extra["default"] = self.shown_default
        return extra


#: what help shows as the default where the declared value alone would mislead
_SHOWN: Final = {"only_partitions": "all"}


def _default_text(name: str, hint: Any) -> str | None:
    """How `run --help` shows an option's default: the value WorkerOptions declares (None:
    the option has none to show, as stream and group, which each worker must set)."""
    value = getattr(config.WorkerOptions, name)
    if name in _SHOWN:
        return _SHOWN[name]
    if hint is bool:  # click's own form for a --flag/--no-flag pair
        return name.replace("_", "-") if value else "no-" + name.replace("_", "-")
    if value is None:
        return "none"
    if value == "":
        return None
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_SCALARS: dict[Any, click.ParamType[Any]] = {int: click.INT, float: click.FLOAT, str: click.STRING}


def _option_for(name: str, hint: Any) -> Any | None:
    """The click option of one WorkerConfig field, from its type; None if it has no CLI
    form (tests/test_cli.py then fails, so a new option cannot be forgotten)."""
    flag = "--" + name.replace("_", "-")
    help_text = config.HELP.get(name, f"the worker's {name}")
    shown: dict[str, Any] = {"cls": _WorkerOption, "shown_default": _default_text(name, hint)}
    args = typing.get_args(hint)
    optional = type(None) in args and typing.get_origin(hint) in (types.UnionType, typing.Union)
    inner = next((a for a in args if a is not type(None)), None) if optional else hint
    if hint is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=help_text,
                            **shown)
    if typing.get_origin(inner) is tuple and typing.get_args(inner)[:1] in ((str,), (int,)):
        # a list: one repeatable option in the singular (--lock-url a --lock-url b)
        return click.option(flag.removesuffix("s"), name, multiple=True, help=help_text,
                            type=_SCALARS[typing.get_args(inner)[0]], **shown)
    if inner in _SCALARS and optional:
        kind = _SCALARS[inner]
        return click.option(flag, name, type=click.STRING, default=None, help=help_text,
                            metavar=f"{kind.name.upper()}|none", callback=_or_none(kind, name),
                            **shown)
    if inner in _SCALARS:
        return click.option(flag, name, type=_SCALARS[inner], default=None, help=help_text,
                            **shown)
    return None


def _worker_options() -> list[Any]:
    made = (_option_for(name, hint) for name, hint in config.option_types().items())
    return [o for o in made if o is not None]


def _overrides(options: dict[str, Any]) -> dict[str, Any]:
    """Worker options given on the command line (unset ones keep the class attribute)."""
    given = {k: v for k, v in options.items() if v is not None and v != ()}
    return {k: None if v is _NONE else v for k, v in given.items()}


def load_worker(target: str) -> type[StreamWorker]:
    """Import ``module:Worker`` (the current directory is on the path) and check it: a
    StreamWorker subclass, or a function decorated with ``@sw.worker`` (which is one)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        fail(f"{target!r}: give the worker as MODULE:Worker (a StreamWorker subclass or an "
             "@sw.worker function), e.g. myapp.workers:Billing")
    sys.path.insert(0, os.getcwd())
    module = _import(module_name)
    if not hasattr(module, attr):
        found = _workers_in(module)
        where = f"{module_name!r} ({getattr(module, '__file__', None) or 'no file'})"
        if not found:
            fail(f"there is no {attr!r} in {where}, and it defines no worker (StreamWorker "
                 f"subclass or @sw.worker function): check MODULE:Worker in {target!r}")
        close = difflib.get_close_matches(attr, found, n=1)
        fail(f"there is no {attr!r} in {where}."
             + (f" Did you mean {close[0]!r}?" if close else "")
             + f" Its workers (StreamWorker subclasses, @sw.worker functions): "
               f"{', '.join(found)}")
    cls = getattr(module, attr)
    if cls in _BASES:
        fail(f"{target!r} is {cls.__name__} itself: name your subclass of it")
    if not (isinstance(cls, type) and issubclass(cls, StreamWorker)):
        if isinstance(cls, StreamWorker):
            what = f"an instance of {type(cls).__qualname__}: name the class"
        elif inspect.isroutine(cls):
            what = ("a function not decorated with @sw.worker: put "
                    "@sw.worker(\"stream\", group=\"...\") above it")
        else:
            what = f"a {type(cls).__name__}"
        found = _workers_in(module)
        fail(f"{target!r} is {what}, not a StreamWorker subclass"
             + (f"; {module_name!r} has these: {', '.join(found)}" if found else ""))
    return cls


def _import(module_name: str) -> types.ModuleType:
    """The module named, or a failure saying whether it was not found or broke on import
    (with where it broke)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            fail(f"no module named {module_name!r} (looked in the current directory "
                 f"{os.getcwd()} and on sys.path, PYTHONPATH included): {exc}")
        fail(f"module {module_name!r} was found, but importing it failed; fix this:\n"
             + _import_error(exc))
    except Exception as exc:  # a module's own error: SyntaxError, NameError, ...
        fail(f"module {module_name!r} was found, but importing it failed; fix this:\n"
             + _import_error(exc))


def _import_error(exc: BaseException) -> str:
    """``exc`` with the frames of the code that raised it (not the import machinery's)."""
    machinery = (os.path.dirname(importlib.__file__ or "") + os.sep, "<frozen", __file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(machinery)]
    return "".join(traceback.format_list(frames)
                   + traceback.format_exception_only(exc)).rstrip()


def _workers_in(module: types.ModuleType) -> list[str]:
    """The names of the workers ``module`` has (defined or imported): StreamWorker
    subclasses, ``@sw.worker`` functions among them."""
    return sorted(name for name, value in vars(module).items()
                  if isinstance(value, type) and issubclass(value, StreamWorker)
                  and value not in _BASES and not name.startswith("_"))


@click.group(cls=Main)
@click.version_option(package_name="streamwork", message="%(package)s %(version)s")
def main() -> None:
    """streamwork: distributed job workers on Redis Streams."""


def _run_options(fn: Any) -> Any:
    """One `streamwork run` option per WorkerConfig field."""
    for option in reversed(_worker_options()):
        fn = option(fn)
    return fn


#: options the --processes supervisor sets per child instead of passing them through
_PER_CHILD: Final = frozenset({"targets", "processes", "health_port", "health_host",
                               "metrics_port"})
#: options the --reload reloader keeps to itself
_RELOADER: Final = frozenset({"targets", "reload", "reload_dirs"})


def _child_args(ctx: click.Context, skip: frozenset[str] = _PER_CHILD | _RELOADER) -> list[str]:
    """The `run` command line of one `--processes` child (or of the `--reload` reloader's
    child): the targets and options as this command parsed them (so the child accepts them
    as this one did), minus ``skip``, those the supervisor (or reloader) sets itself."""
    args: list[str] = list(ctx.params["targets"])
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in skip:
            continue
        value = ctx.params.get(param.name or "")
        if value is None or value == ():
            continue
        flag = param.opts[0]
        if param.is_flag and param.secondary_opts:  # --heartbeat/--no-heartbeat
            args.append(flag if value else param.secondary_opts[0])
        elif param.is_flag:
            args += [flag] if value else []
        elif param.multiple:
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, "none" if value is _NONE else str(value)]
    return args


def _check_distinct(workers: list[StreamWorker]) -> None:
    """Two workers of one process on one stream and group would split its jobs between
    two handlers at random: refuse that."""
    seen: dict[tuple[str, str], str] = {}
    for w in workers:
        where = (w.config.stream, w.config.group)
        if where in seen:
            fail(f"{seen[where]} and {w.worker_name} would both consume stream {where[0]!r} "
                 f"as group {where[1]!r}: give each worker its own stream or group (don't "
                 "pass --stream/--group to several workers); for more of one worker, raise "
                 "--concurrency or use --processes")
        seen[where] = w.worker_name


@main.command()
@click.argument("targets", nargs=-1, required=True, metavar="MODULE:Worker...")
@url_option
@_run_options
@click.option("--log-level", default="INFO", show_default=True,
              help="least severe log records shown: DEBUG, INFO, WARNING, ERROR")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True,
              help="text: one readable line per record; json: one JSON object per line")
@click.option("--otlp", is_flag=True,
              help="export traces and metrics over OTLP (extra 'otlp'; also on when "
                   "OTEL_EXPORTER_OTLP_ENDPOINT is set)")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="serve Prometheus metrics on PORT of --metrics-host (extra 'prometheus'); "
                   "with --processes N, child i serves on PORT+i")
@click.option("--metrics-host", default=otel.DEFAULT_METRICS_HOST, show_default=True,
              help="address of the metrics endpoint (0.0.0.0: every interface)")
@click.option("--processes", type=click.IntRange(1, MAX_PROCESSES), default=1,
              show_default=True,
              help="run N worker processes under one supervisor (restarted if they die)")
@click.option("--health-port", type=click.IntRange(1, 65535), default=None,
              help="serve GET /livez and /readyz (JSON; 200 or 503) on PORT of --health-host")
@click.option("--health-host", default=DEFAULT_HEALTH_HOST, show_default=True,
              help="address of the health probes (0.0.0.0: every interface)")
@click.option("--reload", is_flag=True,
              help="development: restart the workers (gracefully) when a Python file under "
                   "the app's directory, or a --reload-dir, changes (extra 'reload')")
@click.option("--reload-dir", "reload_dirs", multiple=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="with --reload: a directory to watch instead of the app's (repeatable)")
@click.pass_context
def run(ctx: click.Context, /, targets: tuple[str, ...], url: str | None, log_level: str,
        log_format: str, otlp: bool, metrics_port: int | None, metrics_host: str,
        processes: int, health_port: int | None, health_host: str, reload: bool,
        reload_dirs: tuple[Path, ...], **options: Any) -> None:
    """Run the workers MODULE:Worker... until SIGINT/SIGTERM, then drain and exit 0.

    Several workers share one process and event loop, each with its own options and
    concurrency (the options given here apply to every one); when one fails, all stop
    and the exit status is 1. With --processes N, a supervisor runs N such processes,
    forwards SIGINT/SIGTERM to them and restarts one that dies.

    A worker option not given keeps the worker class's attribute; the defaults shown
    are streamwork's, for a class that does not set the option."""
    processes_mod.watch_parent()  # in a --processes child: never outlive the supervisor
    logs.configure(log_level, log_format)
    if reload or reload_dirs:
        _reload(ctx, targets, reload, reload_dirs)
        return
    classes = [load_worker(target) for target in targets]
    overrides = _overrides(options)
    try:
        workers = [cls.from_url(url, **overrides) for cls in classes]  # checks the options
    except StreamworkError as exc:
        fail(str(exc))
    _check_distinct(workers)
    health = (health_host, health_port) if health_port is not None else None
    if processes > 1:
        _supervise(ctx, processes, metrics_port, health)
    else:
        _serve_here(workers, otlp, metrics_port, metrics_host, health)


def _supervise(ctx: click.Context, processes: int, metrics_port: int | None,
               health: tuple[str, int] | None) -> None:
    """`run --processes N`: run N children under a supervisor; exit 1 if one failed."""
    if metrics_port is not None and metrics_port + processes - 1 > 65535:
        fail(f"--metrics-port {metrics_port} with --processes {processes}: child i serves "
             f"on {metrics_port}+i, past 65535; give a lower --metrics-port")
    supervisor = processes_mod.ProcessSupervisor(
        _child_args(ctx), processes, metrics_port=metrics_port, health=health)
    try:
        status = supervisor.run()
    except StreamworkError as exc:
        fail(str(exc))
    if status:
        fail("a worker process failed (its error is logged above); every process was stopped")


def _reload(ctx: click.Context, targets: tuple[str, ...], reload: bool,
            reload_dirs: tuple[Path, ...]) -> None:
    """`run --reload`: a reloader runs this command line, less --reload, as a child and
    restarts it when the code changes; it imports no worker itself."""
    if not reload:
        fail("--reload-dir is an option of --reload: add --reload, or leave --reload-dir out")
    for target in targets:
        module_name, _, attr = target.partition(":")
        if not module_name or not attr:
            load_worker(target)  # refuses it with the message it has without --reload
    dirs = [d.resolve() for d in reload_dirs] or app_dirs(targets)
    try:
        status = Reloader(_child_args(ctx, _RELOADER), dirs).run()
    except StreamworkError as exc:
        fail(str(exc))
    if status:
        sys.exit(status)


def _serve_here(workers: list[StreamWorker], otlp: bool, metrics_port: int | None,
                metrics_host: str, health: tuple[str, int] | None) -> None:
    """Serve ``workers`` in this process until stopped; exit 1 if one failed."""
    try:
        shutdown = otel.configure(otlp=otel.otlp_requested(otlp), metrics_port=metrics_port,
                                  metrics_host=metrics_host)
    except StreamworkError as exc:
        fail(str(exc))
    # everything allocated at start-up (modules, config, clients) will live as long as the
    # process: move it out of the collector's sight, so full collections stay short
    # (measured: 27-41 ms gen-2 pauses at 256 jobs in flight, none with the freeze)
    gc.collect()
    gc.freeze()
    try:
        if len(workers) == 1 and health is None:
            workers[0].run()  # as before: the worker's own run() and signal handlers
        else:
            asyncio.run(serve_all(workers, health))
    except StreamworkError as exc:
        # e.g. WorkerFailed: its message says what failed and what to do next
        fail(f"{type(exc).__name__}: {exc}")
    finally:
        shutdown()


@main.command()
@url_option
@click.option("--orders", default=2000, show_default=True, help="how many orders to bill")
def demo(url: str | None, orders: int) -> None:
    """Bill a batch of orders with three workers; a private Redis is used if none answers."""
    from streamwork._cli.demo import run_demo

    result = run_demo(connection.resolve_url(url), orders)
    if not result.ok:
        sys.exit(1)


cli_dlq.register(main)
cli_ops.register(main)
cli_pause.register(main)
cli_dashboard.register(main)
cli_schedules.register(main)
cli_send.register(main)
_bench_cli.register(main)

__all__ = ["main"]
