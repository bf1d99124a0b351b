"""Producer (sync, thread-safe) and AsyncProducer: enqueue jobs onto a stream.

Both are thin I/O shells over one core that does no I/O: it checks and encodes a send and
says which round trip it needs (an `_Op`); the shells perform it, the sync one blocking,
the async one awaiting. A transport failure is retried with backoff for ``retry_timeout`` seconds,
then raised as RedisUnavailable. A send retried after a lost reply may enqueue the job
twice: give jobs a ``key`` and run the worker with ``dedup`` to make that harmless.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import inspect
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar

import redis
import tenacity

from streamwork._redis import connection, scripts
from streamwork._redis.faults import is_transient
from streamwork._telemetry import api as telemetry
from streamwork._wire import records
from streamwork._wire.codec import (
    BODY_FIELD,
    DEFAULT_MAX_PAYLOAD_BYTES,
    Payload,
    check_headers,
    check_utf8,
    pack_bodies,
    pack_body,
    time_limit_ms,
)
from streamwork._wire.extensions import Codec, check_codec
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import (
    ORDER_KEY_HEADER,
    check_order_key,
    check_partitions,
    check_recorded,
    partition_names,
    partition_of,
)
from streamwork._wire.payloads import PLAIN, to_plain
from streamwork._wire.records import JobStatus
from streamwork.errors import (
    ConfigError,
    GroupNotFound,
    JobFailed,
    RedisUnavailable,
    StreamNotFound,
)

__all__ = ["AsyncProducer", "Producer"]

DEFAULT_RETRY_TIMEOUT: Final = 10.0  #: seconds a send keeps retrying while Redis is unreachable
#: most jobs one produce.lua call adds (send_many): one atomic call stays well under 2 ms of
#: Redis time (about 1 us per XADD inside Lua); or this many bytes of bodies
SEND_CHUNK: Final = 1000
SEND_CHUNK_BYTES: Final = 4 * 1024 * 1024
CANCEL_TTL: Final = 7 * 86400.0  #: seconds a cancellation is kept by default
T = TypeVar("T")


@functools.lru_cache(maxsize=1024)
def _keys(stream: str) -> StreamKeys:
    return StreamKeys.for_stream(stream)


@dataclass(frozen=True, slots=True)
class _Job:
    """One encoded job, ready to XADD (or to schedule when delayed)."""

    key: str
    body: bytes


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's headers, checked, plus the current trace context (once per send or
    batch: every job of a batch carries the same context)."""
    hdrs = check_headers(headers)
    telemetry.inject(hdrs)
    return hdrs


