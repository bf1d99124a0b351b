"""Job chains: the jobs a handler sends with ``msg.send`` / ``msg.send_many``, encoded as
`Producer.send` encodes them and staged as writes of the job's completion (complete.lua),
so they are enqueued if and only if the job completes.

On one Redis (or a target stream in the job's own Cluster slot) the staged write is the
XADD itself (a ZADD into the target's delayed ZSET for a delayed job). On Redis Cluster a
target in another slot cannot join the completion script: the job is staged into the
source stream's outbox (``{S}:outbox``, the job's slot) instead, and the drain loop
(`loops/drain.py`) moves it to its target once.

A target split into partitions gets each job in the partition `Producer.send` would pick
(``partition_of`` its order key): its count is what Redis records for it
(``{T}:partitions``, written by its partitioned workers and producers), read once per
target by `PartitionCounts` and kept.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import redis.exceptions
from redis.asyncio.cluster import RedisCluster
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from streamwork._producer.batching import delayed_member
from streamwork._producer.core import Core
from streamwork._redis import connection
from streamwork._telemetry import api as telemetry
from streamwork._wire.codec import BODY_FIELD
from streamwork._wire.extensions import Codec
from streamwork._wire.job_options import JOIN_OF_WIRE, JOIN_WIRE, to_many
from streamwork._wire.joins import check_join
from streamwork._wire.keys import StreamKeys
from streamwork._wire.message import Message
from streamwork._wire.partitions import check_partitions, check_recorded, partition_names
from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.options import CoreConfig
from streamwork._worker.core.seam import Feature, Parts
from streamwork.errors import ConfigError

#: the fields of an outbox entry: target stream, body, maxlen ("" none), due ms ("" now)
TARGET, BODY, MAXLEN, DUE = b"t", b"d", b"m", b"z"
#: an outbox entry's kind: absent for a chained job; "join": a join child's end; "open":
#: a join sent by a handler, to open on its callback stream's slot
KIND: Final = b"k"

#: most jobs one handler call may send: they all travel in one completion script
MAX_SENDS: Final = 10_000
#: s the lookup of a target's partition count may take (it can hold the event loop)
LOOKUP_TIMEOUT: Final = 1.0


def chain_key(stream: str, group: str, key: str, index: int) -> str:
    """The key of the ``index``-th job (from 0) sent without a key by job ``key`` of
    ``group`` on ``stream``: the same on every delivery of that job, so a retried handler
    sends the same jobs, and the target group's job records tell a copy apart."""
    packed = msgpack.packb([stream, group, key, index], use_bin_type=True)
    return "chain-" + hashlib.sha256(packed).hexdigest()[:32]


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster (where slots matter)."""
    return isinstance(client, RedisCluster)


@dataclass(frozen=True, slots=True)
class _Target:
    """Where the jobs sent to one stream are staged: the keys of their writes, as bytes."""

    stream: bytes
    delayed: bytes
    via_outbox: bytes | None  # the sender's outbox when the target is in another slot


class PartitionCounts:
    """How many partitions each target stream is split into, as Redis records it: one
    lookup per target (a GET of ``{T}:partitions``, or the SET NX GET `Producer` makes for
    a count given as ``partitions=``), then kept. The lookup is a blocking round trip on a
    client of its own, made in the handler's thread (on the event loop for an ``async def``
    handler, once per target), tried once within LOOKUP_TIMEOUT."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.known: dict[str, int] = {}  # what ``Core.partitions_of`` reads
        self.recorded: dict[str, bytes | None] = {}  # what Redis said (None: nothing)

    @staticmethod
    def checked(stream: str, given: object) -> int | None:
        """``partitions=`` as given to ``msg.send``, checked (None: not given)."""
        count = None if given is None else check_partitions(given)
        if count is not None:
            partition_names(stream, count)  # checks the name suits partitioning
        return count

    def known_for(self, stream: str, given: object) -> int | None:
        """``stream``'s partition count if it is known without asking Redis, else None."""
        count = self.checked(stream, given)
        if stream not in self.recorded:
            return None
        recorded = self.recorded[stream]
        if recorded is None and count is not None and count > 1:  # to be recorded first
            return None
        return self._settle(stream, count, recorded)

    async def of_async(self, client: Any, stream: str, given: object) -> int:
        """``stream``'s partition count, asked of Redis (on ``client``, the worker's async
        one) when not known yet: the flusher's lookup, never a handler's."""
        count = self.checked(stream, given)
        known = self.known_for(stream, given)
        if known is not None:
            return known
        key = StreamKeys.for_stream(stream).partitions
        if count is None or count == 1:
            recorded: bytes | None = await client.get(key)
        else:
            recorded = await client.set(key, count, nx=True, get=True)
        return self._settle(stream, count, recorded)

    def of(self, stream: str, given: object) -> int:
        """``stream``'s partition count (1: not partitioned); ``given`` is ``partitions=``
        (None: not given). Raises ConfigError when it differs from the recorded count, or
        when Redis cannot be asked (rather than send to a stream no worker reads)."""
        count = self.checked(stream, given)
        if stream in self.recorded:
            recorded = self.recorded[stream]
            if recorded is None and count is not None and count > 1:  # record it now
                recorded = self._lookup(stream, count)
        else:
            recorded = self._lookup(stream, count)
        return self._settle(stream, count, recorded)

    def _settle(self, stream: str, count: int | None, recorded: bytes | None) -> int:
        """The count to route by, given ``partitions=`` (``count``) and what Redis records;
        kept for the next send to ``stream``."""
        if count is not None:
            check_recorded(stream, recorded, count, "msg.send")
        known = count or _recorded_count(stream, recorded)
        if len(self.known) >= 1000:  # handlers sending to very many streams
            self.known.clear()
            self.recorded.clear()
        self.recorded[stream] = str(known).encode() if known > 1 else recorded
        self.known[stream] = known
        return known

    def _lookup(self, stream: str, count: int | None) -> bytes | None:
        key = StreamKeys.for_stream(stream).partitions
        if not self.url:
            raise ConfigError("partitions", f"msg.send cannot tell whether stream {stream!r} "
                                            "is split into partitions: this worker has no URL "
                                            "to ask Redis with")
        try:
            # one try, short timeouts: for an async handler this round trip holds the loop
            client = connection.sync_client(self.url, socket_timeout=LOOKUP_TIMEOUT,
                                            socket_connect_timeout=LOOKUP_TIMEOUT,
                                            retry=Retry(NoBackoff(), 0))
            try:
                if count is None or count == 1:
                    reply: bytes | None = client.get(key)
                else:
                    reply = client.set(key, count, nx=True, get=True)
            finally:
                client.close()
        except (redis.exceptions.RedisError, OSError) as exc:
            raise ConfigError("partitions", (
                f"msg.send could not read how many partitions stream {stream!r} is split "
                f"into ({type(exc).__name__}: {exc}); it refuses rather than send jobs to a "
                "stream no worker may read, and the job fails (to be retried)")) from exc
        return reply


