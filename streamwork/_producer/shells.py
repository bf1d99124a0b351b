"""Producer (sync, thread-safe) and AsyncProducer: enqueue jobs onto a stream.

Both are thin I/O shells over steps that do no I/O (`core` for sending, `jobs` for a
job's status, cancel and result): each public method runs its steps with the shell's one
`_run`, which performs the round trips they yield, the sync one blocking, the async one
awaiting. A transport failure is retried with backoff for ``retry_timeout`` seconds, then
raised as RedisUnavailable. A send is idempotent within itself (its script keeps a
marker for the call): retried after a lost reply it stores nothing twice, and when no
answer comes in time it raises SendFailed, which says whether the jobs may be stored.
`from_url` builds a client that makes no retries of its own (redis-py's ``retry``), so
every attempt is one request the producer sees, and a send's time bound holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio.retry
import redis.retry
from redis.backoff import NoBackoff
from typing_extensions import Unpack

from streamwork._producer.jobs import CANCEL_TTL
from streamwork._producer.joining import Joining
from streamwork._producer.rounds import Result, Sleep, Steps, advance
from streamwork._redis import connection, scripts
from streamwork._wire.codec import Payload
from streamwork._wire.job_options import SendManyOptions, SendOptions
from streamwork._wire.joins import DEFAULT_TTL, Job, JoinStatus
from streamwork._wire.pausing import PauseState
from streamwork._wire.records import JobStatus

__all__ = ["AsyncProducer", "Producer"]

T = TypeVar("T")


class Producer(Joining):
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
        single = ({"retry": redis.retry.Retry(NoBackoff(), 0)}
                  if connection.is_plain_url(resolved) else {})
        return cls(connection.sync_client(resolved, **single), url=resolved, **options)

    def send(
        self,
        stream: str,
        payload: Payload,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        maxlen: int | None = None,
        **options: Unpack[SendOptions],
    ) -> str:
        """Enqueue one job and return its stream entry id.

        ``key`` is the job's identity for dedup (default: a new uuid4 hex). ``maxlen``
        caps the stream near that many entries (``XADD MAXLEN ~``): entries trimmed before
        every group read them are lost, so prefer the workers' ``retention``, which trims
        only what all groups acknowledged. The job options (every sender takes the same;
        None means not given, a name that is not one raises ConfigError):
        ``timeout`` (seconds) is this job's time limit, overriding the worker's
        ``timeout``. ``order_key`` picks the partition of a partitioned stream and orders
        the job among those sharing it in ``ordered`` mode (default: ``key``); send a key
        always with the same one. ``priority`` is "high", "normal" (default) or "low":
        workers read higher levels first (``priority_order``); a key is one job whatever
        level it is sent at. With ``delay`` (seconds) or ``at`` (aware datetime) the job
        waits in ``{S}:delayed`` and the return value is its key, since its entry id is
        only assigned when it falls due.

        While Redis does not answer, it retries (the same request: the job is stored at
        most once) and blocks at most ``send_bound`` seconds (``retry_timeout`` plus twice
        the client's connect and socket timeouts; 34 s by default), then raises
        `SendFailed`, whose ``outcome`` says whether the job may be stored ("unknown": send
        it again with the same key) or is not ("not stored").
        """
        return self._run(self._send_steps(stream, payload, key, headers, maxlen, options))

    def send_many(
        self,
        stream: str,
        payloads: Sequence[Payload],
        keys: Sequence[str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        maxlen: int | None = None,
        **options: Unpack[SendManyOptions],
    ) -> list[str]:
        """Enqueue many jobs; returns their entry ids in order. Each chunk of up to
        SEND_CHUNK (1000) jobs is ONE script call that adds all of them or none (a pipeline
        could fail half way); a longer list is sent chunk after chunk, so a failure there
        leaves the chunks before it enqueued (their ids are in the error, see below).
        ``delay``/``at`` delay them all (one script call per chunk too) and return their
        keys instead of ids; ``maxlen`` and the job options as for `send`, ``order_keys``
        one per job and the others (``timeout``, ``priority``, ...) for all of them.
        On a partitioned stream each partition's jobs are sent as above, partition after
        partition: atomic per partition, in order within each. A chunk that gets no answer
        raises `SendFailed` as `send` does, with the ids of the chunks stored before it
        (``stored``) and the keys of those after it (``unsent``)."""
        return self._run(self._send_many_steps(stream, payloads, keys, headers, maxlen,
                                                 options))

    def send_join(self, jobs: Sequence[Job], then: Job, *, key: str | None = None,
                  on_failure: str = "run", ttl: float = DEFAULT_TTL) -> str:
        """Send ``jobs`` (a join's children, `sw.Job` each, to one stream or several) and
        ``then``, their callback, which is enqueued exactly once: in the step that records
        the end of the last child to end (done, dead, cancelled or expired). Its handler
        reads how each ended with ``await msg.join_results()``. ``on_failure``: "run" the
        callback even if a child failed (it sees the failures), or "dead": dead-letter the
        callback instead (its stream's dead letters, reason ``join_failed``; a replay runs
        it). ``key`` names the join (default: ``then``'s key, else a new one) and is what
        `join_status` reads; a child without a key gets ``<join key>:<index>``, so a
        send_join that raised (an outage) may be sent again with the same key: nothing is
        sent twice that dedup does not catch. The join is kept ``ttl`` seconds after its
        last change. Returns the join's key. The callback's stream must not be partitioned
        and the callback not delayed. Cost: one script call to open the join, then the
        children as `send_many` sends them (one call per chunk of up to 1,000 alike)."""
        return self._run(self._send_join_steps(jobs, then, key, on_failure, ttl))

    def join_status(self, stream: str, key: str, *, results: bool = False) -> JoinStatus:
        """What Redis knows of join ``key`` whose callback goes to ``stream``: its state
        ("open", "fired", "dead", "unknown"), how many children it has and how many are
        done, failed and pending; with ``results`` also how each child ended (one more
        HGETALL)."""
        return self._run(self._join_status_steps(stream, key, results))

    def status(self, stream: str, key: str, *, group: str | None = None,
               order_key: str | None = None) -> JobStatus:
        """What ``group`` knows of job ``key`` (one GET of its job record). ``group`` may be
        left out when the stream has exactly one consumer group. With dedup off no record
        is written and the state is always "unknown". On a partitioned stream the record
        is looked for in the key's partition (by ``order_key``, default the key) first,
        then, unless ``order_key`` was given, in the others. A ``group`` the stream does
        not have (while it has others) raises `GroupNotFound`, checked when no record is
        found."""
        return self._run(self._status_steps(stream, key, group, order_key))

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
        return self._run(self._cancel_steps(stream, key, group, reason, order_key, ttl))

    def result(self, stream: str, key: str, *, group: str | None = None,
               timeout: float | None = 30.0, order_key: str | None = None) -> Any:
        """Wait until ``group`` has finished job ``key`` and return what ``handle()``
        returned (None if it returned nothing, or the result was too large to keep:
        `status` says why). Raises `JobFailed` if the job is dead, `TimeoutError`
        if it is not finished within ``timeout`` seconds (None: wait for ever) and
        `GroupNotFound` as `status` does, and `DecodeError` (``result:invalid``) if the
        producer's codec fails to decode the result. Without ``group``, a stream that has
        no consumer group yet (its worker has not started) is waited for too, within the
        same ``timeout``. Looks at the record with a growing pause (5 ms up to 0.5 s),
        not in a busy loop."""
        return self._run(self._result_steps(stream, key, group, timeout, order_key))

    def pause(self, stream: str, group: str, *, reason: str | None = None) -> PauseState:
        """Pause consumer group ``group`` of ``stream``: within about a second its workers
        start no job, wherever they run, until `resume`. Jobs keep arriving and wait in
        the stream; deliveries a worker already holds stay its own (kept alive, no attempt
        counted); a handler already running finishes. The pause is kept in Redis (it
        outlives worker restarts) with ``reason`` and its time; pausing again replaces
        both. Returns that state. A ``group`` the stream does not have (while it has
        others) raises `GroupNotFound` and pauses nothing."""
        return self._run(self._pause_steps(stream, group, reason))

    def resume(self, stream: str, group: str) -> bool:
        """End the pause of ``group``: its workers start jobs again within about a second,
        the held ones first. Returns whether it was paused."""
        return self._run(self._resume_steps(stream, group))

    def paused(self, stream: str, group: str) -> PauseState | None:
        """Why and since when ``group`` is paused (`PauseState`), or None if it is not."""
        return self._run(self._paused_steps(stream, group))

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _run(self, steps: Steps[T]) -> T:
        """Perform the round trips ``steps`` yields, blocking; return what they return."""
        step = advance(steps, None, None)
        while not isinstance(step, Result):
            reply: Any = None
            error: BaseException | None = None
            try:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                else:
                    reply = step.issue(self._redis, self._scripts)
            except BaseException as exc:
                error = exc
            step = advance(steps, reply, error)
        return step.value


class AsyncProducer(Joining):
    """Enqueue jobs from asyncio code (FastAPI, aiohttp, ...); use ``async with``."""

    def __init__(self, client: Any, **options: Any) -> None:
        super().__init__(client, **options)
        self._scripts = scripts.AsyncScripts(client)

    @classmethod
    def from_url(cls, url: str | None = None, **options: Any) -> AsyncProducer:
        """An async producer for ``url`` (default ``$REDIS_URL``, else the local default)."""
        resolved = connection.resolve_url(url)
        single = ({"retry": redis.asyncio.retry.Retry(NoBackoff(), 0)}
                  if connection.is_plain_url(resolved) else {})
        return cls(connection.async_client(resolved, **single), url=resolved, **options)

    async def send(
        self,
        stream: str,
        payload: Payload,
        *,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        maxlen: int | None = None,
        **options: Unpack[SendOptions],
    ) -> str:
        """Enqueue one job; same arguments and result as ``Producer.send``."""
        return await self._run(self._send_steps(stream, payload, key, headers, maxlen,
                                                options))

    async def send_many(
        self,
        stream: str,
        payloads: Sequence[Payload],
        keys: Sequence[str] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        maxlen: int | None = None,
        **options: Unpack[SendManyOptions],
    ) -> list[str]:
        """As `Producer.send_many`, awaiting: one atomic script call per chunk of jobs."""
        return await self._run(self._send_many_steps(stream, payloads, keys, headers,
                                                     maxlen, options))

    async def send_join(self, jobs: Sequence[Job], then: Job, *, key: str | None = None,
                        on_failure: str = "run", ttl: float = DEFAULT_TTL) -> str:
        """As `Producer.send_join`, awaiting."""
        return await self._run(self._send_join_steps(jobs, then, key, on_failure, ttl))

    async def join_status(self, stream: str, key: str, *,
                          results: bool = False) -> JoinStatus:
        """As `Producer.join_status`, awaiting."""
        return await self._run(self._join_status_steps(stream, key, results))

    async def status(self, stream: str, key: str, *, group: str | None = None,
                     order_key: str | None = None) -> JobStatus:
        """As `Producer.status`, awaiting."""
        return await self._run(self._status_steps(stream, key, group, order_key))

    async def cancel(self, stream: str, key: str, *, group: str | None = None,
                     reason: str = "", order_key: str | None = None,
                     ttl: float = CANCEL_TTL) -> str:
        """As `Producer.cancel`, awaiting."""
        return await self._run(self._cancel_steps(stream, key, group, reason, order_key, ttl))

    async def result(self, stream: str, key: str, *, group: str | None = None,
                     timeout: float | None = 30.0, order_key: str | None = None) -> Any:
        """As `Producer.result`, awaiting (other tasks run while it waits)."""
        return await self._run(self._result_steps(stream, key, group, timeout, order_key))

    async def pause(self, stream: str, group: str, *,
                    reason: str | None = None) -> PauseState:
        """As `Producer.pause`, awaiting."""
        return await self._run(self._pause_steps(stream, group, reason))

    async def resume(self, stream: str, group: str) -> bool:
        """As `Producer.resume`, awaiting."""
        return await self._run(self._resume_steps(stream, group))

    async def paused(self, stream: str, group: str) -> PauseState | None:
        """As `Producer.paused`, awaiting."""
        return await self._run(self._paused_steps(stream, group))

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _run(self, steps: Steps[T]) -> T:
        """Perform the round trips ``steps`` yields, awaiting; return what they return."""
        step = advance(steps, None, None)
        while not isinstance(step, Result):
            reply: Any = None
            error: BaseException | None = None
            try:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                else:
                    reply = await step.issue(self._redis, self._scripts)
            except BaseException as exc:
                error = exc
            step = advance(steps, reply, error)
        return step.value
