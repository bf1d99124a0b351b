"""The steps of a producer's joins (fan-in, `streamwork._wire.joins`): open the join on
the callback stream's slot, then send its children; and read a join's status."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from streamwork._producer.batching import _chunks, new_key
from streamwork._producer.core import keys_of
from streamwork._producer.pausing import Pausing
from streamwork._producer.rounds import HashGetAll, Script, Steps
from streamwork._redis import scripts
from streamwork._telemetry import api as telemetry
from streamwork._wire.job_options import JOIN_OF_WIRE, JOIN_WIRE, to_many
from streamwork._wire.joins import (
    Job,
    JoinStatus,
    check_join,
    decode_results,
    parse_status,
    with_results,
)
from streamwork.errors import ConfigError


def _many(options: dict[str, Any], n: int) -> dict[str, Any]:
    """``send_many`` options for ``n`` jobs that share one job's options."""
    return {name: value * n if isinstance(value, list) else value
            for name, value in options.items()}


class Joining(Pausing):
    """`send_join` and `join_status`, on top of the other producer steps."""

    def _send_join_steps(self, jobs: Sequence[Job], then: Job, key: str | None,
                         on_failure: str, ttl: float) -> Steps[str]:
        """`send_join`: the join's key."""
        check_join(jobs, then, on_failure, ttl)
        cb = keys_of(then.stream)
        if self.partitions_of(then.stream) > 1:
            raise ConfigError("then", f"{then.stream!r} is partitioned: a join's callback goes "
                                      "to a stream that is not")
        join_key = key if key is not None else then.key if then.key is not None else new_key()
        if not isinstance(join_key, str) or not join_key:
            raise ConfigError("key", f"must be a non-empty str, got {join_key!r}")
        ttl_ms = max(1, round(ttl * 1000))
        [callback] = self._plan_send_many(
            then.stream, [then.payload], [then.key or join_key], then.headers or None, None,
            to_many(then.options), internal=[{JOIN_OF_WIRE: join_key}])
        if callback.due is not None:
            raise ConfigError("then", "a join's callback cannot be delayed (delay=, at=): it "
                                      "is sent when the last child ends")
        plans = []
        start = 0
        while start < len(jobs):  # runs of children alike (stream, options, headers)
            first, end = jobs[start], start + 1
            while (end < len(jobs) and jobs[end].stream == first.stream
                   and jobs[end].options == first.options and jobs[end].headers == first.headers):
                end += 1
            run = range(start, end)
            plans += self._plan_send_many(
                first.stream, [jobs[i].payload for i in run],
                [jobs[i].key or f"{join_key}:{i}" for i in run], first.headers or None, None,
                _many(to_many(first.options), len(run)),
                internal=[{JOIN_WIRE: [then.stream, join_key, i, ttl_ms]} for i in run])
            start = end
        what = f"send_join {join_key!r}"
        try:
            yield from self._io(what, Script(scripts.join_open(
                cb, join_key, len(jobs), on_failure, callback.stream, callback.bodies[0],
                ttl_ms)))
        except redis.ResponseError as exc:
            if str(exc).startswith("JOINKEY"):
                raise ConfigError("key", f"{join_key!r}: {str(exc)[8:]}") from None
            raise
        for stream in {j.stream for j in jobs}:
            yield from self._check_recorded(stream)
        for batch in plans:
            for chunk in _chunks(batch, self.marker_ttl_ms):
                yield from self._io(what, Script(chunk.call))
                telemetry.count("produced", chunk.count, batch.stream)
        return join_key

    def _join_status_steps(self, stream: str, key: str, results: bool) -> Steps[JoinStatus]:
        """`join_status`: one HGETALL (two with ``results``)."""
        k = keys_of(stream)
        raw: Any = yield from self._io(f"join status of {key!r}", HashGetAll(k.join(key)))
        status = parse_status(stream, key, raw)
        if results:
            got: Any = yield from self._io(f"join results of {key!r}",
                                           HashGetAll(k.join_results(key)))
            status = with_results(status, decode_results(got, self.codec))
        return status
