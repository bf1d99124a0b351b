"""Sending, without I/O: the producer's options, and `send` / `send_many` as steps
(generators yielding the round trips they need, see `rounds`) that check and encode the
jobs, choose each one's partition, and read the replies. The shells in `shells` perform
the round trips.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from streamwork._producer.batching import (
    MIN_MARKER_TTL,
    Batch,
    Single,
    _chunks,
    _member,
    _place,
    client_timeouts,
    ids,
    new_key,
)
from streamwork._producer.rounds import (
    Budget,
    Command,
    Get,
    Script,
    SetIfMissing,
    Steps,
    Tally,
    attempt,
)
from streamwork._redis import scripts
from streamwork._telemetry import api as telemetry
from streamwork._wire.codec import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Payload,
    check_headers,
    pack_bodies,
    pack_body,
)
from streamwork._wire.extensions import Codec, check_codec
from streamwork._wire.job_options import check_send, check_send_many, wire_map
from streamwork._wire.keys import StreamKeys
from streamwork._wire.partitions import (
    check_partitions,
    check_recorded,
    partition_names,
    partition_of,
)
from streamwork._wire.payloads import PLAIN, to_plain
from streamwork._wire.priorities import DEFAULT, level_stream
from streamwork.errors import ConfigError, RedisUnavailable, SendFailed

DEFAULT_RETRY_TIMEOUT: Final = 10.0  #: seconds a send keeps retrying while Redis is unreachable
@functools.lru_cache(maxsize=1024)
def keys_of(stream: str) -> StreamKeys:
    """The keys of ``stream`` (checking its name), cached: a producer sends to few streams."""
    return StreamKeys.for_stream(stream)


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's headers, checked, plus the current trace context (once per send or
    batch: every job of a batch carries the same context)."""
    hdrs = check_headers(headers)
    telemetry.inject(hdrs)
    return hdrs


def _due(options: dict[str, Any]) -> tuple[str, str] | None:
    """Args for schedule.lua: (relative delay ms, absolute ms), or None when not delayed;
    ``options`` checked (`job_options`), by name."""
    delay, at = options.get("delay"), options.get("at")
    if delay is not None and at is not None:
        raise ConfigError("delay", "give either delay= or at=, not both")
    if delay is not None:
        return (str(round(delay * 1000)), "")
    if at is not None:
        return ("", str(round(at.timestamp() * 1000)))
    return None


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


def _check_partition_option(value: object) -> int | Mapping[str, int]:
    """``partitions``: an int for every stream, or a mapping stream -> count (others: 1)."""
    if isinstance(value, Mapping):
        for stream, count in value.items():
            check_partitions(count)
            partition_names(stream, count)  # checks the name suits partitioning
        return dict(value)
    return check_partitions(value)


