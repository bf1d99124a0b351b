"""What a worker holds: deliveries and their states."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from streamwork._lock.redlock import AsyncHeldLock
    from streamwork._wire.message import Message

#: a stream entry as Redis sends it: id and the flat [field, value, ...] list (None: the
#: entry was deleted while pending)
Entry = tuple[bytes, list[bytes] | None]

#: the consumer's admission: a batch of entries, where from (MAIN or RETRY), and each one's
#: delivery count (None: all first deliveries)
Admit = Callable[[list[Entry], int, "list[int] | None"], Awaitable[None]]

#: where a delivery came from (its source): the stream, the group's retry stream, or one
#: of the two streams a feature may add (sources 2 and 3; see sources.py)
MAIN, RETRY = 0, 1
EXTRA_SOURCES: Final = (2, 3)
_REF: tuple[bytes, ...] = (b"", b"r", b"h", b"l")


def ref(src: int, entry_id: bytes) -> bytes:
    """What a worker knows a delivery by: entry ids of the streams may be equal."""
    return entry_id if src == MAIN else _REF[src] + entry_id


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
    src: int  # its source: MAIN, RETRY or an extra source (sources.py)
    msg: Message
    body: bytes  # the raw body: kept to adopt an entry deleted while pending
    limit: float | None  # the job's time limit, s
    ref: bytes  # what the worker knows it by: ref(src, entry_id)
    lease_id: str = ""  # "<owner>:<token>", what the job record names (dedup on), else ""
    deadline: float = 0.0  # monotonic time after which the lease counts as lost
    state: State = State.WAITING
    started: float = 0.0  # the loop's time (loop.time()) the handler began
    waiting_since: float = 0.0  # monotonic time its lease was first found busy
    member: bytes = b""  # adopted (entry deleted while pending): its delayed-ZSET member
    dropped: bool = False  # its outcome must not be written (lease lost, vanished)
    leasing: bool = False  # a claim for it is under way (admission or the leaser)
    admitted: bool = False  # the features' before_start hooks ran for it (start.py)
    timed_out: bool = False
    cancelling: bool = False  # its async handler is being cancelled (cancel_running)
    task: asyncio.Task[None] | None = None  # the runner running it (with cancel_running)
    grant: AsyncHeldLock | None = None  # the Redlock grant, when leases come from lock_urls
    span: Any = None  # the delivery's OpenTelemetry span, ended when Redis has the outcome
    start_code: int | Exception | None = None  # start.lua's answer, if started before a runner
    result: Any = None  # what handle() returned
    count: int = 1  # its delivery count (the group's) when this process took it
