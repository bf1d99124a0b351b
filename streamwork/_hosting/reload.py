"""``streamwork run --reload``: restart the workers when their code changes (development).

The reloader imports no user code. It runs the same ``streamwork run`` command line, less
``--reload``, as a child process (one worker process, or a ``--processes`` supervisor),
and watches directories with `watchfiles` (the ``reload`` extra):

* A Python file changes (created, edited, deleted): one INFO line names it, the child gets
  SIGTERM, a normal graceful stop (it finishes what it holds within ``drain_timeout`` and
  hands back what it could not finish, as on any stop: nothing is lost), and once it has
  exited a new child starts with the new code. Changes made while the old child drains
  go into that same restart: the new child imports the files as they are then.
* The child exits on its own (an import error after an edit, a worker that failed): it is
  logged, and the next change starts a new one.
* SIGINT or SIGTERM to the reloader reaches the child as SIGTERM; the reloader exits 0
  when the child stopped cleanly, else 1. As under ``--processes``, the child has its own
  session (a Ctrl-C at the terminal reaches the reloader only, which forwards one
  SIGTERM) and is sent SIGTERM by the kernel if the reloader dies (Linux).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from streamwork._hosting.processes import SUPERVISOR_ENV, _how
from streamwork._telemetry.logs import fields
from streamwork.errors import StreamworkError

log = logging.getLogger("streamwork.reload")

TICK_MS: Final = 200  #: ms between looks at the child and at signals while nothing changes
MISSING: Final = ("streamwork run --reload needs the watchfiles package, which is not "
                  "installed: pip install 'streamwork[reload]' (in a checkout of "
                  "streamwork: pip install './[reload]')")


def app_dirs(targets: Iterable[str], cwd: Path | None = None) -> list[Path]:
    """The directories to watch for ``MODULE:Worker`` targets: where each target's
    top-level module is found (a package's own directory, the directory of a one-file
    module), found as ``streamwork run`` finds it (the current directory first on the
    path) but not imported; the current directory for one that is not found."""
    cwd = cwd or Path.cwd()
    found: list[Path] = []
    sys.path.insert(0, str(cwd))
    try:
        for target in targets:
            top = target.partition(":")[0].split(".")[0]
            found += _module_dirs(top) or [cwd]
    finally:
        sys.path.remove(str(cwd))
    return _outermost(found)


def _module_dirs(top: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(top) if top else None
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:  # a package (a namespace package may have several)
        return [Path(p).resolve() for p in spec.submodule_search_locations]
    if spec.origin and os.path.isfile(spec.origin):
        return [Path(spec.origin).resolve().parent]
    return []  # built in, frozen: no file of the user's to watch


def _outermost(dirs: list[Path]) -> list[Path]:
    """``dirs`` without duplicates and without those inside another one of them."""
    unique = sorted({d.resolve() for d in dirs}, key=lambda d: len(d.parts))
    kept: list[Path] = []
    for d in unique:
        if not any(d.is_relative_to(k) for k in kept):
            kept.append(d)
    return kept


def _shown(paths: list[str], cwd: Path) -> str:
    """The changed files as the reload line names them: the first one (relative to the
    current directory when under it), and how many more."""
    first = Path(paths[0])
    with contextlib.suppress(ValueError):
        first = first.relative_to(cwd)
    return str(first) + (f" (and {len(paths) - 1} more)" if len(paths) > 1 else "")


class Reloader:
    """Runs ``argv`` (a ``streamwork run`` command line without ``--reload``) as a child,
    restarting it when a Python file under ``dirs`` changes; ``run()`` returns the exit
    status."""

    def __init__(self, argv: list[str], dirs: list[Path]) -> None:
        try:
            import watchfiles
        except ImportError:
            raise StreamworkError(MISSING) from None
        self._watchfiles = watchfiles
        if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
            # its "1 change detected" would double the reload line
            logging.getLogger("watchfiles").setLevel(logging.WARNING)
        self.argv = argv
        self.dirs = dirs
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarting = False  # the child was asked to stop for a reload
        self.stopping = False  # the reloader was asked to stop
        self.status = 0
        self._signals: list[int] = []

    def run(self) -> int:
        """Start the child, restart it on changes until stopped; the exit status."""
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            log.info("watching for changes to Python files (--reload)", extra=fields(
                dirs=", ".join(map(str, self.dirs))))
            self._start()
            for changes in self._changes():
                self._step(sorted({path for _, path in changes}))
                if self.stopping and self.proc is None:
                    break
        except (OSError, RuntimeError) as exc:  # e.g. the system's limit of watched files
            raise StreamworkError(
                f"--reload could not watch {', '.join(map(str, self.dirs))} for changes: "
                f"{exc}; watch a smaller tree with --reload-dir DIR") from exc
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._end()
        return self.status

    def _changes(self) -> Iterator[set[tuple[Any, str]]]:
        """Sets of changed Python files, an empty one every TICK_MS without any."""
        return self._watchfiles.watch(
            *self.dirs, watch_filter=self._watchfiles.PythonFilter(), rust_timeout=TICK_MS,
            yield_on_timeout=True, raise_interrupt=False)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)  # only noted: the loop acts on it within TICK_MS

    def _step(self, changed: list[str]) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if not self.stopping:
                log.info("%s received: stopping the worker processes",
                         signal.Signals(sig).name)
            self.stopping = True
            self._signal(signal.SIGTERM)
        if changed and not self.stopping and not self.restarting:
            if self.proc is None:
                log.info("reloading: %s changed; starting the workers", _shown(changed, Path.cwd()))
                self._start()
            else:
                log.info("reloading: %s changed; restarting the workers (they finish what "
                         "they hold first)", _shown(changed, Path.cwd()))
                self.restarting = True
                self._signal(signal.SIGTERM)
        # while restarting, further changes go into the same restart
        if self.proc is not None and (status := self.proc.poll()) is not None:
            self._ended(status)

    def _ended(self, status: int) -> None:
        assert self.proc is not None
        pid, self.proc = self.proc.pid, None
        # SIGTERM before its handlers were installed: it had not started serving
        clean = status in (0, -signal.SIGTERM)
        if self.stopping:
            self.status = 0 if clean else 1
            (log.info if clean else log.error)("worker process exited", extra=fields(
                pid=pid, **_how(status)))
        elif self.restarting:
            self.restarting = False
            if not clean:
                log.warning("worker process exited uncleanly on the reload", extra=fields(
                    pid=pid, **_how(status)))
            self._start()
        else:
            self.status = 0 if clean else 1
            log.warning("worker process exited; it starts again on the next change",
                        extra=fields(pid=pid, **_how(status)))

    def _start(self) -> None:
        env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}  # it dies with the reloader
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamwork", "run", *self.argv],
            env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        log.debug("worker process started", extra=fields(pid=self.proc.pid))

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended just now
                os.kill(self.proc.pid, sig)

    def _end(self) -> None:
        """Leaving with a child still running (the reloader itself broke): stop it as a
        signal would, and wait for it."""
        if self.proc is not None:
            self._signal(signal.SIGTERM)
            self.proc.wait()
            self.proc = None