def _recorded_count(stream: str, recorded: bytes | None) -> int:
    """The count a ``{T}:partitions`` value records (None: not partitioned)."""
    if recorded is None:
        return 1
    try:
        return check_partitions(int(recorded))
    except (ValueError, ConfigError):
        raise ConfigError("partitions", (
            f"stream {stream!r} records {recorded!r} as its partition count in "
            f"{StreamKeys.for_stream(stream).partitions!r}, not a count msg.send can route "
            "by: fix or delete that key")) from None


class ChainSender:
    """Stages the jobs a worker's handlers send (the `Sender` of its messages)."""

    def __init__(self, cfg: CoreConfig, codec: Codec | None, cluster: bool,
                 url: str = "") -> None:
        # the producer's checks, encoding and partition choice, never its I/O (the client
        # is never used); it reads the targets' partition counts from ``counts``
        self._core = Core(None, max_payload_bytes=cfg.max_payload_bytes, codec=codec)
        self.counts = PartitionCounts(url)
        self._core.partitions = self.counts.known
        self.cluster = cluster
        self._targets: dict[tuple[str, str], _Target] = {}

    def _target(self, source: str, stream: str, derived: bool = False) -> _Target:
        """How jobs sent from ``source`` to ``stream`` are staged (checking the name, unless
        it is ``derived`` from a checked one: a partition's, or a priority level's stream)."""
        found = self._targets.get((source, stream))
        if found is None:
            if not isinstance(stream, str):
                raise ConfigError("stream", f"must be the target stream's name (a str), got "
                                            f"{type(stream).__name__}")
            keys = StreamKeys.of_any(stream) if derived else StreamKeys.for_stream(stream)
            other = self.cluster and key_slot(stream.encode()) != key_slot(source.encode())
            found = _Target(stream.encode(), keys.delayed.encode(),
                            StreamKeys.of_any(source).outbox.encode() if other else None)
            if len(self._targets) >= 1000:  # handlers sending to very many streams
                self._targets.clear()
            self._targets[(source, stream)] = found
        return found

    def send(self, msg: Message[Any], stream: str, payloads: Sequence[Any],
             keys: Sequence[str | None], options: dict[str, Any]) -> list[str]:
        """Check and encode the jobs, stage their writes on ``msg``; their keys. A target
        whose partition count is not known yet is asked once, from a plain ``def``
        handler's thread; from an ``async def`` handler it is not (a round trip would hold
        the event loop, and every job on it, for as long as Redis takes): the jobs are
        checked now and routed by the worker before the completion is written (`resolve`),
        and a target whose recorded count does not fit fails the job then."""
        self._target(msg.stream, stream)  # checks the name
        options = dict(options)
        given = options.pop("partitions", None)
        known = self.counts.known_for(stream, given)
        if known is None and not _on_a_loop():  # a plain def's thread: ask Redis now
            known = self.counts.of(stream, given)
        if msg._sent + len(payloads) > MAX_SENDS:
            raise ConfigError("send", f"one job may send at most {MAX_SENDS} jobs (they all "
                                      "travel in its completion): send a job that sends more")
        job_keys = [chain_key(msg.stream, msg.group, msg.key, msg._sent + i) if k is None
                    else k for i, k in enumerate(keys)]
        timed = _at_ms(options)
        if known is None:  # checked now (as unpartitioned), routed once the count is known
            self._core.plan(stream, payloads, job_keys, **timed)
            msg._deferred = [*(msg._deferred or ()), (stream, payloads, job_keys, timed, given)]
        else:
            self._stage(msg, stream, payloads, job_keys, timed)
        msg._sent += len(payloads)
        msg._sent_to[stream] = msg._sent_to.get(stream, 0) + len(payloads)
        return job_keys

    def send_join(self, msg: Message[Any], jobs: Sequence[Any], then: Any, key: str | None,
                  on_failure: str, ttl: float) -> str:
        """`Message.send_join`: the join's children staged as `send` stages jobs (each
        carrying its membership), and the join opened with the completion: by HSETNX of
        its fields when the join's slot is this stream's (or there are no slots: its
        children cannot end before this completion), else through the outbox (join.lua
        on the drain, which fires at once if every child reported first)."""
        check_join(jobs, then, on_failure, ttl)
        join_key = (key if key is not None else then.key if then.key is not None
                    else chain_key(msg.stream, msg.group, msg.key, msg._sent))
        if not isinstance(join_key, str) or not join_key:
            raise ConfigError("key", f"must be a non-empty str, got {join_key!r}")
        if msg._sent + len(jobs) + 1 > MAX_SENDS:
            raise ConfigError("send_join", f"one job may send at most {MAX_SENDS} jobs "
                                           "(they all travel in its completion)")
        ttl_ms = max(1, round(ttl * 1000))
        [callback] = self._core.plan(then.stream, [then.payload], [then.key or join_key],
                                     then.headers or None, None,
                                     [{JOIN_OF_WIRE: join_key}], **to_many(then.options))
        if callback.due is not None:
            raise ConfigError("then", "a join's callback cannot be delayed (delay=, at=): it "
                                      "is sent when the last child ends")
        for i, job in enumerate(jobs):
            options = {"headers": job.headers or None, **to_many(job.options),
                       "internal": [{JOIN_WIRE: [then.stream, join_key, i, ttl_ms]}]}
            self.send(msg, job.stream, [job.payload], [job.key or f"{join_key}:{i}"], options)
        cb = StreamKeys.of_any(then.stream)
        jkey = cb.join(join_key)
        opened = str(int(time.time() * 1000)).encode()
        if self.cluster and key_slot(jkey.encode()) != key_slot(msg.stream.encode()):
            msg.staged.append(("XADD", (StreamKeys.of_any(msg.stream).outbox.encode(),), (
                b"*", KIND, b"open", TARGET, then.stream.encode(), b"j", join_key.encode(),
                b"n", str(len(jobs)).encode(), b"p", on_failure.encode(),
                b"o", callback.stream.encode(), BODY, callback.bodies[0],
                b"l", str(ttl_ms).encode())))
        else:
            k = (jkey.encode(),)
            for field, value in ((b"n", str(len(jobs)).encode()), (b"policy", on_failure.encode()),
                                 (b"to", callback.stream.encode()),
                                 (b"body", callback.bodies[0]), (b"state", b"open"),
                                 (b"opened", opened), (b"done", b"0"), (b"failed", b"0")):
                msg.staged.append(("HSETNX", k, (field, value)))
            msg.staged.append(("PEXPIRE", k, (str(ttl_ms).encode(),)))
        return join_key

    async def resolve(self, msg: Message[Any], client: Any) -> None:
        """Route and stage ``msg``'s deferred sends, asking Redis (``client``) for the
        partition counts not known yet."""
        for stream, _, _, _, given in msg._deferred or ():
            await self.counts.of_async(client, stream, given)
        for stream, payloads, job_keys, timed, _ in msg._deferred or ():
            self._stage(msg, stream, payloads, job_keys, timed)
        msg._deferred = None

    def _stage(self, msg: Message[Any], stream: str, payloads: Sequence[Any],
               job_keys: list[str], timed: dict[str, Any]) -> None:
        """Encode the jobs for their target (its partition count known) and stage their
        writes on ``msg``."""
        batches = self._core.plan(stream, payloads, job_keys, **timed)
        ops: list[tuple[str, tuple[bytes, ...], tuple[bytes, ...]]] = []
        for batch in batches:
            target = self._target(msg.stream, batch.stream, True)  # a partition's, a level's
            maxlen = b"" if batch.maxlen is None else str(batch.maxlen).encode()
            due = b"" if batch.due is None else batch.due[1].encode()
            for body in batch.bodies:
                if target.via_outbox is not None:
                    ops.append(("XADD", (target.via_outbox,), (
                        b"*", TARGET, target.stream, BODY, body, MAXLEN, maxlen, DUE, due)))
                elif due:
                    ops.append(("ZADD", (target.delayed,), (due, delayed_member(body))))
                elif maxlen:
                    ops.append(("XADD", (target.stream,),
                                (b"MAXLEN", b"~", maxlen, b"*", BODY_FIELD, body)))
                else:
                    ops.append(("XADD", (target.stream,), (b"*", BODY_FIELD, body)))
        msg.staged.extend(ops)