def new_key() -> str:
    """A random uuid4 as 32 hex digits (what ``uuid.uuid4().hex`` gives, without building
    a UUID object: this runs once per job)."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    return raw.hex()


def _prepare(payload: Payload, key: str | None, hdrs: dict[str, str], limit: int,
             now_ms: int | None = None, limit_ms: int | None = None,
             codec: Codec | None = None) -> _Job:
    job_key = new_key() if key is None else key
    enqueued = int(time.time() * 1000) if now_ms is None else now_ms
    return _Job(job_key, pack_body(job_key, payload, hdrs, enqueued, limit, limit_ms, codec))


def _due(delay: float | None, at: dt.datetime | None) -> tuple[str, str] | None:
    """Args for schedule.lua: (relative delay ms, absolute ms), or None when not delayed."""
    if delay is not None and at is not None:
        raise ConfigError("delay", "give either delay= or at=, not both")
    if delay is not None:
        if (not isinstance(delay, (int, float)) or isinstance(delay, bool)
                or not math.isfinite(delay) or delay < 0):
            raise ConfigError("delay", f"must be a finite number of seconds >= 0, got {delay!r}")
        return (str(round(delay * 1000)), "")
    if at is not None:
        if not isinstance(at, dt.datetime) or at.tzinfo is None:
            raise ConfigError("at", "must be a timezone-aware datetime, e.g. with tz=UTC")
        return ("", str(round(at.timestamp() * 1000)))
    return None


def _member(job: _Job) -> bytes:
    return b"0:" + new_key().encode() + b":" + job.body


def _check_maxlen(maxlen: object) -> None:
    if maxlen is not None and (not isinstance(maxlen, int) or isinstance(maxlen, bool)
                               or maxlen < 1):
        raise ConfigError("maxlen", f"must be None or an int >= 1 (entries kept, about), "
                                    f"got {maxlen!r}")


def _check_keys(payloads: Sequence[Payload], keys: Sequence[str] | None) -> list[str | None]:
    if keys is None:
        return [None] * len(payloads)
    if len(keys) != len(payloads):
        raise ConfigError("keys", f"has {len(keys)} keys for {len(payloads)} payloads")
    return list(keys)


def _check_options(max_payload_bytes: int, retry_timeout: float) -> None:
    if not isinstance(max_payload_bytes, int) or max_payload_bytes < 64:
        raise ConfigError("max_payload_bytes", f"must be an int >= 64, got {max_payload_bytes!r}")
    if not isinstance(retry_timeout, (int, float)) or retry_timeout < 0:
        raise ConfigError("retry_timeout", f"must be seconds >= 0, got {retry_timeout!r}")


def _ids(raw: Iterable[Any]) -> list[str]:
    ids = list(raw)
    if len(ids) == 2 and type(ids[1]) is int:  # produce.lua's [first id, count]
        return _consecutive(ids[0], ids[1])
    if ids and type(ids[0]) is bytes:  # one reply: all bytes, or all str
        # one join, decode and split for a batch (ids are ASCII, never hold a space)
        return b" ".join(ids).decode().split(" ")
    return [r.decode() if isinstance(r, bytes) else str(r) for r in ids]


def _consecutive(first: bytes | str, count: int) -> list[str]:
    """The ``count`` ids from ``first`` on, in one millisecond with consecutive sequence
    numbers: what produce.lua's XADDs made (a script's clock stands still)."""
    ms, seq = (first.decode() if isinstance(first, bytes) else first).split("-")
    start = int(seq)
    return [f"{ms}-{n}" for n in range(start, start + count)]


@dataclass(frozen=True, slots=True)
class _Op:
    """The one round trip a send needs: a script call, an XADD of one encoded body, or a
    command; ``result`` turns the reply into what the send returns (send_many's bodies
    are turned into produce.lua calls by ``_chunks``)."""

    what: str
    stream: str
    count: int
    call: scripts.Call | None = None
    bodies: Sequence[bytes] = ()
    key: str | None = None  # a delayed send returns its key
    due: tuple[str, str] | None = None  # send_many(delay=/at=): schedule.lua's timing args
    members: Sequence[bytes] = ()  # ... and the delayed ZSET members
    job_keys: Sequence[str] = ()  # ... and what it returns: the jobs' keys
    maxlen: int | None = None  # XADD MAXLEN ~ maxlen
    command: Callable[[Any], Any] | None = None  # any other round trip: client -> reply

    def result(self, reply: Any) -> Any:
        if self.key is not None:
            return self.key
        if self.job_keys:
            return list(self.job_keys)
        return _ids(reply if isinstance(reply, list) else [reply])


@dataclass(frozen=True, slots=True)
class _Planned:
    """A send_many op for one partition and where its jobs were in the caller's list
    (None: all of them, in order)."""

    op: _Op
    positions: list[int] | None


def _check_partition_option(value: object) -> int | Mapping[str, int]:
    """``partitions``: an int for every stream, or a mapping stream -> count (others: 1)."""
    if isinstance(value, Mapping):
        for stream, count in value.items():
            check_partitions(count)
            partition_names(stream, count)  # checks the name suits partitioning
        return dict(value)
    return check_partitions(value)


def _check_order_keys(order_keys: Sequence[str] | None,
                      keys: list[str]) -> list[str] | None:
    """send_many's ``order_keys``, checked; None when not given."""
    if order_keys is None:
        return None
    if len(order_keys) != len(keys):
        raise ConfigError("order_keys", f"has {len(order_keys)} order keys for {len(keys)} jobs")
    return [check_order_key(o) for o in order_keys]


