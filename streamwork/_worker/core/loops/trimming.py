"""The retention trimmer's step: ``trim.lua`` called in bounded chunks until nothing older
than the cutoff is left that every group acknowledged.

One script call removes at most :data:`TRIM_CHUNK` entries (about 0.3 ms of Redis time at
~27 ns an entry), so a stream that piled up millions of trimmable entries is trimmed in
many short calls, with other clients served between them, instead of one long block.
"""

from __future__ import annotations

from typing import Final

from streamwork._redis import scripts
from streamwork._redis.scripts import AsyncScripts

TRIM_CHUNK: Final = 10_000  #: entries one trim.lua call may remove at most
#: calls one step may make (TRIM_CHUNK x this entries); the rest waits for the next round
MAX_TRIM_CALLS: Final = 2_000


async def trim_stream(registry: AsyncScripts, stream: str, cutoff_ms: int,
                      chunk: int = TRIM_CHUNK, max_calls: int = MAX_TRIM_CALLS,
                      shared_with: str | None = None) -> int:
    """Trim ``stream`` of the entries every group acknowledged that are older than
    ``cutoff_ms``, at most ``chunk`` per script call; returns how many went. ``shared_with``:
    the stream every group of which reads ``stream`` too (see trim.lua)."""
    trimmed = 0
    for _ in range(max_calls):
        removed, more = await registry.run(scripts.trim(stream, max(cutoff_ms, 0), chunk,
                                                        shared_with))
        trimmed += int(removed)
        if not int(more):
            break
    return trimmed
