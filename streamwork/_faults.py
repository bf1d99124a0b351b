"""What an error from Redis means for a worker's loops: ride it out, rebuild, or stop.

Every internal loop of a worker hands the errors it meets to `classify` (one place, one
rule, DESIGN.md "A worker is whole, or it exits"):

* `Fault.TRANSIENT` - the server is busy, full, restarting, read-only, failing over or out
  of reach: back off and retry, keeping every finished outcome in memory until it is
  written. Connection loss, timeouts, ``LOADING``, ``BUSY``, ``TRYAGAIN``,
  ``CLUSTERDOWN``, ``MASTERDOWN``, ``READONLY``, ``OOM`` (and ``NOREPLICAS``).
* `Fault.GONE` - the consumer group or the stream itself is gone (a server that came back
  empty, a ``FLUSHALL``, a deleted key): recreate the group (``MKSTREAM``) and go on.
* `Fault.FATAL` - anything else is a bug or a misconfiguration (``WRONGTYPE``, a wrong
  password, a missing ACL permission, a script error): the worker stops loudly.
"""

from __future__ import annotations

import enum
from typing import Final

import redis.exceptions


class Fault(enum.Enum):
    """What to do about an error."""

    TRANSIENT = "transient"
    GONE = "gone"
    FATAL = "fatal"


#: error classes a retry may cure (``AuthenticationError`` subclasses ConnectionError in
#: redis-py but is no outage: it is checked first and is fatal)
_TRANSIENT_TYPES: Final = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,  # ClusterDownError, MasterDownError, "TTL exhausted"
    redis.exceptions.TryAgainError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.SlotNotCoveredError,
    ConnectionError,
    TimeoutError,
    OSError,
)
_FATAL_TYPES: Final = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.NoPermissionError,
)
#: leading error codes of server replies (also inside script errors, which keep the code
#: of the command that failed) that a retry may cure
_TRANSIENT_CODES: Final = frozenset({
    "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "OOM",
    "NOREPLICAS", "MOVED", "ASK",
})
#: codes saying the group or the stream is gone
_GONE_CODES: Final = frozenset({"NOGROUP", "UNBLOCKED"})


def _code(exc: BaseException) -> str:
    """The error code of a server reply: its first word (``NOGROUP No such key ...``);
    for a pre-7 script error (``ERR Error running script ... -OOM ...``) the code of the
    command that failed inside it."""
    text = str(exc)
    if text.startswith("ERR Error running script") and ": -" in text:
        text = text.rsplit(": -", 1)[1]
    return text.split(" ", 1)[0]


def classify(exc: BaseException) -> Fault:
    """Whether ``exc`` is worth a retry, calls for recreating the group, or is fatal."""
    if isinstance(exc, _FATAL_TYPES):
        return Fault.FATAL
    if isinstance(exc, redis.exceptions.ResponseError):
        code = _code(exc)
        if code in _GONE_CODES:
            return Fault.GONE
        if code in _TRANSIENT_CODES or isinstance(exc, _TRANSIENT_TYPES):
            return Fault.TRANSIENT
        return Fault.FATAL
    if isinstance(exc, _TRANSIENT_TYPES):
        return Fault.TRANSIENT
    return Fault.FATAL


def is_transient(exc: BaseException) -> bool:
    """True when backing off and retrying may cure ``exc``."""
    return classify(exc) is Fault.TRANSIENT
