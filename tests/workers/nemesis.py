"""The workers of the nemesis campaigns (tests/faults/test_nemesis.py), run as
``streamwork run tests.workers.nemesis:NemesisWorker`` (one server) and
``tests.workers.nemesis:NemesisOrdered`` (ordered, partitioned, on a cluster).

Dedup on; a handler's only effect on Redis is a staged write, applied atomically with the
acknowledgement, so every effect is exactly once by construction. It writes nothing to Redis
directly, so a fault on the server can only reach it through the framework.

NemesisWorker also runs under a group rate limit, a per-key concurrency cap and a schedule
(``Every(0.5)``), and every handler call appends a start and an end line to a file of its
process (``$STREAMWORK_NEMESIS_EVENTS/events-<pid>.log``, CLOCK_MONOTONIC nanoseconds, which
every process on the machine shares), so the test can see how fast jobs started and how
many of one key ran at once. Each line is one ``os.write`` to an ``O_APPEND`` file: it is in
the kernel as soon as written, so a SIGKILL loses none. Payload keys steer it: ``sleep``
(seconds in the handler), ``ck`` (its concurrency key), ``poison`` (``"raise"``: raises on
every attempt; ``"exit"``: ``os._exit(POISON_EXIT)`` on every attempt), ``final`` (also count
the job under this process's pid, so the test can see that every live process still serves).
"""

from __future__ import annotations

import asyncio
import faulthandler
import itertools
import os
import signal
import sys
import time

import streamwork as sw
from tests.workers.ordered import log_key

STREAM = GROUP = "nemesis"
LEDGER = "{nemesis}:ledger"  #: job key -> times applied (staged, same hash tag as STREAM)
SERVED_BY = "{nemesis}:final-by-pid"  #: pid -> jobs of the final batch it applied
POISON_EXIT = 42  #: exit code of a process killed by an "exit" poison job (told apart from
#: a worker that exits on its own, which `streamwork run` reports as 1)
EVENTS_ENV = "STREAMWORK_NEMESIS_EVENTS"  #: the directory of the per-process event files
RATE_LIMIT = 100.0  #: jobs/s the group may start (NemesisWorker.rate_limit)
PER_KEY = 2  #: jobs of one concurrency key in flight at once (concurrency_per_key)
TICK = sw.Every(0.5)  #: NemesisWorker's schedule; its ticks' keys start with TICK.name

ORDERED_STREAM = ORDERED_GROUP = "nemord"

#: the event loop the worker serves on (set in on_start), for the task dump below
_loop: asyncio.AbstractEventLoop | None = None


def _dump_tasks(signum: int, frame: object) -> None:
    """Print the stack of every task of the worker's event loop to the worker's log."""
    if _loop is not None:
        for task in asyncio.all_tasks(_loop):
            print(f"--- {task!r}", file=sys.stderr)
            task.print_stack(file=sys.stderr)
        sys.stderr.flush()


#: a worker that stopped serving is asked, before the test reports it, for every thread's
#: stack (SIGUSR1, printed even while the loop is blocked) and every task's (SIGUSR2, printed
#: once the loop runs Python code again)
faulthandler.register(signal.SIGUSR1, all_threads=True)
signal.signal(signal.SIGUSR2, _dump_tasks)


class _Events:
    """This process's event file: ``S <n> <key> <concurrency key> <fencing token> <ns>``
    when handler call ``n`` starts, ``E <n> <ns>`` when it ends (nothing when the process
    dies in it)."""

    def __init__(self) -> None:
        where = os.environ.get(EVENTS_ENV)
        self.fd = (None if not where else
                   os.open(os.path.join(where, f"events-{os.getpid()}.log"),
                           os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        self.calls = itertools.count()

    def start(self, key: str, concurrency_key: str, token: int | None = None) -> int:
        n = next(self.calls)
        if self.fd is not None:
            os.write(self.fd, f"S {n} {key} {concurrency_key} {token or 0} "
                              f"{time.monotonic_ns()}\n".encode())
        return n

    def end(self, n: int) -> None:
        if self.fd is not None:
            os.write(self.fd, f"E {n} {time.monotonic_ns()}\n".encode())


def _payload(msg: sw.Message) -> dict[str, object]:
    return msg.payload if isinstance(msg.payload, dict) else {}


class NemesisWorker(sw.StreamWorker):
    """Short timings, so that faults longer than a visibility timeout are cheap to make."""

    stream = STREAM
    group = GROUP
    concurrency = 4
    batch_size = 8
    visibility_timeout = 2.0
    max_deliveries = 4
    dedup = True
    dedup_window = 3600.0  # >= max_deliveries * (visibility_timeout + retry_max_delay) = 10 s
    retry_delay = 0.05
    retry_max_delay = 0.5
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 2.0
    rate_limit = f"{RATE_LIMIT:g}/s"
    concurrency_per_key = PER_KEY
    schedules = [TICK]
    #: every missed tick is enqueued late (none when a worker runs), so none may be missing
    catch_up = "all"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.events = _Events()

    async def on_start(self) -> None:
        global _loop
        _loop = asyncio.get_running_loop()

    def concurrency_key(self, msg: sw.Message) -> str:
        return str(_payload(msg).get("ck", "other"))

    async def handle(self, msg: sw.Message) -> None:
        p = _payload(msg)
        call = self.events.start(msg.key, self.concurrency_key(msg), msg.fencing_token)
        try:
            poison = p.get("poison")
            if poison == "raise":
                raise RuntimeError(f"poison job {msg.key} fails on every attempt "
                                   f"({msg.attempt})")
            if poison == "exit":
                os._exit(POISON_EXIT)
            pause = float(p.get("sleep", 0.0))  # type: ignore[arg-type]
            if pause:
                await asyncio.sleep(pause)
            msg.stage("HINCRBY", [LEDGER], [msg.key, 1])
            if p.get("final"):
                msg.stage("HINCRBY", [SERVED_BY], [str(os.getpid()), 1])
        finally:
            self.events.end(call)


class NemesisOrdered(sw.StreamWorker):
    """Ordered, 6 partitions over a cluster's masters; its effect is a staged ``RPUSH`` of
    the job's ``seq`` onto its order key's log (the order the jobs took effect in). A job
    with ``fail`` fails its first attempt (a retry in place: the key's later jobs wait)."""

    stream = ORDERED_STREAM
    group = ORDERED_GROUP
    partitions = 6
    ordered = True
    concurrency = 8
    batch_size = 20
    visibility_timeout = 2.0
    #: deliveries are counted again after every kill and failover: never dead-letter here
    max_deliveries = 100
    dedup = True
    dedup_window = 3600.0
    retry_delay = 0.02
    retry_max_delay = 0.1
    read_block = 0.1
    reclaim_interval = 0.5
    drain_timeout = 2.0

    async def handle(self, msg: sw.Message) -> None:
        p = _payload(msg)
        if p.get("fail") and msg.attempt <= 1:
            raise RuntimeError(f"{msg.key} fails on its first attempt")
        pause = float(p.get("sleep", 0.0))  # type: ignore[arg-type]
        if pause:
            await asyncio.sleep(pause)
        msg.stage("RPUSH", [log_key(msg.stream, msg.order_key)], [p["seq"]])