class Core:
    """What the sync and async producers share: the options, the state learned from Redis,
    and the steps of sending."""

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
        one, self._blind_retries = client_timeouts(client)
        #: the longest a send blocks while Redis does not answer: its first attempt, the
        #: retries for ``retry_timeout``, and one more attempt (each at most the client's
        #: connect and socket timeouts, times its own tries if it makes any); infinite for
        #: a client without timeouts
        self.send_bound = retry_timeout + 2 * one
        #: how long a send's marker is kept, in ms
        self.marker_ttl_ms = round(1000 * (max(MIN_MARKER_TTL, 2 * self.send_bound)
                                           if math.isfinite(self.send_bound)
                                           else 5 * MIN_MARKER_TTL))

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

    def _level(self, stream: str, options: dict[str, Any],
               due: tuple[str, str] | None) -> str:
        """The job's priority level (checked in ``options``), which it carries when not
        normal. Delayed jobs and partitioned streams have the normal level only (for now)."""
        priority: str = options.get("priority", DEFAULT)
        if priority == DEFAULT:
            return priority
        if due is not None:
            raise ConfigError("priority", "delayed jobs (delay=/at=) are sent at the normal "
                                          "level only; drop priority= or the delay")
        if self.partitions_of(stream) > 1:
            raise ConfigError("priority", f"{stream!r} is partitioned: its jobs are sent at "
                                          "the normal level only; drop priority=")
        return priority

    def _io(self, what: str, request: Command, tally: Tally | None = None,
            budget: Budget | None = None) -> Steps[Any]:
        """One round trip, retried while Redis is unreachable (``what`` names it then)."""
        return attempt(request, what, self.url, self.retry_timeout, tally, budget)

    def _before_write(self, what: str, stream: str, keys: Sequence[str],
                      budget: Budget) -> Steps[None]:
        """What a send reads before it writes (`_check_recorded`); Redis not answering
        there raises SendFailed with outcome "not stored": nothing was written yet."""
        began = time.monotonic()
        try:
            yield from self._check_recorded(stream, budget)
        except RedisUnavailable as exc:
            raise SendFailed(what, self.url, exc.__cause__, stream=stream,
                             outcome="not stored", keys=list(keys),
                             waited=time.monotonic() - began) from exc.__cause__

    def _write(self, what: str, stream: str, request: Script, keys: Sequence[str],
               budget: Budget) -> Steps[Any]:
        """One idempotent send script (its marker in its KEYS), retried as `_io` does
        within the send's ``budget``; no answer in time raises SendFailed, saying whether
        the jobs ``keys`` may be stored."""
        tally = Tally(self._blind_retries)
        try:
            return (yield from self._io(what, request, tally, budget))
        except RedisUnavailable as exc:
            raise SendFailed(
                what, self.url, exc.__cause__, stream=stream,
                outcome="unknown" if tally.reached else "not stored", keys=list(keys),
                waited=time.monotonic() - tally.began) from exc.__cause__

    def _check_recorded(self, stream: str, budget: Budget | None = None) -> Steps[None]:
        """A stream's first send from this producer: a partitioned stream records its
        partition count (or finds it recorded), an unpartitioned one checks none is
        recorded; a different count is refused. Nothing when already checked."""
        if stream in self._recorded:
            return
        count = self.partitions_of(stream)
        key = keys_of(stream).partitions
        if count == 1:
            reply = yield from self._io(f"check the partitions of {stream!r}", Get(key),
                                        budget=budget)
        else:
            reply = yield from self._io(f"record the partitions of {stream!r}",
                                        SetIfMissing(key, count), budget=budget)
        check_recorded(stream, reply, count, "producer")
        if len(self._recorded) >= 10_000:  # a producer of very many streams: check again
            self._recorded.clear()
        self._recorded.add(stream)

    def _send_steps(self, stream: str, payload: Payload, key: str | None,
                    headers: Mapping[str, str] | None, maxlen: int | None,
                    options: Mapping[str, Any]) -> Steps[str]:
        """`send`: one job, its entry id (its key when delayed); ``options`` are its job
        options by send keyword (`job_options`)."""
        with telemetry.producer_span(stream):
            single = self._plan_send(stream, payload, key, headers, maxlen, options)
            budget = Budget()
            yield from self._before_write(f"send to {stream!r}", stream, [single.job_key],
                                          budget)
            reply = yield from self._write(f"send to {stream!r}", stream, single.request,
                                           [single.job_key], budget)
            result = single.key if single.key is not None else ids([reply])[0]
        telemetry.count("produced", 1, stream)
        return result

    def _plan_send(self, stream: str, payload: Payload, key: str | None,
                   headers: Mapping[str, str] | None, maxlen: int | None,
                   options: Mapping[str, Any]) -> Single:
        keys_of(stream)
        opts = check_send(options)
        due = _due(opts)
        _check_maxlen(maxlen)
        hdrs = _headers(headers)
        priority = self._level(stream, opts, due)
        job_key = new_key() if key is None else key
        target = self._target(stream, job_key, opts.get("order_key"))
        body = pack_body(job_key, to_plain(payload, self.codec), hdrs, int(time.time() * 1000),
                         self.max_payload_bytes, wire_map(opts, job_key), self.codec)
        # this call's marker, with the stream's (partition's) other keys
        marker = keys_of(target).sent(new_key())
        if priority != DEFAULT:
            target = level_stream(keys_of(stream), priority)
        if due is not None:
            return Single(Script(scripts.schedule(keys_of(target), *due, [_member(body)],
                                                  marker, self.marker_ttl_ms)),
                          job_key, job_key)
        return Single(Script(scripts.send(StreamKeys.of_any(target), body, maxlen, marker,
                                          self.marker_ttl_ms)), None, job_key)

    def _send_many_steps(self, stream: str, payloads: Sequence[Payload],
                         keys: Sequence[str] | None, headers: Mapping[str, str] | None,
                         maxlen: int | None, options: Mapping[str, Any]) -> Steps[list[str]]:
        """`send_many`: each partition's jobs in chunks, one atomic script call each; the
        ids (keys when delayed) in the order the jobs were given. ``options`` are the job
        options by send_many keyword."""
        with telemetry.producer_span(stream, len(payloads)):
            batches = self._plan_send_many(stream, payloads, keys, headers, maxlen, options)
        what = f"send_many to {stream!r}"
        budget = Budget()  # the check's and the first chunk's; each later chunk its own
        yield from self._before_write(what, stream, [k for b in batches for k in b.job_keys],
                                      budget)
        results: list[list[str]] = []
        plan = [(batch, _chunks(batch, self.marker_ttl_ms)) for batch in batches]
        order = [k for _, chunks in plan for c in chunks for k in c.job_keys]
        done = 0
        for _, chunks in plan:
            got: list[str] = []
            for chunk in chunks:
                try:
                    reply = yield from self._write(what, stream, Script(chunk.call),
                                                   chunk.job_keys, budget)
                except SendFailed as exc:  # say what the chunks before it stored
                    stored = dict(zip(order[:done], [v for r in results for v in r] + got,
                                      strict=True))
                    raise SendFailed(
                        what, self.url, exc.__cause__, stream=stream, outcome=exc.outcome,
                        keys=exc.keys, stored=stored,
                        unsent=order[done + chunk.count:], waited=exc.waited) from exc.__cause__
                got += list(chunk.keys) if chunk.keys else ids(reply)
                budget = Budget()
                done += chunk.count
                telemetry.count("produced", chunk.count, stream)
            results.append(got)
        return _place(batches, results, len(payloads))

    def plan(self, stream: str, payloads: Sequence[Payload], keys: Sequence[str] | None,
             headers: Mapping[str, str] | None = None, maxlen: int | None = None,
             internal: Sequence[Mapping[str, Any]] | None = None,
             **options: Any) -> list[Batch]:
        """What `send_many` would write, checked and encoded, without writing it: for
        senders that write the jobs themselves (a handler's ``msg.send``, whose jobs go
        with its acknowledgement). ``options``: job options by send_many keyword;
        ``internal``: each job's wire fields no option gives (a join's). Raises
        ConfigError (or PayloadTooLarge) on bad input."""
        return self._plan_send_many(stream, payloads, keys, headers, maxlen, options,
                                    internal)

    def _plan_send_many(self, stream: str, payloads: Sequence[Payload],
                        keys: Sequence[str] | None, headers: Mapping[str, str] | None,
                        maxlen: int | None, options: Mapping[str, Any],
                        internal: Sequence[Mapping[str, Any]] | None = None) -> list[Batch]:
        """One batch per partition the jobs go to (one for an unpartitioned stream).
        ``internal``: wire fields of each job that no send option gives (a join's)."""
        keys_of(stream)
        shared, per_job = check_send_many(options, len(payloads))
        due = _due(shared)
        _check_maxlen(maxlen)
        hdrs, now_ms = _headers(headers), int(time.time() * 1000)
        priority = self._level(stream, shared, due)
        job_keys = [new_key() if k is None else k for k in _check_keys(payloads, keys)]
        if not all(type(p) in PLAIN for p in payloads):  # instances of typed payloads
            payloads = [to_plain(p, self.codec) for p in payloads]
        count = self.partitions_of(stream)
        wire = wire_map(shared)
        own: list[dict[str, Any]] | None = None
        if per_job:  # each job's own fields (an order key that is not its key)
            own = [wire_map({name: values[i] for name, values in per_job.items()}, k)
                   for i, k in enumerate(job_keys)]
        if internal is not None:
            own = [{**(own[i] if own else {}), **fields} for i, fields in enumerate(internal)]
        bodies = pack_bodies(job_keys, payloads, hdrs, now_ms, self.max_payload_bytes,
                             wire, self.codec, own)
        orders: list[str] | None = per_job.get("order_key")
        if count == 1:
            groups: dict[str, list[int]] = {level_stream(keys_of(stream), priority):
                                            list(range(len(bodies)))}
        else:
            names = partition_names(stream, count)
            groups = {}
            for i, o in enumerate(job_keys if orders is None else orders):
                groups.setdefault(names[partition_of(o, count)], []).append(i)
        if len(groups) == 1:  # one stream: the lists as they are
            [target] = groups
            return [Batch(target, bodies, None, maxlen, due, () if due is None else job_keys,
                          job_keys)]
        return [Batch(target, [bodies[i] for i in at_], at_, maxlen, due,
                      () if due is None else [job_keys[i] for i in at_],
                      [job_keys[i] for i in at_])
                for target, at_ in groups.items()]