class _Core:
    """What the sync and async producers share: the options and every step that does no
    I/O (checking, encoding, choosing the round trip)."""

    def __init__(
        self,
        client: Any,
        *,
        url: str = "",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
        partitions: int | Mapping[str, int] = 1,
        codec: Codec | None = None,
    ) -> None:
        _check_options(max_payload_bytes, retry_timeout)
        #: the producer's own ext types (payloads it sends, results it reads); None: the
        #: built-in ones only (Decimal, UUID, date, aware datetime)
        self.codec = check_codec(codec)
        self._redis = client
        self.url = url
        self.max_payload_bytes = max_payload_bytes
        self.retry_timeout = retry_timeout
        self.partitions = _check_partition_option(partitions)
        self._recorded: set[str] = set()  # partitioned streams whose count was checked
        self._groups_seen: set[tuple[str, str]] = set()  # (stream, group) found to exist

    def _plan_record(self, stream: str) -> _Op | None:
        """A stream's first send from this producer: a partitioned stream records its
        partition count (or finds it recorded), an unpartitioned one checks none is
        recorded; a different count is refused. None when already checked."""
        if stream in self._recorded:
            return None
        count = self.partitions_of(stream)
        key = _keys(stream).partitions
        if count == 1:
            return _Op(f"check the partitions of {stream!r}", stream, 1,
                       command=functools.partial(_get, key))
        return _Op(f"record the partitions of {stream!r}", stream, count,
                   command=lambda r: r.set(key, count, nx=True, get=True))

    def _recorded_as(self, stream: str, op: _Op, reply: Any) -> None:
        check_recorded(stream, reply, op.count, "producer")
        if len(self._recorded) >= 10_000:  # a producer of very many streams: check again
            self._recorded.clear()
        self._recorded.add(stream)

    def partitions_of(self, stream: str) -> int:
        """How many partitions ``stream`` is split into (the ``partitions`` option)."""
        p = self.partitions
        return p if isinstance(p, int) else p.get(stream, 1)

    def _target(self, stream: str, key: str, order_key: str | None) -> str:
        """The stream (partition) a job with this key and order key goes to."""
        count = self.partitions_of(stream)
        if count == 1:
            return stream
        names = partition_names(stream, count)
        return names[partition_of(key if order_key is None else order_key, count)]

    def _streams(self, stream: str) -> tuple[str, ...]:
        """Every partition of ``stream`` (just ``stream`` when it is not partitioned)."""
        return partition_names(stream, self.partitions_of(stream))

    def _plan_send(self, stream: str, payload: Payload, key: str | None,
                   headers: Mapping[str, str] | None, delay: float | None,
                   at: dt.datetime | None, timeout: float | None,
                   maxlen: int | None = None, order_key: str | None = None) -> _Op:
        _keys(stream)
        due = _due(delay, at)
        _check_maxlen(maxlen)
        hdrs = _headers(headers)
        job_key = new_key() if key is None else key
        if order_key is not None and check_order_key(order_key) != job_key:
            hdrs[ORDER_KEY_HEADER] = order_key
        target = self._target(stream, job_key, order_key)
        job = _prepare(to_plain(payload, self.codec), job_key, hdrs, self.max_payload_bytes,
                       limit_ms=time_limit_ms(timeout), codec=self.codec)
        what = f"send to {stream!r}"
        if due is not None:
            return _Op(what, target, 1, call=scripts.schedule(_keys(target), *due,
                                                              [_member(job)]), key=job.key)
        return _Op(what, target, 1, bodies=[job.body], maxlen=maxlen)

    def _plan_send_many(self, stream: str, payloads: Sequence[Payload],
                        keys: Sequence[str] | None, headers: Mapping[str, str] | None,
                        timeout: float | None, delay: float | None = None,
                        at: dt.datetime | None = None, maxlen: int | None = None,
                        order_keys: Sequence[str] | None = None) -> list[_Planned]:
        """One op per partition the jobs go to (one for an unpartitioned stream), each
        with the positions of its jobs in ``payloads``."""
        _keys(stream)
        due = _due(delay, at)
        _check_maxlen(maxlen)
        hdrs, now_ms = _headers(headers), int(time.time() * 1000)
        limit_ms = time_limit_ms(timeout)
        job_keys = [new_key() if k is None else k for k in _check_keys(payloads, keys)]
        orders = _check_order_keys(order_keys, job_keys)
        if not all(type(p) in PLAIN for p in payloads):  # instances of typed payloads
            payloads = [to_plain(p, self.codec) for p in payloads]
        count = self.partitions_of(stream)
        if orders is None:
            bodies = pack_bodies(job_keys, payloads, hdrs, now_ms, self.max_payload_bytes,
                                 limit_ms, self.codec)
        else:  # a job whose order key is not its key carries it in a header
            bodies = [pack_bodies([k], [p], hdrs if o == k else {**hdrs, ORDER_KEY_HEADER: o},
                                  now_ms, self.max_payload_bytes, limit_ms, self.codec)[0]
                      for k, p, o in zip(job_keys, payloads, orders, strict=True)]
        what = f"send_many to {stream!r}"
        if count == 1:
            groups: dict[str, list[int]] = {stream: list(range(len(bodies)))}
        else:
            names = partition_names(stream, count)
            groups = {}
            for i, o in enumerate(job_keys if orders is None else orders):
                groups.setdefault(names[partition_of(o, count)], []).append(i)
        planned = []
        for target, at_ in groups.items():
            part_bodies = bodies if len(groups) == 1 else [bodies[i] for i in at_]
            part_keys = job_keys if len(groups) == 1 else [job_keys[i] for i in at_]
            if due is not None:
                op = _Op(what, target, len(part_bodies), bodies=part_bodies, due=due,
                         members=[_member(_Job(k, b)) for k, b in zip(part_keys, part_bodies,
                                                                       strict=True)],
                         job_keys=part_keys)
            else:
                op = _Op(what, target, len(part_bodies), bodies=part_bodies, maxlen=maxlen)
            planned.append(_Planned(op, None if len(groups) == 1 else at_))
        return planned

    @staticmethod
    def _place(planned: list[_Planned], results: list[list[str]], n: int) -> list[str]:
        """The ids (or keys) of each op's jobs put back in the order the jobs were given."""
        if len(planned) == 1:
            return results[0]
        out = [""] * n
        for plan, got in zip(planned, results, strict=True):
            assert plan.positions is not None
            for i, value in zip(plan.positions, got, strict=True):
                out[i] = value
        return out

    def _chunks(self, op: _Op) -> list[_Op]:
        """``op``'s bodies as produce.lua calls of at most SEND_CHUNK jobs (or about
        SEND_CHUNK_BYTES): each one atomic, and short enough not to hold Redis up."""
        keys, bodies = _keys(op.stream), op.bodies
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
        if op.due is not None:
            return [_Op(op.what, op.stream, end - start, call=scripts.schedule(
                        keys, *op.due, op.members[start:end]), job_keys=op.job_keys[start:end])
                    for start, end in bounds]
        return [_Op(op.what, op.stream, end - start,
                    call=scripts.produce(keys, bodies[start:end], op.maxlen))
                for start, end in bounds]

    def _plan_groups(self, stream: str) -> _Op:
        _keys(stream)
        names = self._streams(stream)
        return _Op(f"list the groups of {stream!r}", stream, 1,
                   command=lambda r: _groups_of_all(r, stream, names))

    def _plan_group_check(self, stream: str, group: str) -> _Op | None:
        """The XINFO GROUPS telling whether ``group`` exists on ``stream``; None when this
        producer has seen it there already (a group is not expected to go away)."""
        return None if (stream, group) in self._groups_seen else self._plan_groups(stream)

    def _group_checked(self, stream: str, group: str, groups: Iterable[Any] | None) -> None:
        """Raise GroupNotFound when ``stream`` has consumer groups but not ``group`` (a
        typo would otherwise read as "unknown" for ever). A stream with no group at all
        (None: no stream) passes: its workers may not have started yet, and a job may be
        cancelled or waited for before they do."""
        names = _group_names(groups or ())
        if names and group not in names:
            raise GroupNotFound(stream, group, names)
        if group in names:
            if len(self._groups_seen) >= 10_000:
                self._groups_seen.clear()
            self._groups_seen.add((stream, group))

    def _plan_status(self, stream: str, key: str, group: str,
                     order_key: str | None = None) -> list[_Op]:
        """The GETs that may find job ``key``'s record: its partition's first (by its order
        key, which defaults to its key), then the other partitions'."""
        _check_key(key)
        if order_key is not None:
            check_order_key(order_key)
        names = self._streams(stream)
        home = self._target(stream, key, order_key)
        if order_key is not None:
            names = (home,)
        what = f"status of {key!r} in {stream!r}"
        return [_Op(what, name, 1, command=functools.partial(_get, _keys(name).group(group)
                                                             .job(key)))
                for name in (home, *(n for n in names if n != home))]

    def _plan_cancel(self, stream: str, key: str, group: str, reason: str,
                     order_key: str | None, ttl: float) -> list[_Op]:
        """One cancel.lua call per partition the job may be in: its own (by ``order_key``)
        when given or the stream is not partitioned, else every partition (a key sent
        with an order key of its own lives in that one's partition)."""
        _check_key(key)
        if order_key is not None:
            check_order_key(order_key)
        if not isinstance(reason, str):
            raise ConfigError("reason", f"must be a str, got {reason!r}")
        if (not isinstance(ttl, (int, float)) or isinstance(ttl, bool)
                or not math.isfinite(ttl) or ttl <= 0):
            raise ConfigError("ttl", f"must be a finite number of seconds > 0 (how long the "
                                     f"cancellation is kept), got {ttl!r}")
        names = self._streams(stream)
        if order_key is not None or len(names) == 1:
            names = (self._target(stream, key, order_key),)
        what = f"cancel {key!r} in {stream!r}"
        return [_Op(what, name, 1, call=scripts.cancel(
                    _keys(name).group(group).job(key), _keys(name).group(group).settings,
                    reason, max(1, round(ttl * 1000))))
                for name in names]

    def _unavailable(self, what: str, exc: BaseException) -> RedisUnavailable:
        return RedisUnavailable(what, self.url, exc)


