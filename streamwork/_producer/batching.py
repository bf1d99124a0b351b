"""What a send writes, planned: the producer's job keys, the batches of bodies for each
stream and how they are cut into atomic script calls (each with its call's marker), and
how the ids of a batch's replies are read back. Used by `core`'s steps; no I/O."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from streamwork._producer.rounds import Script
from streamwork._redis import scripts
from streamwork._redis.replies import ProduceReply
from streamwork._wire.keys import StreamKeys

#: most jobs one produce.lua call adds (send_many): one atomic call stays well under 2 ms of
#: Redis time (about 1 us per XADD inside Lua); or this many bytes of bodies
SEND_CHUNK: Final = 1000
SEND_CHUNK_BYTES: Final = 4 * 1024 * 1024
#: least seconds a send's marker is kept (``{S}:sent:<token>``, a random token per call):
#: while it lives, a repeat of that call (the producer's own retry, redis-py's, or the
#: first request arriving late) stores nothing twice; kept twice the send's time bound
#: when that is longer
MIN_MARKER_TTL: Final = 60.0



def new_key() -> str:
    """A random uuid4 as 32 hex digits (what ``uuid.uuid4().hex`` gives, without building
    a UUID object: this runs once per job)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


def _member(body: bytes) -> bytes:
    """The delayed ZSET member of a job: a random prefix keeps equal bodies apart."""
    return b"0:" + new_key().encode() + b":" + body


#: the delayed ZSET member of a job, for senders other than the producer (job chains)
delayed_member = _member


def client_timeouts(client: Any) -> tuple[float, bool]:
    """(the longest one attempt of a redis-py client's may take, whether it retries on its
    own), as far as the client says: a timeout it does not give is infinite; an attempt of
    a client with retries of its own (redis-py's ``retry``) is all its tries and backoffs
    (10 s per backoff when it does not say); one that says nothing is taken to retry,
    without a bound."""
    kwargs: dict[str, Any] = {}
    getter = getattr(client, "get_connection_kwargs", None)
    try:
        kwargs = dict(getter()) if callable(getter) else {}
    except Exception:  # a cluster client, or a stand-in: nothing known
        kwargs = {}
    if not kwargs:
        return math.inf, True
    sock = kwargs.get("socket_timeout")
    conn = kwargs.get("socket_connect_timeout", sock)
    one = (math.inf if conn is None else float(conn)) + (math.inf if sock is None
                                                          else float(sock))
    retry = kwargs.get("retry")
    tries = 0 if retry is None else getattr(retry, "_retries", -1)
    if tries == 0:
        return one, False
    if tries < 0:  # retries for ever
        return math.inf, True
    cap = float(getattr(getattr(retry, "_backoff", None), "_cap", 10.0) or 0.0)
    return (tries + 1) * one + tries * cap, True


def ids(raw: Iterable[Any]) -> list[str]:
    """The entry ids in an XADD or produce.lua reply, as str."""
    got = list(raw)
    if len(got) == len(ProduceReply) and type(got[ProduceReply.COUNT]) is int:
        return _consecutive(got[ProduceReply.FIRST_ID], got[ProduceReply.COUNT])
    if got and type(got[0]) is bytes:  # one reply: all bytes, or all str
        # one join, decode and split for a batch (ids are ASCII, never hold a space)
        return b" ".join(got).decode().split(" ")
    return [r.decode() if isinstance(r, bytes) else str(r) for r in got]


def _consecutive(first: bytes | str, count: int) -> list[str]:
    """The ``count`` ids from ``first`` on, in one millisecond with consecutive sequence
    numbers: what produce.lua's XADDs made (a script's clock stands still)."""
    ms, seq = (first.decode() if isinstance(first, bytes) else first).split("-")
    start = int(seq)
    return [f"{ms}-{n}" for n in range(start, start + count)]


@dataclass(frozen=True, slots=True)
class Single:
    """A send's one round trip (send.lua, or schedule.lua when delayed; either with the
    call's marker), its job key and, when delayed, the key it returns (its entry id is
    assigned only when it falls due)."""

    request: Script
    key: str | None
    job_key: str


@dataclass(frozen=True, slots=True)
class Batch:
    """The jobs of a send_many going to one stream (partition): their encoded bodies, their
    places in the caller's list (None: all of them, in order), and for delayed jobs
    schedule.lua's timing args and the keys returned."""

    stream: str
    bodies: Sequence[bytes]
    positions: list[int] | None
    maxlen: int | None
    due: tuple[str, str] | None
    keys: Sequence[str]
    job_keys: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Chunk:
    """One atomic script call of a batch: ``count`` jobs; ``keys`` is what it returns when
    the jobs are delayed (empty: their ids, from the reply)."""

    call: scripts.Call
    count: int
    keys: Sequence[str]
    job_keys: Sequence[str]


def _chunks(batch: Batch, marker_ttl_ms: int) -> list[Chunk]:
    """``batch``'s bodies as script calls of at most SEND_CHUNK jobs (or about
    SEND_CHUNK_BYTES): each one atomic, and short enough not to hold Redis up; each with
    its marker (a random token: the call repeated, it stores nothing twice)."""
    keys, bodies, jk = StreamKeys.of_any(batch.stream), batch.bodies, batch.job_keys
    if sum(map(len, bodies)) < SEND_CHUNK_BYTES:  # the usual case: cut by count alone
        bounds = [(i, min(i + SEND_CHUNK, len(bodies)))
                  for i in range(0, len(bodies), SEND_CHUNK)]
    else:
        bounds, start, size = [], 0, 0
        for i, body in enumerate(bodies):
            size += len(body)
            if i + 1 - start >= SEND_CHUNK or size >= SEND_CHUNK_BYTES or i + 1 == len(bodies):
                bounds.append((start, i + 1))
                start, size = i + 1, 0
    if batch.due is not None:
        return [Chunk(scripts.schedule(keys, *batch.due, [_member(b) for b in bodies[start:end]],
                                       keys.sent(new_key()), marker_ttl_ms),
                      end - start, batch.keys[start:end], jk[start:end])
                for start, end in bounds]
    return [Chunk(scripts.produce(keys, bodies[start:end], batch.maxlen, keys.sent(new_key()),
                                  marker_ttl_ms), end - start, (), jk[start:end])
            for start, end in bounds]


def _place(batches: list[Batch], results: list[list[str]], n: int) -> list[str]:
    """The ids (or keys) of each batch's jobs put back in the order the jobs were given."""
    if len(batches) == 1:
        return results[0]
    out = [""] * n
    for batch, got in zip(batches, results, strict=True):
        assert batch.positions is not None
        for i, value in zip(batch.positions, got, strict=True):
            out[i] = value
    return out
