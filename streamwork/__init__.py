"""streamwork: distributed job workers on Redis Streams.

Nothing lost (acknowledge after success, reclaim after a visibility timeout), nothing done
twice (job records, leases and fencing tokens), retries with backoff, dead letters.

The public names are exported here (and the errors from ``streamwork.errors``); every
other module is private (underscored). The classes that need redis-py are imported on
first use, so ``import streamwork`` stays cheap for a process that only handles errors or
reads ``__version__``.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from streamwork.errors import (
    ConfigError,
    DeadLetter,
    DecodeError,
    JobFailed,
    LockError,
    LockLost,
    LockNotAcquired,
    PayloadTooLarge,
    PermissionDenied,
    RedisUnavailable,
    Retry,
    SendFailed,
    StreamworkError,
    WorkerFailed,
)

if TYPE_CHECKING:
    from streamwork._lock.redlock import (
        AsyncHeldLock,
        AsyncRedlock,
        HeldLock,
        Redlock,
        async_fenced_set,
        fenced_set,
    )
    from streamwork._producer.shells import AsyncProducer, Producer
    from streamwork._wire.extensions import Codec
    from streamwork._wire.joins import Job, JoinChild, JoinStatus
    from streamwork._wire.message import Message
    from streamwork._wire.pausing import PauseState
    from streamwork._wire.records import JobStatus
    from streamwork._wire.schedules import Cron, Every
    from streamwork._worker.features.middleware import Middleware, Outcome
    from streamwork._worker.function import batch_worker, worker
    from streamwork._worker.worker import Health, StreamWorker

logging.getLogger(__name__).addHandler(logging.NullHandler())

#: public names defined in private modules, imported when first used
_LAZY = {
    "AsyncHeldLock": "_lock.redlock", "AsyncRedlock": "_lock.redlock",
    "HeldLock": "_lock.redlock", "Redlock": "_lock.redlock",
    "async_fenced_set": "_lock.redlock", "fenced_set": "_lock.redlock",
    "Message": "_wire.message", "AsyncProducer": "_producer.shells",
    "Producer": "_producer.shells", "Health": "_worker.worker",
    "StreamWorker": "_worker.worker", "JobStatus": "_wire.records",
    "Cron": "_wire.schedules", "Every": "_wire.schedules", "worker": "_worker.function",
    "batch_worker": "_worker.function",
    "Codec": "_wire.extensions", "PauseState": "_wire.pausing",
    "Middleware": "_worker.features.middleware", "Outcome": "_worker.features.middleware",
    "Job": "_wire.joins", "JoinChild": "_wire.joins", "JoinStatus": "_wire.joins",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value: Any = version("streamwork")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            value = "0.0.0"
    elif name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'streamwork' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AsyncHeldLock",
    "AsyncProducer",
    "AsyncRedlock",
    "Codec",
    "ConfigError",
    "Cron",
    "DeadLetter",
    "DecodeError",
    "Every",
    "Health",
    "HeldLock",
    "Job",
    "JobFailed",
    "JobStatus",
    "JoinChild",
    "JoinStatus",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "Message",
    "Middleware",
    "Outcome",
    "PauseState",
    "PayloadTooLarge",
    "PermissionDenied",
    "Producer",
    "RedisUnavailable",
    "Redlock",
    "Retry",
    "SendFailed",
    "StreamWorker",
    "StreamworkError",
    "WorkerFailed",
    "__version__",
    "async_fenced_set",
    "batch_worker",
    "fenced_set",
    "worker",
]