def _check_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError("key", f"must be a non-empty str (the job key given to send), "
                                 f"got {key!r}")
    return check_utf8("key", key)


def _groups_of(client: Any, stream: str) -> Any:
    """XINFO GROUPS of ``stream`` (an awaitable for an async client); StreamNotFound when
    there is no such stream."""
    def missing(exc: redis.ResponseError) -> StreamNotFound:
        if "no such key" in str(exc).lower():
            return StreamNotFound(stream)
        return StreamNotFound(stream, f"is not a stream ({exc})")

    try:
        reply = client.xinfo_groups(stream)
    except redis.ResponseError as exc:
        raise missing(exc) from exc
    if not inspect.isawaitable(reply):
        return reply

    async def wait() -> Any:
        try:
            return await reply
        except redis.ResponseError as exc:
            raise missing(exc) from exc
    return wait()


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _most_telling(states: list[str]) -> str:
    """Of the states a cancel met in each partition, the one that says most (a job lives
    in one partition; the others say "unknown")."""
    return next((s for s in states if s != "unknown"), "unknown")


def _get(record: str, client: Any) -> Any:
    return client.get(record)


def _groups_of_all(client: Any, stream: str, names: tuple[str, ...]) -> Any:
    """XINFO GROUPS of every partition of ``stream``, merged by group name (an awaitable
    for an async client); StreamNotFound when no partition exists."""
    if len(names) == 1:
        return _groups_of(client, names[0])

    def merged(replies: list[Any]) -> list[Any]:
        if all(r is None for r in replies):
            raise StreamNotFound(stream)
        seen: dict[Any, Any] = {}
        for reply in replies:
            for g in reply or ():
                seen.setdefault(g["name"], g)
        return list(seen.values())

    if inspect.iscoroutinefunction(client.execute_command):
        async def wait() -> list[Any]:
            replies = []
            for name in names:
                try:
                    replies.append(await _groups_of(client, name))
                except StreamNotFound:
                    replies.append(None)
            return merged(replies)
        return wait()
    replies = []
    for name in names:
        try:
            replies.append(_groups_of(client, name))
        except StreamNotFound:
            replies.append(None)
    return merged(replies)


