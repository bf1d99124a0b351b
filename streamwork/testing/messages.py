"""A `Message` for unit tests of a handler: what it stages and sends is kept on it to look
at, and its lease and cancel flags are yours to set.

A worker's message sends through the worker (``msg.send`` stages the jobs' writes with the
completion); a message built by hand has no worker behind it and refuses to send.
:func:`message` builds one whose ``send`` and ``send_many`` check their input as a worker
would (stream name, job options, payload encoding and size, the keys derived for jobs sent
without one) and record each job in ``msg.sent`` instead of staging its writes, so
``msg.staged`` holds only what the handler staged itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from streamwork._producer.core import Core
from streamwork._wire.codec import DEFAULT_MAX_PAYLOAD_BYTES
from streamwork._wire.job_options import NO_OPTIONS, check_send, check_send_many, to_many
from streamwork._wire.joins import JoinChild, check_join
from streamwork._wire.message import Message
from streamwork._worker.features.chains import MAX_SENDS, PartitionCounts, chain_key
from streamwork.errors import ConfigError

__all__ = ["MessageDouble", "SentJob", "SentJoin", "message"]


@dataclass(frozen=True, slots=True)
class SentJob:
    """One job a handler sent with ``msg.send`` / ``msg.send_many``."""

    stream: str  #: the target stream, as given
    payload: Any
    key: str  #: as given, else the key a worker derives (the same on every attempt)
    #: what it was sent with, by ``send`` keyword (``priority``, ``delay``, ``order_key``,
    #: ``headers``, ``maxlen``, ``partitions``, ...): only the options given
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SentJoin:
    """One join a handler sent with ``msg.send_join``."""

    key: str  #: as given, else the key a worker derives
    jobs: tuple[Any, ...]  #: its children, `sw.Job` each
    then: Any  #: its callback
    on_failure: str
    ttl: float


class _Results:
    """What a test callback's ``msg.join_results()`` answers."""

    def __init__(self, results: Sequence[JoinChild]) -> None:
        self.results = tuple(results)

    async def get(self) -> tuple[JoinChild, ...]:
        return self.results

    def get_sync(self) -> tuple[JoinChild, ...]:
        return self.results


class _Recorder:
    """The `Sender` of a :class:`MessageDouble`: the worker's checks, no Redis."""

    def __init__(self, max_payload_bytes: int) -> None:
        self._core = Core(None, max_payload_bytes=max_payload_bytes)

    def send(self, msg: Message[Any], stream: str, payloads: Sequence[Any],
             keys: Sequence[str | None], options: dict[str, Any]) -> list[str]:
        assert isinstance(msg, MessageDouble)
        options = dict(options)
        headers, maxlen = options.pop("headers"), options.pop("maxlen")
        given = options.pop("partitions", None)
        if not isinstance(stream, str):
            raise ConfigError("stream", f"must be the target stream's name (a str), got "
                                        f"{type(stream).__name__}")
        count = PartitionCounts.checked(stream, given)
        if msg._sent + len(payloads) > MAX_SENDS:
            raise ConfigError("send", f"one job may send at most {MAX_SENDS} jobs (they all "
                                      "travel in its completion): send a job that sends more")
        job_keys = [chain_key(msg.stream, msg.group, msg.key, msg._sent + i) if k is None
                    else k for i, k in enumerate(keys)]
        self._core.partitions = {} if count is None else {stream: count}
        self._core.plan(stream, payloads, job_keys, headers=headers, maxlen=maxlen, **options)
        shared, per_job = check_send_many(options, len(payloads))
        extra = {name: value for name, value in
                 (("headers", headers), ("maxlen", maxlen), ("partitions", given))
                 if value is not None}
        for i, (payload, key) in enumerate(zip(payloads, job_keys, strict=True)):
            own = {name: values[i] for name, values in per_job.items()}
            msg.sent.append(SentJob(stream, payload, key, {**shared, **own, **extra}))
        msg._sent += len(payloads)
        msg._sent_to[stream] = msg._sent_to.get(stream, 0) + len(payloads)
        return job_keys

    def send_join(self, msg: Message[Any], jobs: Sequence[Any], then: Any, key: str | None,
                  on_failure: str, ttl: float) -> str:
        assert isinstance(msg, MessageDouble)
        check_join(jobs, then, on_failure, ttl)
        join_key = (key if key is not None else then.key if then.key is not None
                    else chain_key(msg.stream, msg.group, msg.key, msg._sent))
        for job in (*jobs, then):  # the options and payloads checked as a worker would
            self._core.partitions = {}
            self._core.plan(job.stream, [job.payload], [job.key or join_key], job.headers or None,
                            None, **to_many(job.options))
        msg.joins.append(SentJoin(join_key, tuple(jobs), then, on_failure, ttl))
        msg._sent += len(jobs) + 1
        return join_key