def count_produced(tally: Any, msg: Message[Any]) -> None:
    """A completion that added ``msg``'s sent jobs succeeded: count them as `Producer`
    does (``produced``, per target stream), in the worker's live counters too."""
    if msg._sent_to:
        tally.counts["produced"] += msg._sent
        if tally.metering:
            for stream, n in msg._sent_to.items():
                telemetry.count("produced", n, stream)


def _at_ms(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with a ``delay`` turned into an absolute ``at`` (counted from now, on this
    machine's clock): the job is staged now and written later, with the completion."""
    delay = options.get("delay")
    if delay is None or options.get("at") is not None:
        return options
    if (isinstance(delay, bool) or not isinstance(delay, (int, float))
            or not math.isfinite(delay) or delay < 0):
        raise ConfigError("delay", f"must be a finite number of seconds >= 0, got {delay!r}")
    at = dt.datetime.fromtimestamp(time.time() + delay, tz=dt.timezone.utc)
    return {**options, "delay": None, "at": at}


def sender(cfg: CoreConfig, codec: Codec | None, client: Any, url: str = "") -> ChainSender:
    """The sender of a consumer's messages, for its client (a Cluster's or one Redis's)
    and its URL (to read the targets' partition counts)."""
    return ChainSender(cfg, codec, is_cluster(client), url)


class Chains(Feature):
    """Job chains at the seam: ``msg.send`` stages through a `ChainSender`, and a success
    Redis recorded counts the jobs it sent as produced."""

    @classmethod
    def build(cls, parts: Parts) -> Chains:
        ctx = parts.ctx
        return cls(ctx.tally, sender(ctx.cfg, parts.codec, ctx.redis, parts.url), ctx.redis)

    def __init__(self, tally: Any, chain_sender: ChainSender, client: Any = None) -> None:
        self._tally = tally
        self._sender = chain_sender
        self._client = client  # the worker's async client: the deferred sends' lookups

    def sender(self) -> ChainSender:
        return self._sender

    async def before_done(self, ds: list[Delivery]) -> list[tuple[Delivery, Exception]]:
        """Route the sends of ``ds`` whose target's partition count was not known when the
        handler sent (one lookup per new target); a target whose recorded count does not
        fit fails its job (ConfigError, retried). Redis unreachable: raised, so the flusher
        writes the outcome later."""
        refused: list[tuple[Delivery, Exception]] = []
        for d in ds:
            if d.msg._deferred:
                try:
                    await self._sender.resolve(d.msg, self._client)
                except ConfigError as exc:
                    d.msg._deferred = None
                    refused.append((d, exc))
        return refused

    def on_done(self, d: Delivery) -> None:
        if d.msg._sent_to:  # it sent jobs
            count_produced(self._tally, d.msg)


def _on_a_loop() -> bool:
    """Whether this thread runs an event loop (an ``async def`` handler's ``msg.send``)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