def _group_names(groups: Iterable[Any]) -> list[str]:
    """The names in an XINFO GROUPS reply, sorted."""
    return sorted(g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
                  for g in groups)


def _only_group(stream: str, groups: Iterable[Any]) -> str:
    """The one consumer group of ``stream``; a status needs ``group=`` when there are more."""
    names = sorted(g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"])
                   for g in groups)
    if len(names) == 1:
        return names[0]
    found = ", ".join(repr(n) for n in names) if names else "none"
    raise ConfigError("group", f"stream {stream!r} has {len(names)} consumer groups "
                               f"({found}): say which (group=... in Python, --group on the "
                               f"command line)")


class _Waits:
    """The pauses of `result()`: 5 ms doubling up to 0.5 s (or to the retry's due time),
    never past the deadline, which raises TimeoutError."""

    def __init__(self, timeout: float | None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.pause = 0.005

    def next(self, st: JobStatus) -> float:
        pause, self.pause = self.pause, min(self.pause * 2, 0.5)
        if self.deadline is None:
            return pause
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"job {st.key!r} of group {st.group!r} on {st.stream!r} did not finish "
                f"within {self.timeout} s (it is {st.state}); look with "
                f"`streamwork job {st.stream} {st.key} --group {st.group}`")
        return min(pause, left)


_RETRY = tenacity.retry_if_exception(is_transient)


