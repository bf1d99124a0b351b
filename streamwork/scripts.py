"""Load the Lua scripts in ``lua/`` once and register them on a client (EVALSHA).

redis-py's Script objects run EVALSHA and reload on NOSCRIPT (e.g. after a server
restart), so callers never send script bodies on the hot path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import redis
import redis.asyncio

#: the worker/producer scripts; Redlock loads its own ``redlock_*`` files
NAMES: Final = (
    "claim", "complete", "fail", "heartbeat", "promote", "reap", "reclaim", "replay",
    "schedule", "trim",
)


#: shared Lua functions prepended to the scripts that use them (Lua has no includes)
PRELUDES: Final = {"claim": ("lib_owned",), "complete": ("lib_owned",)}


def _read(name: str) -> str:
    return (resources.files("streamwork") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def source(name: str) -> str:
    """Text of ``lua/<name>.lua``, after the shared preludes it uses."""
    return "".join(_read(lib) for lib in PRELUDES.get(name, ())) + _read(name)


@dataclass(frozen=True, slots=True)
class Scripts:
    """The registered scripts of one client; each attribute is callable as
    ``script(keys=[...], args=[...])`` (awaitable on an asyncio client)."""

    claim: Any
    complete: Any
    fail: Any
    heartbeat: Any
    promote: Any
    reap: Any
    reclaim: Any
    replay: Any
    schedule: Any
    trim: Any


def register(client: redis.Redis | redis.asyncio.Redis | Any) -> Scripts:
    """Register every script on ``client`` (no round trip until first use)."""
    return Scripts(**{name: client.register_script(source(name)) for name in NAMES})
