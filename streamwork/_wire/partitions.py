"""Partitioned streams: stream ``S`` split into ``P`` streams spread over a Cluster's slots.

Partition ``i`` of ``P`` is the stream ``S#i.n``: ``n`` is the smallest number >= 0 for which
that name's Cluster slot (CRC16, as Redis computes it) falls in the middle half of the
``i``-th of ``P`` equal ranges of the 16384 slots (``ceil(i*w + w/4) <= slot <
floor((i+1)*w - w/4)``, ``w = 16384/P``). Each partition is its own hash tag, its keys
live in its own slot, and since ``redis-cli --cluster create`` gives each master one
contiguous range of slots (rounded to the nearest slot: the middle half keeps clear of
that rounding), the partitions spread over the masters evenly. A job goes to partition
``crc32(order_key as UTF-8) mod P`` (zlib's CRC-32, the same in every language); its
``order_key`` defaults to its ``key``. Pure, no I/O.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Sequence
from typing import Final

from redis.crc import key_slot

from streamwork._wire.keys import StreamKeys
from streamwork.errors import ConfigError

__all__ = ["MAX_PARTITIONS", "check_partitions", "check_recorded", "check_stream", "check_subset",
           "partition_names", "partition_of"]

MAX_PARTITIONS: Final = 1024
SLOTS: Final = 16384


def check_partitions(value: object, option: str = "partitions") -> int:
    """``value`` if it is a usable partition count (1 = not partitioned), else ConfigError."""
    if type(value) is not int or not 1 <= value <= MAX_PARTITIONS:
        raise ConfigError(option, f"must be an int from 1 to {MAX_PARTITIONS} (the number of "
                                  f"streams the stream is split into), got {value!r}")
    return value


def check_stream(stream: str, partitions: int) -> None:
    """Refuse a partitioned stream whose name carries a hash tag: its partitions need their
    own tags (so they spread over masters), which a tag in the name would override."""
    StreamKeys.for_stream(stream)
    if partitions > 1 and ("{" in stream or "}" in stream):
        raise ConfigError("stream", f"{stream!r}: a partitioned stream's name must not carry a "
                                    "hash tag (each partition gets its own); drop the braces")


@functools.lru_cache(maxsize=256)
def partition_names(stream: str, partitions: int) -> tuple[str, ...]:
    """The stream names of ``stream``'s partitions, in order (just ``stream`` for 1)."""
    check_partitions(partitions)
    check_stream(stream, partitions)
    if partitions == 1:
        return (stream,)
    names = []
    width = SLOTS / partitions
    for i in range(partitions):
        # the middle half of the i-th range: a master's range from redis-cli (rounded to
        # the nearest slot) holds it whole whenever the master count divides P
        low = math.ceil(i * width + width / 4)
        high = math.floor((i + 1) * width - width / 4)
        n = 0
        while not low <= key_slot(f"{stream}#{i}.{n}".encode()) < high:
            n += 1
        names.append(f"{stream}#{i}.{n}")
    return tuple(names)


def partition_of(order_key: str, partitions: int) -> int:
    """The partition (0-based) of a job with this order key."""
    if partitions == 1:
        return 0
    return zlib.crc32(order_key.encode("utf-8", "surrogatepass")) % partitions


def check_subset(subset: object, partitions: int) -> tuple[int, ...] | None:
    """``only_partitions``: None (all) or distinct partition numbers below ``partitions``."""
    if subset is None:
        return None
    if isinstance(subset, (str, bytes)) or not isinstance(subset, Sequence):
        raise ConfigError("only_partitions", f"must be a list of partition numbers, got "
                                             f"{subset!r}")
    picked = tuple(subset)
    if (not picked or len(set(picked)) != len(picked)
            or any(type(i) is not int or not 0 <= i < partitions for i in picked)):
        raise ConfigError("only_partitions", f"must be distinct ints from 0 to {partitions - 1}"
                                             f" (partitions={partitions}), got {subset!r}")
    return picked


def check_recorded(stream: str, recorded: bytes | str | None, partitions: int,
                   who: str) -> None:
    """Refuse to go on when ``stream``'s recorded partition count (``{S}:partitions``) is not
    ``partitions``: jobs would go to, or be read from, streams the others never use."""
    if recorded is None:
        return
    found = int(recorded)
    if found != partitions:
        raise ConfigError("partitions", (
            f"stream {stream!r} is split into {found} partitions (recorded in "
            f"{StreamKeys.for_stream(stream).partitions!r}) but this {who} has "
            f"partitions={partitions}: give every producer and worker of the stream the same "
            f"count. To change it, drain the stream, then delete that key."))
