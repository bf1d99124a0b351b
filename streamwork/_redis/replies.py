"""What the Lua scripts answer: their reply codes and actions as enums, beside the scripts
(``streamwork/_redis/lua``) that return them, so a caller never compares bare numbers or
letters."""

from __future__ import annotations

import enum

# ---- the worker's scripts (claim, start, heartbeat, complete, fail, reclaim) ----------


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
