"""Build redis-py clients from streamwork URLs: redis://, rediss://, unix://, redis+cluster://."""

from __future__ import annotations

import os
from typing import Any, Final

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from .errors import ConfigError

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
SOCKET_TIMEOUT: Final = 10.0  #: seconds; must stay above the longest BLOCK we use
CONNECT_TIMEOUT: Final = 2.0  #: seconds to open a connection before counting it a failure
_SCHEMES: Final = ("redis://", "rediss://", "unix://", "redis+cluster://")


def resolve_url(url: str | None) -> str:
    """``url``, else ``$REDIS_URL``, else the local default; checked for a known scheme."""
    chosen = url or os.environ.get("REDIS_URL") or DEFAULT_URL
    if not chosen.startswith(_SCHEMES):
        raise ConfigError("url", f"{chosen!r} must start with one of {', '.join(_SCHEMES)}")
    return chosen


def _options(max_connections: int | None) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "health_check_interval": 0,
    }
    if max_connections:
        opts["max_connections"] = max_connections
    return opts


def sync_client(url: str, max_connections: int | None = None) -> Any:
    """A thread-safe sync client (redis.Redis or redis.cluster.RedisCluster)."""
    if url.startswith("redis+cluster://"):
        return redis.cluster.RedisCluster.from_url(
            "redis://" + url[len("redis+cluster://"):], **_options(None)
        )
    return redis.Redis.from_url(url, **_options(max_connections))


def async_client(url: str, max_connections: int | None = None) -> Any:
    """An asyncio client (redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster)."""
    if url.startswith("redis+cluster://"):
        return redis.asyncio.cluster.RedisCluster.from_url(
            "redis://" + url[len("redis+cluster://"):], **_options(None)
        )
    return redis.asyncio.Redis.from_url(url, **_options(max_connections))
