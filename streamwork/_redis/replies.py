"""What the Lua scripts answer: their reply codes and actions as enums, beside the scripts
(``streamwork/_redis/lua``) that return them, so a caller never compares bare numbers or
letters."""

from __future__ import annotations

import enum

# ---- the worker's scripts (claim, start, heartbeat, complete, fail, reclaim) ----------


# ---- the producer's scripts (produce, cancel, replay) ---------------------------------


# ---- the lock's scripts (redlock_*) ----------------------------------------------------


class LockReply(enum.IntEnum):
    """What each redlock script answers on one master (alone, or as the flag of its
    ``{flag, number}`` pair): acquire granted the lock, fence took the proposed token,
    extend reset our lock's TTL, release deleted our lock, fenced_set stored the value."""

    REFUSED = 0
    GRANTED = 1