class Producer(_Core):
    """Enqueue jobs from synchronous code; one instance is safe to share between threads."""

    def __init__(self, client: Any, **options: Any) -> None:
        super().__init__(client, **options)
        self._scripts = scripts.SyncScripts(client)

    @classmethod
    def from_url(cls, url: str | None = None, **options: Any) -> Producer:
        """A producer for ``url`` (default ``$REDIS_URL``, else redis://127.0.0.1:6379/0);
        ``options``: ``max_payload_bytes``, ``retry_timeout``, ``partitions`` and ``codec``
        (a `Codec`: your own types in the payloads it sends and the results it reads)."""
        resolved = connection.resolve_url(url)
        return cls(connection.sync_client(resolved), url=resolved, **options)

    def send(
        self,
        stream: str,
        payload: Payload,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float | None = None,
        at: dt.datetime | None = None,
        timeout: float | None = None,
        maxlen: int | None = None,
        order_key: str | None = None,
    ) -> str:
        """Enqueue one job and return its stream entry id.

        ``key`` is the job's identity for dedup (default: a new uuid4 hex). With ``delay``
        (seconds) or ``at`` (aware datetime) the job waits in ``{S}:delayed`` and the
        return value is its key, since its entry id is only assigned when it falls due.
        ``timeout`` (seconds) is this job's time limit, overriding the worker's ``timeout``.
        ``maxlen`` caps the stream near that many entries (``XADD MAXLEN ~``): entries
        trimmed before every group read them are lost, so prefer the workers'
        ``retention``, which trims only what all groups acknowledged. ``order_key`` picks
        the partition of a partitioned stream and orders the job among those sharing it
        in ``ordered`` mode (default: ``key``); send a key always with the same one.
        """
        with telemetry.producer_span(stream):
            op = self._plan_send(stream, payload, key, headers, delay, at, timeout, maxlen,
                                 order_key)
            if (record := self._plan_record(stream)) is not None:
                self._recorded_as(stream, record, self._perform(record))
            reply = self._perform(op)
            result: str = op.key if op.key is not None else op.result(reply)[0]
        telemetry.count("produced", 1, stream)
        return result

    def send_many(
        self,
        stream: str,
        payloads: Sequence[Payload],
        keys: Sequence[str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        delay: float | None = None,
        at: dt.datetime | None = None,
        maxlen: int | None = None,
        order_keys: Sequence[str] | None = None,
    ) -> list[str]:
        """Enqueue many jobs; returns their entry ids in order. Each chunk of up to
        SEND_CHUNK (1000) jobs is ONE script call that adds all of them or none (a pipeline
        could fail half way); a longer list is sent chunk after chunk, so a failure there
        leaves the chunks before it enqueued (their ids are lost with the exception).
        ``delay``/``at`` delay them all (one script call per chunk too) and return their
        keys instead of ids; ``maxlen`` and ``order_keys`` (one per job) as for `send`.
        On a partitioned stream each partition's jobs are sent as above, partition after
        partition: atomic per partition, in order within each."""
        with telemetry.producer_span(stream, len(payloads)):
            planned = self._plan_send_many(stream, payloads, keys, headers, timeout, delay,
                                           at, maxlen, order_keys)
        if (record := self._plan_record(stream)) is not None:
            self._recorded_as(stream, record, self._perform(record))
        results = []
        for plan in planned:
            ids: list[str] = []
            for chunk in self._chunks(plan.op):
                ids += chunk.result(self._perform(chunk))
                telemetry.count("produced", chunk.count, stream)
            results.append(ids)
        return self._place(planned, results, len(payloads))

    def status(self, stream: str, key: str, *, group: str | None = None,
               order_key: str | None = None) -> JobStatus:
        """What ``group`` knows of job ``key`` (one GET of its job record). ``group`` may be
        left out when the stream has exactly one consumer group. With dedup off no record
        is written and the state is always "unknown". On a partitioned stream the record
        is looked for in the key's partition (by ``order_key``, default the key) first,
        then, unless ``order_key`` was given, in the others. A ``group`` the stream does
        not have (while it has others) raises `GroupNotFound`, checked when no record is
        found."""
        named = group
        if group is None:
            group = _only_group(stream, self._perform(self._plan_groups(stream)))
        raw = None
        for op in self._plan_status(stream, key, group, order_key):
            raw = self._perform(op)
            if raw:
                break
        if not raw and named is not None:
            self._check_group(stream, named)
        return records.parse(stream, group, key, raw, self.codec)

    def cancel(self, stream: str, key: str, *, group: str | None = None, reason: str = "",
               order_key: str | None = None, ttl: float = CANCEL_TTL) -> str:
        """Cancel job ``key`` for ``group`` (left out: the stream's only group) and return
        the state it was in, which says what the cancel did (``CANCEL_EFFECTS``): a job
        whose handler has not started ("unknown": still in the stream, delayed or not sent
        yet; "queued": read ahead by a worker; "waiting": for a retry) will not run: its
        deliveries are acknowledged without running and its status says "cancelled"; a
        "running" one sees ``msg.cancelled`` at its worker's next heartbeat (and is
        cancelled there with ``cancel_running``) and ends cancelled whatever its handler
        does next (no retry; staged writes dropped), even if its worker dies; a "done" job
        is left alone. The cancellation is kept ``ttl`` seconds (default 7 days): a copy
        of the key arriving later is cancelled too. It lives in the job record, so a group
        whose workers run with ``dedup`` off answers "ignored" (nothing can be done). A
        ``group`` the stream does not have (while it has others) raises `GroupNotFound` and
        cancels nothing."""
        named = group

        if group is None:
            group = _only_group(stream, self._perform(self._plan_groups(stream)))
        ops = self._plan_cancel(stream, key, group, reason, order_key, ttl)
        if named is not None:  # before writing: a typo must not record a cancellation
            self._check_group(stream, named)
        states = [_text(self._perform(op)) for op in ops]
        return _most_telling(states)

    def result(self, stream: str, key: str, *, group: str | None = None,
               timeout: float | None = 30.0, order_key: str | None = None) -> Any:
        """Wait until ``group`` has finished job ``key`` and return what ``handle()``
        returned (None if it returned nothing, or the result was too large to keep:
        `status` says why). Raises `JobFailed` if the job is dead, `TimeoutError`
        if it is not finished within ``timeout`` seconds (None: wait for ever) and
        `GroupNotFound` as `status` does, and `DecodeError` (``result:invalid``) if the
        producer's codec fails to decode the result. Looks
        at the record with a growing pause (5 ms up to 0.5 s), not in a busy loop."""
        if group is None:
            group = _only_group(stream, self._perform(self._plan_groups(stream)))
        waits = _Waits(timeout)
        while True:
            st = self.status(stream, key, group=group, order_key=order_key)
            if st.state == "done":
                return st.result
            if st.state in ("dead", "cancelled"):
                raise JobFailed(st)
            pause = waits.next(st)
            time.sleep(pause)

    def _check_group(self, stream: str, group: str) -> None:
        """Raise GroupNotFound if ``stream`` has consumer groups but not ``group``."""
        if (op := self._plan_group_check(stream, group)) is None:
            return
        try:
            groups = self._perform(op)
        except StreamNotFound:
            groups = None
        self._group_checked(stream, group, groups)

    def _perform(self, op: _Op) -> Any:
        """Run ``op``, retrying transient errors for ``retry_timeout`` seconds."""
        try:
            return self._once(op)  # the usual case: no retry machinery built at all
        except Exception as exc:
            if not is_transient(exc):
                raise
        try:
            for attempt in tenacity.Retrying(
                stop=tenacity.stop_after_delay(self.retry_timeout),
                wait=connection.reconnect_wait(), retry=_RETRY, reraise=True,
            ):
                with attempt:
                    return self._once(op)
        except Exception as exc:
            if is_transient(exc):
                raise self._unavailable(op.what, exc) from exc
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, op: _Op) -> Any:
        if op.command is not None:
            return op.command(self._redis)
        if op.call is not None:
            return self._scripts.run(op.call)
        [body] = op.bodies  # send: one XADD (send_many goes through produce.lua)
        return self._redis.xadd(op.stream, {BODY_FIELD: body}, maxlen=op.maxlen,
                                approximate=True)

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncProducer(_Core):
    """Enqueue jobs from asyncio code (FastAPI, aiohttp, ...); use ``async with``."""

    def __init__(self, client: Any, **options: Any) -> None:
        super().__init__(client, **options)
        self._scripts = scripts.AsyncScripts(client)

    @classmethod
    def from_url(cls, url: str | None = None, **options: Any) -> AsyncProducer:
        """An async producer for ``url`` (default ``$REDIS_URL``, else the local default)."""
        resolved = connection.resolve_url(url)
        return cls(connection.async_client(resolved), url=resolved, **options)

    async def send(
        self,
        stream: str,
        payload: Payload,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        delay: float | None = None,
        at: dt.datetime | None = None,
        timeout: float | None = None,
        maxlen: int | None = None,
        order_key: str | None = None,
    ) -> str:
        """Enqueue one job; same arguments and result as ``Producer.send``."""
        with telemetry.producer_span(stream):
            op = self._plan_send(stream, payload, key, headers, delay, at, timeout, maxlen,
                                 order_key)
            if (record := self._plan_record(stream)) is not None:
                self._recorded_as(stream, record, await self._perform(record))
            reply = await self._perform(op)
            result: str = op.key if op.key is not None else op.result(reply)[0]
        telemetry.count("produced", 1, stream)
        return result

    async def send_many(
        self,
        stream: str,
        payloads: Sequence[Payload],
        keys: Sequence[str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        delay: float | None = None,
        at: dt.datetime | None = None,
        maxlen: int | None = None,
        order_keys: Sequence[str] | None = None,
    ) -> list[str]:
        """As `Producer.send_many`, awaiting: one atomic script call per chunk of jobs."""
        with telemetry.producer_span(stream, len(payloads)):
            planned = self._plan_send_many(stream, payloads, keys, headers, timeout, delay,
                                           at, maxlen, order_keys)
        if (record := self._plan_record(stream)) is not None:
            self._recorded_as(stream, record, await self._perform(record))
        results = []
        for plan in planned:
            ids: list[str] = []
            for chunk in self._chunks(plan.op):
                ids += chunk.result(await self._perform(chunk))
                telemetry.count("produced", chunk.count, stream)
            results.append(ids)
        return self._place(planned, results, len(payloads))

    async def status(self, stream: str, key: str, *, group: str | None = None,
                     order_key: str | None = None) -> JobStatus:
        """As `Producer.status`, awaiting."""
        named = group
        if group is None:
            group = _only_group(stream, await self._perform(self._plan_groups(stream)))
        raw = None
        for op in self._plan_status(stream, key, group, order_key):
            raw = await self._perform(op)
            if raw:
                break
        if not raw and named is not None:
            await self._check_group(stream, named)
        return records.parse(stream, group, key, raw, self.codec)

    async def cancel(self, stream: str, key: str, *, group: str | None = None,
                     reason: str = "", order_key: str | None = None,
                     ttl: float = CANCEL_TTL) -> str:
        """As `Producer.cancel`, awaiting."""
        named = group
        if group is None:
            group = _only_group(stream, await self._perform(self._plan_groups(stream)))
        ops = self._plan_cancel(stream, key, group, reason, order_key, ttl)
        if named is not None:
            await self._check_group(stream, named)
        states = [_text(await self._perform(op)) for op in ops]
        return _most_telling(states)

    async def result(self, stream: str, key: str, *, group: str | None = None,
                     timeout: float | None = 30.0, order_key: str | None = None) -> Any:
        """As `Producer.result`, awaiting (other tasks run while it waits)."""
        if group is None:
            group = _only_group(stream, await self._perform(self._plan_groups(stream)))
        waits = _Waits(timeout)
        while True:
            st = await self.status(stream, key, group=group, order_key=order_key)
            if st.state == "done":
                return st.result
            if st.state in ("dead", "cancelled"):
                raise JobFailed(st)
            await asyncio.sleep(waits.next(st))

    async def _check_group(self, stream: str, group: str) -> None:
        """As `Producer._check_group`, awaiting."""
        if (op := self._plan_group_check(stream, group)) is None:
            return
        try:
            groups = await self._perform(op)
        except StreamNotFound:
            groups = None
        self._group_checked(stream, group, groups)

    async def _perform(self, op: _Op) -> Any:
        """As `Producer._perform`, awaiting."""
        try:
            return await self._once(op)
        except Exception as exc:
            if not is_transient(exc):
                raise
        try:
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_delay(self.retry_timeout),
                wait=connection.reconnect_wait(), retry=_RETRY, reraise=True,
            ):
                with attempt:
                    return await self._once(op)
        except Exception as exc:
            if is_transient(exc):
                raise self._unavailable(op.what, exc) from exc
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(self, op: _Op) -> Any:
        if op.command is not None:
            return await op.command(self._redis)
        if op.call is not None:
            return await self._scripts.run(op.call)
        [body] = op.bodies
        return await self._redis.xadd(op.stream, {BODY_FIELD: body}, maxlen=op.maxlen,
                                      approximate=True)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
