"""What an error from Redis means for a worker's loops: ride it out, rebuild, or stop.

Every internal loop of a worker hands the errors it meets to `classify` (one place, one
rule: a worker is whole, or it exits):

* `Fault.TRANSIENT` - the server is busy, full, restarting, read-only, failing over or out
  of reach: back off and retry, keeping every finished outcome in memory until it is
  written. Connection loss, timeouts, ``LOADING``, ``BUSY``, ``TRYAGAIN``,
  ``CLUSTERDOWN``, ``MASTERDOWN``, ``READONLY``, ``OOM`` (and ``NOREPLICAS``); under
  Sentinel, "no master" while none is elected (``MasterNotFoundError``) and a demoted
  primary's ``READONLY`` (which redis-py's sentinel pool raises as a ConnectionError and
  answers by asking the sentinels again on reconnect); also a
  connection torn down under a command, which some redis-py versions report as an
  ``AttributeError``/``TypeError`` on ``None`` instead of a ConnectionError (see
  `_torn_down`).
* `Fault.GONE` - the consumer group or the stream itself is gone (a server that came back
  empty, a ``FLUSHALL``, a deleted key): recreate the group (``MKSTREAM``) and go on.
* `Fault.FATAL` - anything else is a bug or a misconfiguration (``WRONGTYPE``, a wrong
  password, a script error, TLS that cannot work as configured: `tls.TlsError`): the
  worker stops loudly. A missing ACL permission (``NOPERM``, also inside a script:
  `denial` tells it apart and names what was refused) is fatal too: no retry grants a
  permission, and ``streamwork._redis.acl`` says what to grant.
"""

from __future__ import annotations

import enum
import os
import re
from typing import Final, NamedTuple

import redis
import redis.exceptions

from streamwork._redis.tls import TlsError


class Fault(enum.Enum):
    """What to do about an error."""

    TRANSIENT = "transient"
    GONE = "gone"
    FATAL = "fatal"


#: error classes a retry may cure (``AuthenticationError`` and `TlsError` subclass
#: ConnectionError in redis-py but are no outage: they are checked first and are fatal)
_TRANSIENT_TYPES: Final = (
    redis.exceptions.ConnectionError,  # with redis.sentinel.MasterNotFoundError
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
    TlsError,
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


#: redis-py's connection and reply-parser modules, relative to its package directory
_REDIS_DIR: Final = os.path.dirname(os.path.abspath(redis.__file__)) + os.sep
_CONNECTION_MODULES: Final = (os.path.join("asyncio", "connection.py"), "connection.py",
                              "_parsers" + os.sep)


def _torn_down(exc: BaseException) -> bool:
    """True for a connection closed under a command, as redis-py up to 8.1 reports it.

    redis-py's async ``RedisCluster`` closes every node's connections on ``CLUSTERDOWN``
    and when it rebuilds its slot map (``RedisCluster.aclose``), while other coroutines
    sharing the client are in the middle of a command on them; the next write then finds
    ``Connection._writer`` gone and raises ``AttributeError: 'NoneType' object has no
    attribute 'writelines'`` (and, on a socket the peer reset, ``TypeError: 'NoneType'
    object is not callable`` on CPython 3.12 / ``AttributeError ... '_add_writer'`` on
    3.13.0-3.13.9: redis/redis-py#4287, fixed upstream by #4288). The command never
    reached the server, or its reply is lost as with any connection loss: a retry is
    safe. Recognised narrowly: an AttributeError/TypeError about ``None`` whose traceback
    passes through redis-py's connection or parser code last among redis-py's frames."""
    if not isinstance(exc, (AttributeError, TypeError)) or "'NoneType'" not in str(exc):
        return False
    last = None
    tb = exc.__traceback__
    while tb is not None:
        name = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if name.startswith(_REDIS_DIR):
            last = name[len(_REDIS_DIR):]
        tb = tb.tb_next
    return last is not None and last.startswith(_CONNECTION_MODULES)


def _cluster_unreachable(exc: BaseException) -> bool:
    """True for redis-py's word that no node of a cluster answered (``Redis Cluster cannot
    be connected``), which is no ConnectionError: an outage like any other, e.g. a worker
    started while the node its URL names is failing over."""
    return (isinstance(exc, redis.exceptions.RedisClusterException)
            and "cannot be connected" in str(exc))


class Denial(NamedTuple):
    """What Redis refused this connection's ACL user (a ``NOPERM`` reply)."""

    command: str | None  #: the command refused (``xack``, ``xinfo|groups``); None: not named
    key: bool  #: a key (or a channel) was refused, not a command
    in_script: bool  #: refused inside a Lua script
    text: str  #: Redis's words


#: a refused command, as Redis words it: ``this user has no permissions to run the 'xack'
#: command`` (Redis 7.0), ``User u has no permissions to run the 'xack' command`` (7.2+,
#: Valkey, also inside a script after ``ACL failure in script:``)
_REFUSED_COMMAND: Final = re.compile(r"no permissions to run the '([^']+)' command")
#: a refused key or channel: ``no permissions to access one of the keys used as arguments``,
#: ``No permissions to access a key``; inside a script on 7.0, ``can't access at least one
#: of the keys mentioned in the command``
_REFUSED_KEY: Final = re.compile(
    r"(?i)no permissions to access (a key|a channel|one of the (keys|channels))"
    r"|can't access at least one of the (keys|channels)")
#: a command refused inside a script on Redis 7.0, which does not name it
_REFUSED_IN_SCRIPT: Final = re.compile(r"The user executing the script can't run this command")


def denial(exc: BaseException) -> Denial | None:
    """What an ACL refused, if ``exc`` is a missing permission (``NOPERM`` or a script's
    ACL failure, which Redis 7.0 sends as a plain ``ERR``); None for any other error."""
    if not isinstance(exc, redis.exceptions.ResponseError):
        return None
    text = str(exc)
    in_script = ("script:" in text or "ACL failure in script" in text
                 or bool(_REFUSED_IN_SCRIPT.search(text)))
    found = _REFUSED_COMMAND.search(text)
    if found:
        return Denial(found.group(1).lower(), False, in_script, text)
    if _REFUSED_KEY.search(text):
        return Denial(None, True, in_script, text)
    if _REFUSED_IN_SCRIPT.search(text):
        return Denial(None, False, True, text)
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return Denial(None, False, in_script, text)
    return None


def classify(exc: BaseException) -> Fault:
    """Whether ``exc`` is worth a retry, calls for recreating the group, or is fatal."""
    if isinstance(exc, _FATAL_TYPES) or denial(exc) is not None:
        return Fault.FATAL
    if isinstance(exc, redis.exceptions.ResponseError):
        code = _code(exc)
        if code in _GONE_CODES:
            return Fault.GONE
        if code in _TRANSIENT_CODES or isinstance(exc, _TRANSIENT_TYPES):
            return Fault.TRANSIENT
        return Fault.FATAL
    if isinstance(exc, _TRANSIENT_TYPES) or _torn_down(exc) or _cluster_unreachable(exc):
        return Fault.TRANSIENT
    return Fault.FATAL


def is_transient(exc: BaseException) -> bool:
    """True when backing off and retrying may cure ``exc``."""
    return classify(exc) is Fault.TRANSIENT
