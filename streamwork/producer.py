"""Producer (sync, thread-safe) and AsyncProducer: enqueue jobs onto a stream.

Both are thin I/O shells over the same pure steps (validate, encode, pick keys); only the
awaits differ. A transport failure is retried with backoff for ``retry_timeout`` seconds,
then raised as RedisUnavailable. A send retried after a lost reply may enqueue the job
twice: give jobs a ``key`` and run the worker with ``dedup`` to make that harmless.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, TypeVar

import tenacity

from . import connection, scripts, telemetry
from .codec import (
    BODY_FIELD,
    DEFAULT_MAX_PAYLOAD_BYTES,
    Payload,
    check_headers,
    pack_body,
    time_limit_ms,
)
from .errors import ConfigError, RedisUnavailable
from .keys import StreamKeys
from .retry import TRANSIENT, reconnect_wait

__all__ = ["AsyncProducer", "Producer"]

DEFAULT_RETRY_TIMEOUT: Final = 10.0  #: seconds a send keeps retrying while Redis is unreachable
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
             now_ms: int | None = None, limit_ms: int | None = None) -> _Job:
    job_key = new_key() if key is None else key
    enqueued = int(time.time() * 1000) if now_ms is None else now_ms
    return _Job(job_key, pack_body(job_key, payload, hdrs, enqueued, limit, limit_ms))


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
    return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]


class _BaseProducer:
    """What the sync and async producers share: the client, its scripts, the options."""

    def __init__(
        self,
        client: Any,
        *,
        url: str = "",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
    ) -> None:
        _check_options(max_payload_bytes, retry_timeout)
        self._redis = client
        self._scripts = scripts.register(client)
        self.url = url
        self.max_payload_bytes = max_payload_bytes
        self.retry_timeout = retry_timeout


class Producer(_BaseProducer):
    """Enqueue jobs from synchronous code; one instance is safe to share between threads."""

    @classmethod
    def from_url(cls, url: str | None = None, **options: Any) -> Producer:
        """A producer for ``url`` (default ``$REDIS_URL``, else redis://127.0.0.1:6379/0)."""
        resolved = connection.resolve_url(url)
        return cls(connection.sync_client(resolved), url=resolved, **options)

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return fn()  # the usual case: no retry machinery built at all
        except TRANSIENT:
            pass
        try:
            for attempt in tenacity.Retrying(
                stop=tenacity.stop_after_delay(self.retry_timeout),
                wait=reconnect_wait(),
                retry=tenacity.retry_if_exception_type(TRANSIENT),
                reraise=True,
            ):
                with attempt:
                    return fn()
        except TRANSIENT as exc:
            raise RedisUnavailable(what, self.url, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

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
    ) -> str:
        """Enqueue one job and return its stream entry id.

        ``key`` is the job's identity for dedup (default: a new uuid4 hex). With ``delay``
        (seconds) or ``at`` (aware datetime) the job waits in ``{S}:delayed`` and the
        return value is its key, since its entry id is only assigned when it falls due.
        ``timeout`` (seconds) is this job's time limit, overriding the worker's ``timeout``.
        """
        keys = _keys(stream)
        due = _due(delay, at)
        with telemetry.producer_span(stream):
            job = _prepare(payload, key, _headers(headers), self.max_payload_bytes,
                           limit_ms=time_limit_ms(timeout))
            if due is not None:
                self._call(f"send to {stream!r}", lambda: self._scripts.schedule(
                    keys=[keys.delayed], args=[*due, _member(job)]))
                result = job.key
            else:
                result = _ids([self._call(f"send to {stream!r}", lambda: self._redis.xadd(
                    stream, {BODY_FIELD: job.body}))])[0]
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
    ) -> list[str]:
        """Enqueue many jobs in one pipelined round trip; returns their entry ids in order."""
        _keys(stream)
        with telemetry.producer_span(stream, len(payloads)):
            hdrs, now_ms = _headers(headers), int(time.time() * 1000)
            limit_ms = time_limit_ms(timeout)
            jobs = [
                _prepare(p, k, hdrs, self.max_payload_bytes, now_ms, limit_ms)
                for p, k in zip(payloads, _check_keys(payloads, keys), strict=True)
            ]
        if not jobs:
            return []

        def run() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for job in jobs:
                pipe.xadd(stream, {BODY_FIELD: job.body})
            return list(pipe.execute())

        ids = _ids(self._call(f"send_many to {stream!r}", run))
        telemetry.count("produced", len(ids), stream)
        return ids

    def close(self) -> None:
        """Close the connection pool."""
        self._redis.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncProducer(_BaseProducer):
    """Enqueue jobs from asyncio code (FastAPI, aiohttp, ...); use ``async with``."""

    @classmethod
    def from_url(cls, url: str | None = None, **options: Any) -> AsyncProducer:
        """An async producer for ``url`` (default ``$REDIS_URL``, else the local default)."""
        resolved = connection.resolve_url(url)
        return cls(connection.async_client(resolved), url=resolved, **options)

    async def _call(self, what: str, fn: Any) -> Any:
        try:
            return await fn()  # the usual case: no retry machinery built at all
        except TRANSIENT:
            pass
        try:
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_delay(self.retry_timeout),
                wait=reconnect_wait(),
                retry=tenacity.retry_if_exception_type(TRANSIENT),
                reraise=True,
            ):
                with attempt:
                    return await fn()
        except TRANSIENT as exc:
            raise RedisUnavailable(what, self.url, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

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
    ) -> str:
        """Enqueue one job; same arguments and result as ``Producer.send``."""
        keys = _keys(stream)
        due = _due(delay, at)
        with telemetry.producer_span(stream):
            job = _prepare(payload, key, _headers(headers), self.max_payload_bytes,
                           limit_ms=time_limit_ms(timeout))
            if due is not None:
                await self._call(f"send to {stream!r}", lambda: self._scripts.schedule(
                    keys=[keys.delayed], args=[*due, _member(job)]))
                result = job.key
            else:
                result = _ids([await self._call(f"send to {stream!r}", lambda: self._redis.xadd(
                    stream, {BODY_FIELD: job.body}))])[0]
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
    ) -> list[str]:
        """Enqueue many jobs in one pipelined round trip; returns their entry ids in order."""
        _keys(stream)
        with telemetry.producer_span(stream, len(payloads)):
            hdrs, now_ms = _headers(headers), int(time.time() * 1000)
            limit_ms = time_limit_ms(timeout)
            jobs = [
                _prepare(p, k, hdrs, self.max_payload_bytes, now_ms, limit_ms)
                for p, k in zip(payloads, _check_keys(payloads, keys), strict=True)
            ]
        if not jobs:
            return []

        async def run() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for job in jobs:
                pipe.xadd(stream, {BODY_FIELD: job.body})
            return list(await pipe.execute())

        ids = _ids(await self._call(f"send_many to {stream!r}", run))
        telemetry.count("produced", len(ids), stream)
        return ids

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
