"""Build redis-py clients from streamwork URLs: redis://, rediss://, unix://, redis+cluster://,
redis+sentinel:// and rediss+sentinel:// (see `streamwork._redis.sentinel`). TLS options
come in the URL's query, as redis-py takes them (``?ssl_ca_certs=...``); a TLS
misconfiguration is a ConfigError, not an outage (see `streamwork._redis.tls`)."""

from __future__ import annotations

import os
from typing import Any, Final
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import tenacity
from tenacity.wait import wait_base

from streamwork._redis import sentinel, tls, tls_connections
from streamwork._text import redact_url
from streamwork.errors import ConfigError

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
SOCKET_TIMEOUT: Final = 10.0  #: seconds; must stay above the longest BLOCK we use
CONNECT_TIMEOUT: Final = 2.0  #: seconds to open a connection before counting it a failure
_SCHEMES: Final = ("redis://", "rediss://", "unix://", "redis+cluster://", *sentinel.SCHEMES)


def resolve_url(url: str | None) -> str:
    """``url``, else ``$REDIS_URL``, else the local default; checked for a known scheme
    and, but for a sentinel URL (`sentinel.parse` checks those) or a unix socket, a port
    that is a number. The messages show the URL with its password masked."""
    chosen = url or os.environ.get("REDIS_URL") or DEFAULT_URL
    if not chosen.startswith(_SCHEMES):
        raise ConfigError("url", f"{redact_url(chosen)!r} must start with one of "
                                 f"{', '.join(_SCHEMES)}")
    if sentinel.is_sentinel_url(chosen):
        sentinel.parse(chosen)  # a malformed one fails here, with what to fix
    elif not chosen.startswith("unix://"):
        _check_port(chosen)
    tls.check_url(chosen)  # TLS options on a plain URL, a certificate file not there, ...
    return chosen


def url_source(url: str | None) -> str:
    """Where `resolve_url` takes the URL from: ``"--url"`` (given), ``"$REDIS_URL"`` or
    ``"default"`` (neither is set: the local default, which may be another server than
    meant)."""
    if url:
        return "--url"
    return "$REDIS_URL" if os.environ.get("REDIS_URL") else "default"


def _check_port(url: str) -> None:
    """A ConfigError unless ``url``'s port, if it has one, is a number from 1 to 65535
    (redis-py would raise a bare ValueError at the first call)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        netloc = urlsplit(url).netloc.rpartition("@")[2] if "://" in url else url
        port = netloc.rpartition(":")[2] if ":" in netloc else "?"
        raise ConfigError("url", (
            f"{redact_url(url)!r} has a port that is not a number from 1 to 65535 "
            f"({port!r}): write it as redis://HOST:PORT/DB, e.g. redis://127.0.0.1:6379/0 "
            "(a password goes before the host: redis://:PASSWORD@HOST:PORT/DB; "
            "characters such as @ : / in it as %40 %3A %2F)")) from None
    if parts.port == 0:
        raise ConfigError("url", f"{redact_url(url)!r}: port 0 is no server's port; give "
                                 "the server's port (6379 by default)")


_OPTIONS: Final[dict[str, Any]] = {
    "socket_timeout": SOCKET_TIMEOUT,
    "socket_connect_timeout": CONNECT_TIMEOUT,
    "health_check_interval": 0,
}


def _async_options() -> dict[str, Any]:
    """`_OPTIONS` for asyncio clients. redis-py's asyncio pool skips its check for pooled
    connections the server closed while they sat idle when maintenance notifications are
    on, and they are on ("auto") by default where it has them (8.1): after a Redis restart
    each such connection would fail the next call made on it, a false new outage. streamwork
    uses no maintenance notifications, so they are turned off where they exist."""
    pool = redis.asyncio.ConnectionPool
    if not hasattr(pool, "maint_notifications_enabled"):
        return _OPTIONS
    from redis.maint_notifications import MaintNotificationsConfig
    return {**_OPTIONS, "maint_notifications_config": MaintNotificationsConfig(enabled=False)}


class _Attempt:
    """The one attribute tenacity's wait strategies read."""

    __slots__ = ("attempt_number",)

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


def reconnect_wait() -> wait_base:
    """Wait between attempts while Redis is unavailable: 50 ms doubling to 2 s, jittered."""
    return tenacity.wait_exponential(multiplier=0.05, max=2.0) + tenacity.wait_random(0, 0.05)


def reconnect_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` consecutive transient errors."""
    return float(reconnect_wait()(_Attempt(max(failures, 1))))  # type: ignore[arg-type]


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``)."""
    return url.startswith("redis+cluster://")


def sync_client(url: str, **options: Any) -> Any:
    """A thread-safe sync client (redis.Redis or redis.cluster.RedisCluster; for a sentinel
    URL a redis.Redis of the service's current primary); ``options`` override the usual
    ones (timeouts, retry)."""
    if sentinel.is_sentinel_url(url):
        return sentinel.sync_client(url, **{**_OPTIONS, **options})
    if url.startswith("redis+cluster://"):
        return redis.cluster.RedisCluster.from_url(
            "redis://" + url[len("redis+cluster://"):], **{**_OPTIONS, **options}
        )
    if url.startswith("rediss://"):
        options = {"connection_class": tls_connections.SyncConnection, **options}
    return redis.Redis.from_url(url, **{**_OPTIONS, **options})


def async_client(url: str, **options: Any) -> Any:
    """An asyncio client (redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster; for a
    sentinel URL a redis.asyncio.Redis of the service's current primary); ``options``
    override the usual ones."""
    if sentinel.is_sentinel_url(url):
        return sentinel.async_client(url, **{**_async_options(), **options})
    if url.startswith("redis+cluster://"):
        return redis.asyncio.cluster.RedisCluster.from_url(
            "redis://" + url[len("redis+cluster://"):], **{**_OPTIONS, **options}
        )
    if url.startswith("rediss://"):
        options = {"connection_class": tls_connections.AsyncConnection, **options}
    return redis.asyncio.Redis.from_url(url, **{**_async_options(), **options})


def is_plain_url(url: str) -> bool:
    """Whether ``url`` names one server directly (redis://, rediss://, unix://): no cluster
    nor sentinel client, whose own retries follow failovers and slot moves."""
    return url.startswith(("redis://", "rediss://", "unix://"))
