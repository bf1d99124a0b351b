"""Job chains: the jobs a handler sends with ``msg.send`` / ``msg.send_many``, encoded as
`Producer.send` encodes them and staged as writes of the job's completion (complete.lua),
so they are enqueued if and only if the job completes.

On one Redis (or a target stream in the job's own Cluster slot) the staged write is the
XADD itself (a ZADD into the target's delayed ZSET for a delayed job). On Redis Cluster a
target in another slot cannot join the completion script: the job is staged into the
source stream's outbox (``{S}:outbox``, the job's slot) instead, and the drain loop
(`loops/drain.py`) moves it to its target once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from streamwork._producer.core import Core, delayed_member
from streamwork._wire.codec import BODY_FIELD
from streamwork._wire.extensions import Codec
from streamwork._wire.keys import StreamKeys
from streamwork._wire.message import Message
from streamwork._worker.config import WorkerConfig
from streamwork.errors import ConfigError

#: the fields of an outbox entry: target stream, body, maxlen ("" none), due ms ("" now)
TARGET, BODY, MAXLEN, DUE = b"t", b"d", b"m", b"z"

#: most jobs one handler call may send: they all travel in one completion script
MAX_SENDS: Final = 10_000


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


class ChainSender:
    """Stages the jobs a worker's handlers send (the `Sender` of its messages)."""

    def __init__(self, cfg: WorkerConfig, codec: Codec | None, cluster: bool) -> None:
        # the producer's checks and encoding, never its I/O (the client is never used)
        self._core = Core(None, max_payload_bytes=cfg.max_payload_bytes, codec=codec)
        self.cluster = cluster
        self._targets: dict[tuple[str, str], _Target] = {}

    def _target(self, source: str, stream: str) -> _Target:
        """How jobs sent from ``source`` to ``stream`` are staged (checking the name)."""
        found = self._targets.get((source, stream))
        if found is None:
            if not isinstance(stream, str):
                raise ConfigError("stream", f"must be the target stream's name (a str), got "
                                            f"{type(stream).__name__}")
            keys = StreamKeys.for_stream(stream)
            other = self.cluster and key_slot(stream.encode()) != key_slot(source.encode())
            found = _Target(stream.encode(), keys.delayed.encode(),
                            StreamKeys.of_any(source).outbox.encode() if other else None)
            if len(self._targets) >= 1000:  # handlers sending to very many streams
                self._targets.clear()
            self._targets[(source, stream)] = found
        return found

    def send(self, msg: Message[Any], stream: str, payloads: Sequence[Any],
             keys: Sequence[str | None], options: dict[str, Any]) -> list[str]:
        """Check and encode the jobs, stage their writes on ``msg``; their keys."""
        target = self._target(msg.stream, stream)
        if msg._sent + len(payloads) > MAX_SENDS:
            raise ConfigError("send", f"one job may send at most {MAX_SENDS} jobs (they all "
                                      "travel in its completion): send a job that sends more")
        job_keys = [chain_key(msg.stream, msg.group, msg.key, msg._sent + i) if k is None
                    else k for i, k in enumerate(keys)]
        batches = self._core.plan(stream, payloads, job_keys, **_at_ms(options))
        ops: list[tuple[str, tuple[bytes, ...], tuple[bytes, ...]]] = []
        for batch in batches:
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
        msg._sent += len(payloads)
        return job_keys


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


def sender(cfg: WorkerConfig, codec: Codec | None, client: Any) -> ChainSender:
    """The sender of a consumer's messages, for its client (a Cluster's or one Redis's)."""
    return ChainSender(cfg, codec, is_cluster(client))
