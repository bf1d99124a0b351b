"""What the nemesis campaigns (tests/faults/test_nemesis.py, test_nemesis_cluster.py) share:
a supervisor that keeps worker processes running and records how each one ended, the loop
that draws the nemesis's actions from a seeded generator, the readers of the workers' event
files with the checkers built on them (start rate, jobs of one key in flight), and the
figures each campaign prints and writes as JSON.

Adding a kind of fault or a checker (e.g. cancels): an action is a function
``(random.Random) -> str | None`` (what it did, for the action log; None: nothing to do)
registered with a weight in a campaign's ``actions``; a checker is a function of the
campaign's evidence returning problems, listed in that campaign's ``CHECKS``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from tests.workers.nemesis import EVENTS_ENV, POISON_EXIT

T = TypeVar("T")

TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
             redis.exceptions.BusyLoadingError, redis.exceptions.ClusterDownError,
             redis.exceptions.TryAgainError, OSError)


def retrying(fn: Callable[[], T], timeout: float = 30.0) -> T:
    """Run an admin call against a server that may be restarting right now."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except TRANSIENT:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def safe(fn: Callable[[], T], default: T) -> T:
    """A look for wait_for: ``default`` while the server cannot answer it."""
    try:
        return fn()
    except (redis.exceptions.RedisError, OSError):
        return default


@dataclass
class Exit:
    at: float  # s since the campaign's t0
    pid: int
    code: int
    why: str  # "nemesis" | "poison" | "ON ITS OWN"
    log: Path


class Supervisor:
    """Keeps ``n`` worker processes of ``target`` running: a dead one is replaced after
    ``restart_delay``. Records every exit, when (CLOCK_MONOTONIC), and whether the nemesis or
    a poison job caused it; the workers write their event files into ``events``. ``url``
    may be a function: each worker gets the URL it returns when started."""

    def __init__(self, spawn: Callable[..., subprocess.Popen[bytes]], target: str,
                 url: str | Callable[[], str], logdir: Path, t0: float, *,
                 args: Iterable[str] = (), restart_delay: float = 0.3) -> None:
        self.spawn_worker, self.target, self.url, self.t0 = spawn, target, url, t0
        self.logdir, self.args, self.restart_delay = logdir, list(args), restart_delay
        self.events = logdir / "events"
        self.events.mkdir(exist_ok=True)
        self.lock = threading.Lock()
        self.slots: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self.urls: dict[int, str] = {}  # pid -> the URL it was started with
        self.killed: dict[int, float] = {}  # pid -> when the nemesis sent it SIGKILL
        self.died: dict[int, float] = {}  # pid -> when its exit was seen
        #: pid -> its SIGSTOP..SIGCONT windows, and its network partitions (cut..heal)
        self.stops: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.exits: list[Exit] = []
        self.spawned = 0
        self._dead_since: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)
        self.error: BaseException | None = None

    def start(self, n: int) -> None:
        with self.lock:
            self.slots = [self._spawn() for _ in range(n)]
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _spawn(self) -> subprocess.Popen[bytes]:
        path = self.logdir / f"worker-{self.spawned}.log"
        self.spawned += 1
        with path.open("wb") as out:
            url = self.url if isinstance(self.url, str) else self.url()
            proc = self.spawn_worker(self.target, url, *self.args, stdout=out,
                                     env={EVENTS_ENV: str(self.events)})
        self.logs[proc.pid] = path
        self.urls[proc.pid] = url
        return proc

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.05):
                with self.lock:
                    self._look()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _look(self) -> None:
        now = time.monotonic()
        for i, proc in enumerate(self.slots):
            code = proc.poll()
            if code is None:
                continue
            if i not in self._dead_since:
                self._dead_since[i] = now
                self.died[proc.pid] = now
                if code == -signal.SIGKILL and proc.pid in self.killed:
                    why = "nemesis"
                elif code == POISON_EXIT:
                    why = "poison"
                else:
                    why = "ON ITS OWN"
                self.exits.append(Exit(now - self.t0, proc.pid, code, why, self.logs[proc.pid]))
            elif now - self._dead_since[i] >= self.restart_delay:
                del self._dead_since[i]
                self.slots[i] = self._spawn()

    def signal(self, slot: int, sig: signal.Signals) -> int | None:
        """Send ``sig`` to the worker in ``slot`` if it is alive; its pid, or None."""
        with self.lock:
            proc = self.slots[slot]
            if proc.poll() is not None:
                return None
            if sig == signal.SIGKILL:
                self.killed[proc.pid] = time.monotonic()  # before: nothing it writes is later
            os.kill(proc.pid, sig)
            return proc.pid

    def stall(self, slot: int, seconds: float, stop: threading.Event) -> int | None:
        """SIGSTOP the worker in ``slot`` for ``seconds`` (less if ``stop`` is set), then
        SIGCONT it; its pid, or None if no worker was alive there. The window recorded is
        from just before the SIGSTOP to just before the SIGCONT: nothing the process writes
        falls inside it unless it wrote it as it was being stopped."""
        with self.lock:
            proc = self.slots[slot]
            if proc.poll() is not None:
                return None
            began = time.monotonic()
            os.kill(proc.pid, signal.SIGSTOP)
        try:
            stop.wait(seconds)
        finally:
            resumed = time.monotonic()
            # a SIGKILL meanwhile (the nemesis may kill a stopped worker) and the supervisor
            # reaping it leave no process to continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            self.stops[proc.pid].append((began, resumed))
        return proc.pid

    def alive_pid(self, slot: int) -> int | None:
        """The pid of the worker in ``slot`` if it is alive, else None."""
        with self.lock:
            proc = self.slots[slot]
            return proc.pid if proc.poll() is None else None

    def live(self) -> list[subprocess.Popen[bytes]]:
        with self.lock:
            return [p for p in self.slots if p.poll() is None]

    def unexpected_exits(self) -> list[Exit]:
        with self.lock:
            return [e for e in self.exits if e.why == "ON ITS OWN"]

    def death(self, pid: int) -> float:
        """When ``pid`` stopped running anything: the nemesis's SIGKILL, else when its exit
        was seen; inf while it lives."""
        return self.killed.get(pid, self.died.get(pid, math.inf))


