"""streamwork: distributed job workers on Redis Streams.

Nothing lost (acknowledge after success, reclaim after a visibility timeout), nothing done
twice (done-markers, leases and fencing tokens), retries with backoff, dead letters.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from .errors import (
    ConfigError,
    DeadLetter,
    DecodeError,
    LockError,
    LockLost,
    LockNotAcquired,
    PayloadTooLarge,
    RedisUnavailable,
    Retry,
    StreamworkError,
    WorkerFailed,
)
from .lock import AsyncHeldLock, AsyncRedlock, HeldLock, Redlock, async_fenced_set, fenced_set
from .message import Message
from .producer import AsyncProducer, Producer
from .worker import StreamWorker

logging.getLogger(__name__).addHandler(logging.NullHandler())

try:
    __version__ = version("streamwork")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "AsyncHeldLock",
    "AsyncProducer",
    "AsyncRedlock",
    "ConfigError",
    "DeadLetter",
    "DecodeError",
    "HeldLock",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "Message",
    "PayloadTooLarge",
    "Producer",
    "RedisUnavailable",
    "Redlock",
    "Retry",
    "StreamWorker",
    "StreamworkError",
    "WorkerFailed",
    "__version__",
    "async_fenced_set",
    "fenced_set",
]
