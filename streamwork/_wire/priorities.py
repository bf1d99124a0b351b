"""Job priorities: the named levels, their checks and their streams; pure, no I/O.

Three levels, highest first: ``high``, ``normal`` (the default) and ``low``. A ``normal``
job goes onto the stream itself, so code that never names a priority sees no new key; a
``high`` or ``low`` job goes onto a sibling stream with the same hash tag
(``{orders}:p:high``), so every script still touches one Cluster slot. Every level shares
the group's job records: a key is one job whatever level it was sent at. A job sent at
another level than ``normal`` carries its level in its options (``priority``, see
``job_options``), so retries, dead letters and replays keep it.
"""

from __future__ import annotations

import functools
from typing import Final

from streamwork._wire.keys import StreamKeys
from streamwork.errors import ConfigError

LEVELS: Final = ("high", "normal", "low")  #: the priority levels, highest first
DEFAULT: Final = "normal"  #: the level of a job sent without ``priority=``
#: the levels with a stream of their own (``normal`` is the stream itself), in the order
#: the worker's scripts number them: delivery source 2 is ``high``, 3 is ``low``
SIBLINGS: Final = ("high", "low")
ORDERS: Final = ("strict", "weighted")  #: how a worker shares its reads among the levels
DEFAULT_WEIGHTS: Final = "8:2:1"  #: reads of high, normal and low per weighted round


def check_priority(value: object) -> str:
    """``value`` if it names a level, else a ConfigError listing the allowed values."""
    if isinstance(value, str) and value in LEVELS:
        return value
    raise ConfigError("priority", f"must be one of {', '.join(map(repr, LEVELS))} "
                                  f"(default {DEFAULT!r}), got {value!r}")


def level_stream(keys: StreamKeys, level: str) -> str:
    """The streams of the jobs sent at priority ``high`` and ``low`` (``normal`` ones go
    onto the stream itself): made by the first such send, read by every group of the
    stream, which shares its job records with the stream itself."""
    return keys.stream if level == DEFAULT else f"{keys.prefix}:p:{level}"


@functools.lru_cache(maxsize=1024)
def sibling_streams(keys: StreamKeys) -> tuple[str, str]:
    """The ``high`` and ``low`` streams of a stream, in SIBLINGS order (cached: every
    worker script call names them)."""
    return level_stream(keys, "high"), level_stream(keys, "low")


def parse_weights(text: object) -> dict[str, int]:
    """``priority_weights`` ("8:2:1": reads of high, normal and low per round) as a dict,
    else a ConfigError saying what is accepted."""
    parts = text.split(":") if isinstance(text, str) else []
    if len(parts) != len(LEVELS) or not all(p.strip().isdigit() and 1 <= int(p) <= 1000
                                            for p in parts):
        raise ConfigError("priority_weights", "must be three ints from 1 to 1000 for high, "
                                              f"normal and low, like '8:2:1', got {text!r}")
    return dict(zip(LEVELS, map(int, parts), strict=True))


def check_order(value: object) -> str:
    """``priority_order``: "strict" or "weighted"."""
    if value not in ORDERS:
        raise ConfigError("priority_order", f"must be 'strict' (drain higher levels first) "
                                            f"or 'weighted' (shares by priority_weights), "
                                            f"got {value!r}")
    return str(value)