#: a nemesis action: does one fault (its draws from the generator it is given) and says what
#: it did for the action log, or returns None when there was nothing to do it to
Action = Callable[[random.Random], "str | None"]


@dataclass
class Faults:
    """The action log and the count of faults injected, by kind."""

    t0: float = field(default_factory=time.monotonic)
    log: list[str] = field(default_factory=list)
    done: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)

    def note(self, what: str) -> None:
        self.log.append(f"{time.monotonic() - self.t0:7.2f}s  {what}")


def run_nemesis(actions: dict[str, tuple[int, Action]], seed: int, seconds: float,
                faults: Faults, stop: threading.Event, errors: list[str],
                quiet: tuple[float, float] = (0.5, 2.5),
                first: tuple[float, str] | None = None) -> None:
    """Draw actions by weight from ``random.Random(seed)`` until ``seconds`` have passed
    since ``faults.t0`` (or ``stop`` is set), with a quiet pause between two; every random
    draw comes from the seed. ``first``: (at s, action) forces that action once, at that
    time, if the draws have not done it by then."""
    rnd = random.Random(seed)
    names = list(actions)
    weights = [actions[n][0] for n in names]
    try:
        while time.monotonic() - faults.t0 < seconds and not stop.is_set():
            name = rnd.choices(names, weights)[0]
            if first is not None and not faults.done[first[1]] \
                    and time.monotonic() - faults.t0 >= first[0]:
                name = first[1]
            what = actions[name][1](rnd)
            if what is None:
                faults.skipped[name] += 1
                faults.note(f"{name}: nothing to do it to, skipped")
            else:
                faults.done[name] += 1
                faults.note(what)
            stop.wait(rnd.uniform(*quiet))
    except BaseException as exc:  # reported by the main thread
        errors.append(f"nemesis died: {exc!r}")


def diagnose(pid: int, log: Path | None) -> str:
    """What a live worker that stopped serving is doing: its scheduler state and kernel wait
    channel, then the stacks of its threads (SIGUSR1) and of its event loop's tasks
    (SIGUSR2), which tests/workers/nemesis.py prints to its log; the log's last lines."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        state = next((line for line in status.splitlines() if line.startswith("State:")), "?")
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        state, wchan = f"unreadable ({exc})", "?"
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
    time.sleep(2.0)  # let it write the stacks (not an assertion)
    tail = log.read_text(errors="replace")[-12000:] if log is not None and log.exists() else ""
    return f"pid {pid}: {state}, wchan {wchan}\n{tail}"


# ---- the workers' event files ------------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One handler call, as its process's event file tells it (CLOCK_MONOTONIC seconds)."""

    pid: int
    key: str
    concurrency_key: str
    start: float
    end: float | None  # None: its process died in it
    token: int = 0  # the fencing token of the lease it ran under (0: not logged)


