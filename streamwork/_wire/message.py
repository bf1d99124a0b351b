"""Message: one delivery of a job, as a handler sees it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol

from typing_extensions import TypeVar, Unpack

from streamwork._wire.job_options import NO_OPTIONS, SendManyOptions, SendOptions, to_many
from streamwork._wire.joins import JoinChild
from streamwork.errors import ConfigError, LockLost

__all__ = ["Message", "revoke"]

#: what ``Message.stage`` accepts as a key or argument (what redis-py accepts in a command)
StageValue = str | int | float | bytes | bytearray | memoryview
PROGRESS_NOTE_MAX = 200  #: longest ``Message.progress`` note, in characters


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _wire(value: object, what: str) -> bytes:
    """``value`` as the bytes redis-py's ``Encoder.encode`` would send (UTF-8 str, int and
    float by ``repr``, bytes-likes as they are), so a staged write stores exactly what
    ``client.set(k, value)`` would. Anything else raises ConfigError."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bool):  # an int subclass: redis-py refuses it too
        raise ConfigError("stage", f"{what} {value!r} is a bool, which Redis has no type for; "
                          "pass 1/0 or the string 'true'/'false' instead")
    if isinstance(value, (int, float)):
        return repr(value).encode()
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError("stage", f"{what} {_show(value)} is not encodable as UTF-8 ({exc}); "
                              "pass bytes instead") from None
    raise ConfigError("stage", f"{what} {_show(value)} has type {type(value).__name__}; pass "
                      "bytes, str, int or float (encode structured data yourself, e.g. as JSON)")


def _wire_all(values: object, what: str) -> tuple[bytes, ...]:
    """Every key (or arg) of a staged command as wire bytes."""
    if isinstance(values, (str, bytes, bytearray, memoryview)) or not isinstance(
            values, Iterable):
        raise ConfigError("stage", f"the {what}s must be a list or tuple, got "
                          f"{_show(values)}; wrap a single {what} in a list: [{_show(values)}]")
    return tuple(_wire(v, f"{what} #{i}") for i, v in enumerate(values))


#: the payload's type: what a worker's ``payload_type`` makes of it (Any when untyped)
P = TypeVar("P", default=Any)


class Lease(Protocol):
    """What holds a message's lease, as ``msg.lock_lost`` sees it (the worker's delivery)."""

    @property
    def deadline(self) -> float:
        """Monotonic time the lease runs out unless confirmed again (0.0: no lease)."""


class Sender(Protocol):
    """What stages the jobs a handler sends (``Message.send``): the worker installs one on
    each message it hands a handler."""

    def send(self, msg: Message[Any], stream: str, payloads: Sequence[Any],
             keys: Sequence[str | None], options: dict[str, Any]) -> list[str]:
        """Check and encode the jobs, stage their writes on ``msg``; their keys."""

    def send_join(self, msg: Message[Any], jobs: Sequence[Any], then: Any, key: str | None,
                  on_failure: str, ttl: float) -> str:
        """Check and encode a join, stage its writes on ``msg``; its key."""


