"""What the worker's scripts get for a batch of deliveries: the columns of their
MessagePack argument, one list per field: built from the deliveries (and, for done
records, the clock, read once a batch)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgpack

from streamwork._redis import scripts
from streamwork._wire.records import done_record
from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.leases import LeaseStrategy
from streamwork._worker.core.options import CoreConfig


def beat_columns(alive: list[Delivery], loose: list[tuple[bytes, int]],
                 leases: LeaseStrategy) -> list[list[Any]]:
    """heartbeat.lua's: the held deliveries, then the entries held without one."""
    n = len(loose)
    return [[d.entry_id for d in alive] + [e for e, _ in loose],
            [d.src for d in alive] + [s for _, s in loose],
            [d.msg.key for d in alive] + [""] * n,
            [leases.value(d) for d in alive] + [""] * n,
            [d.member for d in alive] + [b""] * n,
            [leases.marked(d) for d in alive] + [""] * n,
            [_progress(d) for d in alive] + [""] * n]


def _progress(d: Delivery) -> bytes | str:
    """What a beat does with a delivery's progress record: write the report made since
    the last beat (packed), keep the one written before ("="), or nothing ("")."""
    """The progress a delivery's handler reported since its last beat, packed ("": none)."""
    p = d.msg._progress
    if p is None:
        return "=" if d.msg._progress_kept else ""
    packed: bytes = msgpack.packb(p)
    return packed


def done_columns(live: list[Delivery], cfg: CoreConfig, leases: LeaseStrategy,
                 pack: Callable[[Any], bytes]) -> list[list[Any]]:
    """complete.lua's: with job records, each job's key, lease and done record (its
    result packed by ``pack``); the members of adopted entries when there are any."""
    batch: list[list[Any]] = [[d.entry_id for d in live], [d.src for d in live]]
    if cfg.dedup:
        now = pack(int(time.time() * 1000))  # one clock read for the batch
        batch += [[d.msg.key for d in live], [leases.value(d) for d in live],
                  [d.member for d in live],
                  [done_record(d.msg.fencing_token, d.msg.attempt, d.result,
                               cfg.max_result_bytes, pack, now) for d in live]]
    elif any(d.member for d in live):
        batch += [[], [], [d.member for d in live]]
    return batch


def staged_ops(live: list[Delivery], staged_keys: list[str | bytes], first_key: int) -> bytes:
    """Encode the staged writes of a batch for complete.lua, collecting the keys they touch
    into ``staged_keys`` (which the script gets as KEYS[first_key..])."""
    ops: dict[int, list[list[Any]]] = {}
    for i, d in enumerate(live, start=1):
        for command, cmd_keys, cmd_args in d.msg.staged:
            index = []
            for key in cmd_keys:
                staged_keys.append(key)
                index.append(first_key + len(staged_keys) - 1)
            ops.setdefault(i, []).append([command, index, list(cmd_args)])
    return scripts.pack(ops) if ops else b""


def progress_written(d: Delivery, written: tuple[float, str, int] | None) -> None:
    """The beat wrote ``written`` (a delivery's ``msg.progress``): not to be written again
    unless the handler reports anew; an event on the job's span."""
    if written is None:
        return
    d.msg._progress_kept = True
    if d.msg._progress is written:
        d.msg._progress = None
    if d.span is not None:
        d.span.add_event("progress", {"streamwork.progress": written[0],
                                      "streamwork.progress.note": written[1]})