def read_calls(directory: Path) -> list[Call]:
    """Every handler call recorded in ``directory``'s event files."""
    calls = []
    for path in sorted(directory.glob("events-*.log")):
        pid = int(path.stem.split("-")[1])
        starts: dict[str, tuple[str, str, float, int]] = {}
        ends: dict[str, float] = {}
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if parts[0] == "S" and len(parts) == 5:  # S <n> <key> <ck> <ns>
                starts[parts[1]] = (parts[2], parts[3], int(parts[4]) / 1e9, 0)
            elif parts[0] == "S" and len(parts) == 6:  # S <n> <key> <ck> <token> <ns>
                starts[parts[1]] = (parts[2], parts[3], int(parts[5]) / 1e9, int(parts[4]))
            elif parts[0] == "E" and len(parts) == 3:
                ends[parts[1]] = int(parts[2]) / 1e9
        calls += [Call(pid, key, ck, start, ends.get(n), token)
                  for n, (key, ck, start, token) in starts.items()]
    return calls


def max_starts_per_window(starts: list[float], window: float = 1.0) -> tuple[int, float]:
    """The most starts in any half-open window of ``window`` seconds, and where it begins
    (the busiest window always begins at a start)."""
    starts = sorted(starts)
    best, at, lo = 0, 0.0, 0
    for hi, t in enumerate(starts):
        while starts[lo] <= t - window:
            lo += 1
        if hi - lo + 1 > best:
            best, at = hi - lo + 1, starts[lo]
    return best, at


def in_flight(call: Call, sup: Supervisor) -> tuple[float, float]:
    """The time ``call``'s handler held its job: from its start to its end, or to its
    process's death when it has none; cut at the start of a SIGSTOP (or a network partition)
    of its process that it overlaps (stopped or cut off longer than a visibility timeout,
    the process's holds lapse and its job is someone else's: what it does after SIGCONT or
    the heal is the documented case of a paused worker, not a second holder)."""
    end = call.end if call.end is not None else sup.death(call.pid)
    for began, resumed in sup.stops.get(call.pid, ()):
        if call.start <= resumed and end >= began:
            end = max(call.start, min(end, began))
            break
    return call.start, end


@dataclass
class Crowd:
    """The most handler calls of one concurrency key in flight at once."""

    most: int
    key: str
    at: float
    calls: list[Call]


def most_in_flight(calls: list[Call], sup: Supervisor) -> dict[str, Crowd]:
    """Per concurrency key, the most calls in flight at once (`in_flight` spans; one that
    ends at the instant another starts is not counted with it)."""
    by_key: dict[str, list[tuple[float, float, Call]]] = defaultdict(list)
    for call in calls:
        start, end = in_flight(call, sup)
        if end > start:  # cut to nothing (begun as its process was cut off): not in flight;
            # counted, its end would sort before its start and it would stay in flight
            by_key[call.concurrency_key].append((start, end, call))
    out: dict[str, Crowd] = {}
    for key, spans in by_key.items():
        points = sorted([(s, 1, i) for i, (s, _, _) in enumerate(spans)]
                        + [(e, 0, i) for i, (_, e, _) in enumerate(spans)])
        now: set[int] = set()
        crowd = Crowd(0, key, 0.0, [])
        for t, starting, i in points:
            if starting:
                now.add(i)
                if len(now) > crowd.most:
                    crowd = Crowd(len(now), key, t, [spans[j][2] for j in sorted(now)])
            else:
                now.discard(i)
        out[key] = crowd
    return out


# ---- figures -------------------------------------------------------------------------------

def publish(name: str, seed: int, figures: dict[str, Any]) -> Path:
    """Print the campaign's figures (seen with ``pytest -s``) and write them as JSON to
    ``$STREAMWORK_NEMESIS_REPORT_DIR`` (default: the temp dir); return the file."""
    where = Path(os.environ.get("STREAMWORK_NEMESIS_REPORT_DIR", tempfile.gettempdir()))
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"streamwork-nemesis-{name}-{seed}.json"
    path.write_text(json.dumps(figures, indent=2, sort_keys=True, default=str) + "\n")
    shown = " ".join(f"{k}={json.dumps(v, default=str, separators=(',', ':'))}"
                     for k, v in figures.items())
    print(f"\nnemesis {name}: {shown}\nnemesis {name}: figures written to {path}")
    return path
