"""Joins (fan-in): N child jobs and one callback job that is enqueued exactly once, in the
step that records the end of the last child to end (join_lib.lua). What travels and what
is kept: a child's body carries its membership (options map field ``jn``: the callback's
stream, the join's key, the child's index, how long the join is kept), the callback's its
join's key (``jo``); the join's record and its results live under the callback stream's
hash tag (`StreamKeys.join`, `StreamKeys.join_results`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from streamwork._wire import records
from streamwork._wire.extensions import Codec, ext_hook
from streamwork._wire.job_options import SendOptions
from streamwork.errors import ConfigError, DecodeError

POLICIES: Final = ("run", "dead")  #: what a join does when a child failed (``on_failure``)
DEFAULT_TTL: Final = 7 * 86400.0  #: s a join's record and results are kept by default
MAX_CHILDREN: Final = 100_000  #: the most children one join may have
#: how a child's end counts: "done" counts as done, every other end as failed
DONE: Final = "done"


class Job:
    """A job to send as part of a join: its stream, payload, key (None: the join derives
    one, ``<join key>:<index>``, so a resend of the join sends the same keys), headers and
    job options (`Producer.send`'s: ``priority``, ``timeout``, ``order_key``, ...)."""

    __slots__ = ("headers", "key", "options", "payload", "stream")

    def __init__(self, stream: str, payload: Any, *, key: str | None = None,
                 headers: Mapping[str, str] | None = None,
                 **options: Any) -> None:
        self.stream, self.payload, self.key = stream, payload, key
        self.headers = dict(headers or {})
        self.options: SendOptions = options  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Job({self.stream!r}, {self.payload!r}, key={self.key!r})"


@dataclass(frozen=True, slots=True)
class JoinChild:
    """How one child of a join ended (``msg.join_results``): ``state`` "done" (``result``
    is what its handler returned), "dead", "cancelled" or another end a worker feature
    gave it ("expired"); ``error`` the error or reason of any end but done."""

    index: int
    key: str
    state: str
    result: Any = None
    error: str = ""

    @property
    def ok(self) -> bool:
        """Whether the child is done."""
        return self.state == DONE


@dataclass(frozen=True, slots=True)
class JoinStatus:
    """What Redis knows of a join (`Producer.join_status`): ``state`` "open" (children
    pending), "fired" (the callback was sent: ``callback_id``), "dead" (a child failed and
    the join's ``on_failure`` was "dead": the callback went to the dead letters,
    ``dead_letter_id``) or "unknown" (no such join, or it expired); counts of its
    children; times are Unix seconds."""

    stream: str
    key: str
    state: str
    total: int = 0
    done: int = 0
    failed: int = 0
    policy: str = ""
    callback_id: str | None = None
    dead_letter_id: str | None = None
    opened_at: float | None = None
    fired_at: float | None = None
    results: tuple[JoinChild, ...] = field(default=())

    @property
    def pending(self) -> int:
        """Children that have not ended yet."""
        return max(self.total - self.done - self.failed, 0)


def check_join(jobs: Sequence[Job], then: Job, on_failure: str, ttl: float) -> None:
    """Refuse a join that cannot be sent (ConfigError saying what to do)."""
    if isinstance(jobs, Job) or not isinstance(jobs, Sequence) or not jobs:
        raise ConfigError("jobs", "must be a non-empty list of sw.Job, one per child")
    if len(jobs) > MAX_CHILDREN:
        raise ConfigError("jobs", f"{len(jobs)} children: a join takes at most "
                                  f"{MAX_CHILDREN:,}; split the work into several joins")
    for j in (*jobs, then):
        if not isinstance(j, Job):
            raise ConfigError("then" if j is then else "jobs",
                              f"must be sw.Job(stream, payload, ...), got {j!r}")
    if on_failure not in POLICIES:
        raise ConfigError("on_failure", f"must be 'run' (the callback runs and sees the "
                                        f"failures) or 'dead' (it is dead-lettered), got "
                                        f"{on_failure!r}")
    if (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl)
            or ttl <= 0):
        raise ConfigError("ttl", f"must be a number of seconds > 0, got {ttl!r}")


def decode_results(raw: Mapping[bytes, bytes], codec: Codec | None = None
                   ) -> tuple[JoinChild, ...]:
    """A join's results hash (child index -> MessagePack [state, key, value]), by index."""
    out = []
    hook = ext_hook(codec, keep=True)
    for index, blob in raw.items():
        try:
            state, key, value = _child(blob, codec, hook)
        except (ValueError, TypeError, msgpack.UnpackException, DecodeError):
            state, key, value = "unreadable", "", repr(blob[:80])
        done = state == DONE
        out.append(JoinChild(int(index), str(key), str(state), value if done else None,
                             "" if done else str(value)))
    return tuple(sorted(out, key=lambda c: c.index))


def _child(blob: bytes, codec: Codec | None, hook: Any) -> tuple[str, str, Any]:
    """One result: [state, key, value], or ["record", key] followed by a done record (a
    duplicate of a child that had run: its record's result)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, unicode_errors="replace",
                                ext_hook=hook)
    unpacker.feed(blob)
    head = unpacker.unpack()
    if head[0] == "record":
        rest = blob[unpacker.tell():]
        status = records.parse("", "", head[1], rest, codec)
        return status.state, str(head[1]), status.result
    state, key, value = head
    return str(state), str(key), value


def parse_status(stream: str, key: str, raw: Mapping[bytes, bytes],
                 results: tuple[JoinChild, ...] = ()) -> JoinStatus:
    """The status a join record (HGETALL) says."""
    if not raw or b"n" not in raw:
        return JoinStatus(stream, key, "unknown", done=int(raw.get(b"done", 0)) if raw else 0,
                          failed=int(raw.get(b"failed", 0)) if raw else 0, results=results)

    def text(name: bytes) -> str | None:
        value = raw.get(name)
        return None if value is None else value.decode("utf-8", "replace")

    fired = raw.get(b"fired")
    return JoinStatus(
        stream, key, text(b"state") or "open", int(raw[b"n"]), int(raw.get(b"done", 0)),
        int(raw.get(b"failed", 0)), text(b"policy") or "", text(b"callback_id"),
        text(b"dead_letter_id"), int(raw[b"opened"]) / 1000 if b"opened" in raw else None,
        int(fired) / 1000 if fired else None, results)


def with_results(status: JoinStatus, results: tuple[JoinChild, ...]) -> JoinStatus:
    """``status`` with the children's outcomes."""
    return dataclasses.replace(status, results=results)


def done_value(key: str, result: Any, pack: Any) -> bytes:
    """What a child that is done reports: [state, key, result] packed by the worker."""
    packed: bytes = pack([DONE, key, result])
    return packed