@dataclass(slots=True, eq=False)
class Message(Generic[P]):
    """One delivery of a job.

    ``attempt`` is 1 on the first delivery and counts every delivery Redis made, including
    ones whose worker crashed, and those of earlier entries of a retried job.
    ``fencing_token`` is strictly increasing per stream when ``dedup`` is on, else None:
    pass it to the system you write to so a stale holder's write can be rejected.
    ``options`` are the job options it was sent with (``timeout`` in seconds, ``order_key``,
    ``priority``, ...), read-only, by name; those it was not sent with are absent.
    ``staged`` lists the writes staged so far, applied with the job's acknowledgement: each
    ``(command, keys, args)``, keys and args as the bytes sent to Redis (what ``stage``
    was given, and the writes of the jobs ``send`` staged). For a unit test of a handler,
    ``streamwork.testing.message()`` makes a Message that records its sends instead.
    """

    id: str
    stream: str
    key: str
    payload: P
    attempt: int
    enqueued_at: float
    headers: dict[str, str]
    fencing_token: int | None = None
    group: str = ""
    consumer: str = ""
    options: Mapping[str, Any] = field(default_factory=lambda: NO_OPTIONS)
    _lost: bool = field(default=False, repr=False)
    #: what holds its lease (the worker's delivery): its ``deadline`` is the monotonic
    #: time the lease runs out unless confirmed again (0.0, or no holder: none to judge)
    _lease: Lease | None = field(default=None, repr=False)
    _cancelled: bool = field(default=False, repr=False)
    #: the staged writes: (command, keys, args), keys and args as the bytes sent to Redis
    staged: list[tuple[str, tuple[bytes, ...], tuple[bytes, ...]]] = field(
        default_factory=list, repr=False)
    #: stages the jobs ``send`` is given (None: not a worker's message, send refuses)
    _sender: Sender | None = field(default=None, repr=False)
    #: jobs sent so far by this delivery (numbers the keys derived for jobs sent without one)
    _sent: int = field(default=0, repr=False)
    #: of those, how many went to each target stream (counted as produced on completion)
    _sent_to: dict[str, int] = field(default_factory=dict, repr=False)
    #: sends whose target's partition count was not known yet: routed, and staged, by the
    #: worker before the completion is written (no round trip in the handler)
    _deferred: list[Any] | None = field(default=None, repr=False)
    #: a join callback's results, fetched by the worker (``join_results``; None: not one)
    _join: Any = field(default=None, repr=False)
    #: the last progress reported (fraction, note, Unix ms) not written to Redis yet
    _progress: tuple[float, str, int] | None = field(default=None, repr=False)
    #: a progress record was written: each heartbeat keeps it while the job runs
    _progress_kept: bool = field(default=False, repr=False)

    def stage(self, command: str, keys: Sequence[StageValue] = (),
              args: Sequence[StageValue] = ()) -> None:
        """Stage a Redis write that is applied atomically with this job's acknowledgement
        (and done record), so it takes effect exactly once, or not at all if the job's
        outcome is not recorded (crash, lost lease, failure).

        ``keys`` come first in the command, then ``args``: ``msg.stage("HINCRBY",
        ["{orders}:totals"], ["eur", 250])``. On Redis Cluster every key must share the
        stream's hash tag (``{S}``). A command Redis rejects (e.g. WRONGTYPE) is skipped
        and logged; the job's other staged writes still apply.

        Keys and args are converted here exactly as redis-py would send them (str as UTF-8,
        int and float by ``repr``, bytes as they are), so numbers reach Redis unrounded;
        any other type (bool, None, list, dict, ...) raises ConfigError at once.
        """
        if not isinstance(command, str) or not command or not command.isascii():
            # checked here, in the handler: the outcome writer could not encode it later
            raise ValueError(f"stage(): command must be a Redis command name such as 'SET', "
                             f"got {_show(command)}")
        self.staged.append((str.__str__(command), _wire_all(keys, "key"),
                            _wire_all(args, "arg")))

    def progress(self, fraction: float, note: str = "") -> None:
        """Report how far the job got: ``fraction`` from 0.0 to 1.0 and a short ``note``
        (at most 200 characters). Costs no round trip: the worker writes the last value
        reported with its next heartbeat (so calling it often is cheap), beside the job
        record, where `Producer.status` (``progress``, ``progress_note``), ``streamwork
        job`` and the dashboard show it, kept while the job runs (a visibility timeout
        past its last heartbeat);
        each write is an event on the job's span too."""
        if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                or not 0.0 <= fraction <= 1.0):
            raise ValueError(f"progress(): fraction must be a number from 0.0 to 1.0, got "
                             f"{_show(fraction)}")
        if not isinstance(note, str) or len(note) > PROGRESS_NOTE_MAX:
            raise ValueError(f"progress(): note must be a str of at most {PROGRESS_NOTE_MAX} "
                             f"characters, got {_show(note)[:60]}")
        self._progress = (float(fraction), note, int(time.time() * 1000))

    def send(self, stream: str, payload: Any, *, key: str | None = None,
             headers: Mapping[str, str] | None = None, maxlen: int | None = None,
             partitions: int | None = None, **options: Unpack[SendOptions]) -> str:
        """Send a job to ``stream`` if and only if this job completes: the job is written
        in the same atomic step as this job's acknowledgement (or, on Redis Cluster with
        ``stream`` in another slot, into this stream's outbox in that step, from where the
        workers move it to ``stream`` once). A failure, retry, cancel or lost lease drops
        it with the staged writes. Returns the job's key.

        The options are `Producer.send`'s: ``headers``, ``maxlen`` and every job option
        (``timeout``, ``order_key``, ``priority``, ``delay``, ``at``; a name that is not
        one raises ConfigError). A target split into partitions gets the job in the
        partition `Producer.send` would choose (by ``order_key``, else ``key``), its count
        read from Redis once per target; ``partitions`` says the count (as a Producer's
        ``partitions=`` does), needed only before any partitioned worker or producer of
        the target has run. Without ``key``, the key is derived from this job's stream,
        group and key and the number of jobs it sent before, so a retried handler sends
        the same keys again. Bad input (a stream name streamwork refuses, a payload
        MessagePack cannot encode, one over ``max_payload_bytes``) raises here.
        """
        many: Any = to_many(options)
        return self.send_many(stream, [payload], keys=None if key is None else [key],
                              headers=headers, maxlen=maxlen, partitions=partitions,
                              **many)[0]

    def send_many(self, stream: str, payloads: Sequence[Any], *,
                  keys: Sequence[str] | None = None,
                  headers: Mapping[str, str] | None = None, maxlen: int | None = None,
                  partitions: int | None = None,
                  **options: Unpack[SendManyOptions]) -> list[str]:
        """`send` for several jobs (`Producer.send_many`'s options: ``order_keys`` one per
        job, the other job options for all of them): all of them are sent with this job's
        completion, or none. Returns their keys, in order."""
        if self._sender is None:
            raise ConfigError("send", "this message did not come from a worker: msg.send() "
                              "and msg.send_many() work inside a handler only")
        if isinstance(payloads, (str, bytes, Mapping)) or not isinstance(payloads, Sequence):
            raise ConfigError("payloads", f"must be a list of payloads, got {_show(payloads)}")
        if keys is not None and (isinstance(keys, str) or not isinstance(keys, Sequence)):
            raise ConfigError("keys", f"must be a list of str, got {_show(keys)}")
        if keys is not None and len(keys) != len(payloads):
            raise ConfigError("keys", f"has {len(keys)} keys for {len(payloads)} payloads")
        return self._sender.send(self, stream, payloads,
                                [None] * len(payloads) if keys is None else list(keys),
                                {"headers": headers, "maxlen": maxlen,
                                 "partitions": partitions, **options})

    def send_join(self, jobs: Sequence[Any], then: Any, *, key: str | None = None,
                  on_failure: str = "run", ttl: float = 7 * 86400.0) -> str:
        """Send a join (`Producer.send_join`'s arguments: its children ``jobs``, `sw.Job`
        each, and ``then``, the callback enqueued once when the last child ended) if and
        only if this job completes, in the same atomic step as its acknowledgement, like
        `send`. Without ``key`` (and ``then.key``) the join's key is derived from this
        job's, so a retried handler sends the same join. Returns the join's key."""
        if self._sender is None:
            raise ConfigError("send_join", "this message did not come from a worker: "
                              "msg.send_join() works inside a handler only")
        return self._sender.send_join(self, jobs, then, key, on_failure, ttl)

    async def join_results(self) -> tuple[JoinChild, ...]:
        """How each child of the join this job is the callback of ended (`JoinChild`: its
        index, key, state, result or error), in the children's order; fetched by the
        worker while it took the job (so this rarely waits). Raises ConfigError for a
        job that is not a join's callback. A plain ``def`` handler calls
        `join_results_sync` instead."""
        return await self._joined().get()  # type: ignore[no-any-return]

    def join_results_sync(self) -> tuple[JoinChild, ...]:
        """`join_results` for a plain ``def`` handler (it runs in a thread of its own)."""
        return self._joined().get_sync()  # type: ignore[no-any-return]

    def _joined(self) -> Any:
        if self._join is None:
            raise ConfigError("join_results", "this job is not the callback of a join: "
                              "only the job sent as then= of send_join has join results")
        return self._join

    @property
    def order_key(self) -> str:
        """What orders this job among others (ordered mode) and picks its partition: the
        ``order_key`` it was sent with, else its key."""
        order_key: str = self.options.get("order_key", self.key)
        return order_key

    @property
    def priority(self) -> str:
        """The level the job was sent at: "high", "normal" or "low" (kept by retries,
        dead letters and replays)."""
        priority: str = self.options.get("priority", "normal")
        return priority

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled (``producer.cancel``) while this delivery ran;
        seen at the worker's next heartbeat. Stop soon: whatever the handler does next, the
        job ends cancelled (acknowledged, not retried; a result, staged writes and chained
        sends are dropped)."""
        return self._cancelled

    @property
    def lock_lost(self) -> bool:
        """True once this delivery's lease is lost: taken over, given up by the worker, or
        run out by this machine's monotonic clock (the time the lease was last confirmed
        plus its validity, less the clock-drift margin), whether or not a heartbeat has
        come back yet. Final: it never turns false again. Another worker may take the job
        from then on: stop, and write nothing more outside ``msg.stage``."""
        lease = self._lease
        if not self._lost and lease is not None and 0 < lease.deadline <= time.monotonic():
            self._lost = True
        return self._lost

    def check(self) -> None:
        """Raise LockLost if the lease is lost (`lock_lost`); call it before each external
        write."""
        if self.lock_lost:
            raise LockLost(
                f"job {self.key!r} (entry {self.id}) lost its lease: another worker may run it "
                "now; stop and do not write",
                self.key,
            )


def revoke(msg: Message) -> None:
    """Tell a delivery's handler its job is no longer its own (lease lost, time limit
    passed): ``msg.lock_lost`` turns true and ``msg.check()`` raises LockLost."""
    msg._lost = True
