"""What a worker holds: deliveries, their states, outcomes on their way to Redis, and the
small interface the background loops see of the consumer that holds them."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from streamwork._lock.redlock import AsyncHeldLock
    from streamwork._redis.scripts import AsyncScripts
    from streamwork._wire.keys import GroupKeys, StreamKeys
    from streamwork._wire.message import Message
    from streamwork._worker.config import WorkerConfig
    from streamwork._worker.done_cache import KeyCache
    from streamwork._worker.leases import Lease

#: a stream entry as Redis sends it: id and the flat [field, value, ...] list (None: the
#: entry was deleted while pending)
Entry = tuple[bytes, list[bytes] | None]

MAIN, RETRY = 0, 1  #: where a delivery came from: the stream, or the group's retry stream


def ref(src: int, entry_id: bytes) -> bytes:
    """What a worker knows a delivery by: entry ids of the two streams may be equal."""
    return entry_id if src == MAIN else b"r" + entry_id


class State(enum.IntEnum):
    """Where a held delivery is."""

    WAITING = 0  #: needs a lease first (or its job runs elsewhere right now)
    QUEUED = 1  #: may run; waits for a free runner
    RUNNING = 2  #: its handler runs
    FINISHING = 3  #: outcome decided, waiting to be written to Redis


@dataclass(slots=True, eq=False)
class Delivery:
    """A delivery this process holds, from admission until Redis has its outcome."""

    entry_id: bytes
    src: int  # MAIN or RETRY
    msg: Message
    body: bytes  # the raw body: kept to adopt an entry deleted while pending
    limit: float | None  # the job's time limit, s
    ref: bytes  # what the worker knows it by: ref(src, entry_id)
    lease: str = ""  # lease value "<owner>:<token>" when dedup is on, else ""
    deadline: float = 0.0  # monotonic time after which the lease counts as lost
    state: State = State.WAITING
    started: float = 0.0  # the loop's time (loop.time()) the handler began
    waiting_since: float = 0.0  # monotonic time its lease was first found busy
    member: bytes = b""  # adopted (entry deleted while pending): its delayed-ZSET member
    dropped: bool = False  # its outcome must not be written (lease lost, vanished)
    leasing: bool = False  # a claim for it is under way (admission or the leaser)
    timed_out: bool = False
    cancelling: bool = False  # its async handler is being cancelled (cancel_running)
    task: asyncio.Task[None] | None = None  # the runner running it (with cancel_running)
    held: AsyncHeldLock | None = None  # the Redlock lease, when leases come from lock_urls
    span: Any = None  # the delivery's OpenTelemetry span, ended when Redis has the outcome
    result: Any = None  # what handle() returned


@dataclass(slots=True)
class Failure:
    """A failed delivery (or one that can never run) on its way to fail.lua."""

    delivery: Delivery | None
    entry_id: bytes
    src: int
    action: str  # "r" retry, "d" dead letter
    delay_ms: int
    attempts: int
    reason: str
    error_type: str
    detail: str
    job_key: str = ""
    body: bytes = b""
    error: BaseException | None = None
    took_ms: float | None = None  # how long the handler ran (for the failure's log line)
    traceback: str = ""  # the error's traceback, capped (for a dead letter's log line)


class RunQueue:
    """The deliveries that may run, first in first out, for the runners: an unbounded
    ``asyncio.Queue`` without its per-item bookkeeping. A runner takes from ``ready``
    directly while it holds something and awaits ``get()`` only when it is empty.

    Wake-ups are chained: at most one parked runner is woken and not yet running at any
    time; when it takes a delivery and more are ready, it wakes the next. Handlers that
    suspend (I/O) so still get one runner each, while a batch of handlers that finish
    without suspending is run back to back by one runner, with no wake-up per job.
    Eager (with job records, where every start waits for Redis anyway), one parked runner
    is woken per ready delivery at once."""

    __slots__ = ("_getters", "eager", "ready", "waking")

    def __init__(self, eager: bool = False) -> None:
        self.ready: deque[Delivery] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self.waking = 0  # runners woken that have not taken a delivery yet
        #: wake a parked runner per ready delivery at once, not one after another: when
        #: every start waits for Redis (start.lua), the runners' starts then share a call
        self.eager = eager

    def put_many(self, ds: list[Delivery]) -> None:
        """Queue ``ds``, in order, and wake a runner for them if none is on its way."""
        self.ready.extend(ds)
        self.kick()

    def kick(self) -> None:
        """Wake one parked runner if deliveries are ready and none is on its way (eager:
        as many as there are ready deliveries)."""
        if not (self.ready and self._getters):
            return
        if not self.eager:
            if not self.waking:
                self._wake_next()
            return
        while self._getters and self.waking < len(self.ready):
            self._wake_next()

    async def get(self) -> Delivery:
        ready = self.ready
        while not ready:
            getter = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                if getter.done() and not getter.cancelled():
                    self.waking -= 1  # woken, then cancelled before it could run
                getter.cancel()
                with contextlib.suppress(ValueError):
                    self._getters.remove(getter)
                self.kick()
                raise
            self.waking -= 1
        d = ready.popleft()
        if ready:
            self.kick()
        return d

    def _wake_next(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                self.waking += 1
                break


class Holder(Protocol):
    """What the background loops (heartbeat, reclaim, outcomes, upkeep) need of the
    consumer: its settings, its scripts, and the deliveries it holds."""

    cfg: WorkerConfig
    keys: StreamKeys
    gkeys: GroupKeys
    name: str
    worker_name: str
    redis: Any
    scripts: AsyncScripts
    lease: Lease
    counts: Counter[str]
    isolating: bool
    cache: KeyCache | None  # keys completed here recently (dedup on)

    @property
    def stopping(self) -> bool: ...

    def held_deliveries(self) -> Iterable[Delivery]: ...
    def loose_ids(self) -> Iterable[tuple[bytes, int]]: ...
    def held(self) -> int: ...
    def count(self, what: str, n: int = 1, outcome: str | None = None) -> None: ...
    def lose(self, d: Delivery, why: str, error: BaseException | None = None) -> None: ...
    def cancel_running(self, d: Delivery) -> None: ...
    def cancelled_unstarted(self, d: Delivery) -> None: ...
    def vanish(self, d: Delivery, error: BaseException | None = None) -> None: ...
    def forget(self, d: Delivery, outcome: str = "lost") -> None: ...
    def forget_acked(self, ds: list[Delivery]) -> None: ...
    def release_loose(self, ref: bytes) -> None: ...
    def remember_done(self, key: str) -> None: ...
    def wake_reader(self) -> None: ...
    async def admit(self, entries: list[Entry], src: int,
                    deliveries: list[int] | None) -> None: ...
