"""Load the Lua scripts in ``lua/`` once and register them on a client (EVALSHA).

redis-py's Script objects run EVALSHA and reload on NOSCRIPT (e.g. after a server
restart), so callers never send script bodies on the hot path.

Where the server understands script flags (Redis 7+, Valkey), each worker script starts
with a ``#!lua`` line: scripts that add data are refused *whole* while Redis is out of
memory, before they write anything (so staged writes, done-markers and acks land together
or not at all), and the scripts that only extend, acknowledge or delete (heartbeat, ack,
adopt, trim, reap) carry ``allow-oom`` so live jobs stay alive and acks still free memory.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import redis
import redis.asyncio
import redis.exceptions

#: the worker/producer scripts; Redlock loads its own ``redlock_*`` files
NAMES: Final = (
    "ack", "adopt", "claim", "complete", "fail", "heartbeat", "promote", "reap", "reclaim",
    "replay", "schedule", "trim",
)
#: scripts registered from another script's file (with other flags)
_FILES: Final = {"ack": "complete"}
#: shared Lua functions prepended to the scripts that use them (Lua has no includes)
PRELUDES: Final = {name: ("lib",) for name in (
    "ack", "adopt", "claim", "complete", "fail", "heartbeat", "promote", "reclaim")}
#: script flags on servers that have them; scripts not named here get no ``#!lua`` line
FLAGS: Final = {
    "claim": "", "complete": "", "fail": "", "promote": "", "reclaim": "",
    "ack": "allow-oom", "adopt": "allow-oom", "heartbeat": "allow-oom", "reap": "allow-oom",
    "trim": "allow-oom",
}
#: a script that compiles only where the server understands flags
_PROBE: Final = "#!lua flags=no-writes\nreturn 1"


def _read(name: str) -> str:
    return (resources.files("streamwork") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def source(name: str, flags: bool = False) -> str:
    """Text of script ``name``: its ``#!lua`` line (with ``flags``), then the shared
    preludes it uses, then ``lua/<file>.lua``."""
    header = ""
    if flags and name in FLAGS:
        header = "#!lua" + (f" flags={FLAGS[name]}" if FLAGS[name] else "") + "\n"
    body = "".join(_read(lib) for lib in PRELUDES.get(name, ()))
    return header + body + _read(_FILES.get(name, name))


@dataclass(frozen=True, slots=True)
class Scripts:
    """The registered scripts of one client; each attribute is callable as
    ``script(keys=[...], args=[...])`` (awaitable on an asyncio client)."""

    ack: Any
    adopt: Any
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


def register(client: redis.Redis | redis.asyncio.Redis | Any, *, flags: bool = False) -> Scripts:
    """Register every script on ``client`` (no round trip until first use); ``flags``:
    the server understands script flags (see `supports_flags`)."""
    return Scripts(**{name: client.register_script(source(name, flags)) for name in NAMES})


async def supports_flags(client: Any) -> bool:
    """Whether the server behind an asyncio ``client`` understands ``#!lua`` flags."""
    try:
        await client.eval(_PROBE, 0)
    except redis.exceptions.ResponseError:
        return False
    return True