@dataclass(slots=True, eq=False)
class MessageDouble(Message[Any]):
    """A `Message` made by :func:`message`: ``sent`` lists the jobs sent, ``staged`` the
    writes staged (``(command, keys, args)``, as the bytes sent to Redis), ``progressed``
    every ``progress(fraction, note)`` reported, and ``lock_lost`` and ``cancelled`` can be
    set (``check()`` raises LockLost once the lease is lost)."""

    __test__ = False  # not a test class, whatever name pytest finds it under

    sent: list[SentJob] = field(default_factory=list)
    joins: list[SentJoin] = field(default_factory=list)  #: the joins sent (send_join)
    progressed: list[tuple[float, str]] = field(default_factory=list)

    def progress(self, fraction: float, note: str = "") -> None:
        """`Message.progress` (checked the same way), each report kept in ``progressed``."""
        Message.progress(self, fraction, note)
        self.progressed.append((float(fraction), note))

    @property
    def lock_lost(self) -> bool:
        return self._lost

    @lock_lost.setter
    def lock_lost(self, value: bool) -> None:
        self._lost = bool(value)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._cancelled = bool(value)

    def staged_commands(self) -> list[tuple[str, list[str], list[str]]]:
        """``staged`` as text, for readable assertions: ``[("HINCRBY", ["totals"],
        ["eur", "250"])]`` (bytes that are not UTF-8 are shown escaped)."""
        return [(cmd, [k.decode("utf-8", "backslashreplace") for k in keys],
                 [a.decode("utf-8", "backslashreplace") for a in args])
                for cmd, keys, args in self.staged]


def message(payload: Any = None, *, key: str = "k-1", stream: str = "test", group: str = "",
            attempt: int = 1, id: str = "0-1", enqueued_at: float = 0.0,
            headers: Mapping[str, str] | None = None, fencing_token: int | None = None,
            consumer: str = "", options: Mapping[str, Any] | None = None,
            lock_lost: bool = False, cancelled: bool = False,
            max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
            join_results: Sequence[JoinChild] | None = None) -> MessageDouble:
    """A message to call a handler with in a unit test (no Redis): its ``send`` and
    ``send_many`` are checked as a worker checks them and recorded in ``.sent``; its
    ``stage`` calls in ``.staged``; ``lock_lost`` / ``cancelled`` start as given and can be
    set. ``options`` are the job options it was "sent" with (``{"priority": "high"}``),
    read by ``msg.priority`` and ``msg.order_key``. ``max_payload_bytes`` is the limit the
    sends are checked against (the worker option's default); ``join_results``: what
    ``msg.join_results()`` answers (a test of a join's callback); ``msg.joins`` records
    the joins the handler sends."""
    return MessageDouble(
        id=id, stream=stream, key=key, payload=payload, attempt=attempt,
        enqueued_at=enqueued_at, headers=dict(headers or {}), fencing_token=fencing_token,
        group=group, consumer=consumer,
        options=NO_OPTIONS if options is None else MappingProxyType(check_send(options)),
        _lost=lock_lost, _cancelled=cancelled,
        _sender=_Recorder(max_payload_bytes),
        _join=None if join_results is None else _Results(join_results))
