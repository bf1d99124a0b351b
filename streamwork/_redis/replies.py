"""What the Lua scripts answer: their reply codes and actions as enums, beside the scripts
(``streamwork/_redis/lua``) that return them, so a caller never compares bare numbers or
letters."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

# ---- the worker's scripts (claim, start, heartbeat, complete, fail, reclaim) ----------


class LeaseMode(enum.IntEnum):
    """Where a worker's job leases live, as start.lua, complete.lua and fail.lua read it
    (and so whether they check the lease)."""

    NONE = 0  #: no lease (dedup off)
    REDIS = 1  #: the job record in the stream's Redis is the lease
    REDLOCK = 2  #: a Redlock quorum over ``lock_urls`` holds it; the record names it


class Claim(enum.IntEnum):
    """claim.lua's answer per delivery (and a lease strategy's ``take``), besides a fencing
    token (> 0) when the lease was taken."""

    GO = 0  #: may run without a lease (dedup off) / checked only (Redlock mode)
    DUPLICATE = -1  #: its job record says done: acknowledged, skip it
    BUSY = -2  #: another holder has the lease: keep waiting
    NOT_OURS = -3  #: reclaimed by another consumer meanwhile
    CANCELLED = -4  #: its job record says cancelled: acknowledged, skip it
    UNREACHABLE = -5  #: (a lease strategy's) too few lock masters answered: let it go


class Start(enum.IntEnum):
    """start.lua's answer per delivery."""

    LOST = 0  #: not ours any more (lease or delivery taken): nothing written
    GO = 1  #: the record says running (or, for a hold, held again): go ahead
    CANCELLED = 2  #: the job was cancelled: acknowledge it without running it
    VANISHED = 4  #: neither the stream nor the group knows the entry any more


class Beat(enum.IntEnum):
    """heartbeat.lua's answer per delivery."""

    LOST = 0  #: another consumer owns it, or its lease is gone
    KEPT = 1
    DELETED = 2  #: ours, but its stream entry was deleted: adopt it
    VANISHED = 3  #: neither the stream nor the group knows it any more
    CANCELLED = 5  #: kept, and its job was cancelled meanwhile (producer.cancel)
    CANCELLED_RECORD = 6  #: the record says cancelled (before its handler started)


class Done(enum.IntEnum):
    """complete.lua's answer per delivery."""

    LOST = 0  #: not ours any more: nothing written
    ACKED = 1
    STAGED_REJECTED = 2  #: acked, but Redis rejected a staged command (others applied)
    DUPLICATE = 3  #: acked as a duplicate (the record already said done): staged writes skipped
    VANISHED = 4  #: neither the stream nor the group knows the entry: the server lost it
    CANCELLED = 5  #: acked as cancelled: its job was cancelled while it ran (nothing staged)


class FailAction(str, enum.Enum):
    """What fail.lua is asked to do with a failed delivery."""

    RETRY = "r"  #: schedule it again (on the group's retry stream)
    DEAD = "d"  #: dead-letter it
    CANCEL = "c"  #: acknowledge it as cancelled (the record says so)
    DROP = "e"  #: end it without running: acknowledged, the record says why (its reason)


class Failed(enum.IntEnum):
    """fail.lua's answer per delivery."""

    LOST = 0  #: not ours any more: nothing written
    RETRIED = 1
    DEAD = 2
    CANCELLED = 3
    VANISHED = 4
    DROPPED = 5  #: ended without running (``FailAction.DROP``)


class Reclaimed(NamedTuple):
    """reclaim.lua's answer: the XAUTOCLAIM cursor, the entries claimed (id and flat
    fields, None for one deleted while pending), the ids dead-lettered as deleted, and each
    claimed entry's delivery count."""

    cursor: Any
    entries: list[tuple[bytes, Any]]
    deleted: list[bytes]
    counts: list[Any]

    @property
    def done(self) -> bool:
        """The sweep went round: no cursor to continue from."""
        return self.cursor in (b"0-0", "0-0")

    def claimed(self) -> list[tuple[bytes, list[Any] | None]]:
        """The entries claimed, each with its fields as a list (None: deleted)."""
        return [(eid, list(flat) if flat else None) for eid, flat in self.entries]


# ---- the producer's scripts (produce, cancel, replay) ---------------------------------


class ProduceReply(enum.IntEnum):
    """Where produce.lua's short reply ``{first id, count}`` holds its parts. It answers
    so when its ids share one millisecond and run on consecutively (the usual case), else
    with every id; an integer in the second place tells the short form apart."""

    FIRST_ID = 0
    COUNT = 1


class CancelAnswer(enum.Enum):
    """What cancel.lua answers: the state the job was in (``CANCEL_EFFECTS`` says what
    the cancel did in each)."""

    UNKNOWN = "unknown"  #: no record: queued in Redis, delayed or never sent
    QUEUED = "queued"  #: read ahead by a worker, not started
    WAITING = "waiting"  #: a retry is due
    DEAD = "dead"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    IGNORED = "ignored"  #: the group keeps no job records (dedup off): nothing was done


# ---- the lock's scripts (redlock_*) ----------------------------------------------------


class LockReply(enum.IntEnum):
    """What each redlock script answers on one master (alone, or as the flag of its
    ``{flag, number}`` pair): acquire granted the lock, fence took the proposed token,
    extend reset our lock's TTL, release deleted our lock, fenced_set stored the value."""

    REFUSED = 0
    GRANTED = 1
