"""What the Lua scripts answer: their reply codes and actions as enums, beside the scripts
(``streamwork/_redis/lua``) that return them, so a caller never compares bare numbers or
letters."""

from __future__ import annotations

import enum  # noqa: F401  (the sections below fill in)

# ---- the worker's scripts (claim, start, heartbeat, complete, fail, reclaim) ----------


# ---- the producer's scripts (produce, cancel, replay) ---------------------------------


# ---- the lock's scripts (redlock_*) ----------------------------------------------------
