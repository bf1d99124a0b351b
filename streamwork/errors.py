"""Every exception streamwork raises, and the two a handler raises to steer its job.

The tree, by what the caller does next::

    StreamworkError                  root: catch this to catch everything of ours
    ├── ConfigError (ValueError)     fix the option named in the message
    ├── PayloadTooLarge (ValueError) send less, or raise max_payload_bytes
    ├── RedisUnavailable             Redis could not be reached within the retry budget
    │   └── SendFailed               a send got no answer: ``outcome`` says if it was stored
    ├── PermissionDenied             the ACL user lacks a command or key: grant it
    ├── StreamNotFound               no such stream: check the name, --url and database
    ├── GroupNotFound                no such consumer group on the stream: check the name
    ├── WorkerFailed                 a worker stopped on an error it cannot ride out (a bug)
    ├── DecodeError                  an entry did not decode; it went to the dead letters
    ├── BenchError                   the benchmark could not complete (`streamwork bench`)
    ├── LockError
    │   ├── LockNotAcquired          no quorum (or the lock is held): try later
    │   └── LockLost                 the lease expired or was taken over: stop writing
    └── HandlerControl               control flow from handlers (not failures of ours)
        ├── Retry(delay=None)        run the job again after a backoff
        └── DeadLetter(reason)       give up now: move the job to the dead-letter stream
"""

from __future__ import annotations

from typing import Any, Final

from streamwork._text import credentials_hint, describe, redact_url

__all__ = [
    "BenchError",
    "ConfigError",
    "DeadLetter",
    "DecodeError",
    "GroupNotFound",
    "HandlerControl",
    "JobFailed",
    "LockError",
    "LockLost",
    "LockNotAcquired",
    "PayloadTooLarge",
    "PermissionDenied",
    "RedisUnavailable",
    "Retry",
    "SendFailed",
    "StreamNotFound",
    "StreamworkError",
    "WorkerFailed",
]


class StreamworkError(Exception):
    """Root of every streamwork error; each message says what happened and what to do."""


class ConfigError(StreamworkError, ValueError):
    """An option has a value streamwork cannot accept; the message names the option."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


class PayloadTooLarge(StreamworkError, ValueError):
    """A payload is larger than max_payload_bytes; nothing was enqueued."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"payload encodes to {size} bytes, over max_payload_bytes={limit}; nothing was "
            "enqueued. Store large data elsewhere and send a reference, or raise the limit."
        )


class RedisUnavailable(StreamworkError):
    """Redis did not answer within the retry budget; the operation did not complete. A
    send raises `SendFailed`, this error's subclass, instead: a write whose reply was lost
    may have completed, and it says what is known."""

    def __init__(self, what: str, url: str, cause: BaseException | None = None) -> None:
        self.url = url
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        super().__init__(
            f"{what}: Redis at {redact_url(url)} is unavailable{detail}. Check that the server "
            "runs, has memory to spare and takes writes (not a replica), and that "
            "the URL is right (--url or $REDIS_URL), then try again."
        )


#: where the rules each role needs are written down
ACL_GUIDE: Final = "the security guide (docs/guides/security.md, 'Access control (ACLs)')"


class PermissionDenied(StreamworkError):
    """Redis refused the connection's ACL user a command or a key (``NOPERM``): a missing
    permission, not an outage, so nothing retries it. ``user`` is the ACL user, ``command``
    the command refused where Redis names it (``xack``; None otherwise), ``keys`` the keys
    the refused call used where known, ``script`` the streamwork Lua script it ran in (or
    ""), ``grant`` the ``ACL SETUSER`` line that would let it through."""

    def __init__(self, user: str, refused: str, grant: str, detail: str, *,
                 command: str | None = None, keys: tuple[str, ...] = (),
                 script: str = "") -> None:
        self.user = user
        self.command = command
        self.keys = keys
        self.script = script
        self.grant = grant
        super().__init__(
            f"Redis refused ACL user {user!r} {refused} (NOPERM: {detail}). A permission "
            f"is missing; this is no outage and retrying cannot help: {grant}, or connect "
            f"as a user holding the rules of its role, see {ACL_GUIDE}.")


class SendFailed(RedisUnavailable):
    """A send (``send``, ``send_many``) got no answer from Redis within its time bound
    (``producer.send_bound``: ``retry_timeout`` plus twice the client's connect and socket
    timeouts; 34 s by default). What is known of its jobs ``keys``:

    * ``outcome == "not stored"``: no request of it can have reached Redis (every attempt
      failed to connect, or Redis refused it with an error): the jobs are not in the
      stream; sending them again is safe.
    * ``outcome == "unknown"``: a request may have reached Redis and its reply was lost (a
      timeout, or the connection lost after the request was written). The jobs are stored
      once or not at all, never twice by this send: its retries carried the same marker.
      Send them again with the same keys: if the first copy was stored, workers running
      with ``dedup`` acknowledge the second without running it (without dedup, both run).
      ``status(stream, key)`` tells a job a worker has taken.

    For ``send_many``, ``stored`` maps the keys of the jobs already stored (the chunks before
    the failing one) to their ids, and ``unsent`` lists the keys of the jobs after it, not
    sent. For ``send`` both are empty."""

    def __init__(self, what: str, url: str, cause: BaseException | None, *, stream: str,
                 outcome: str, keys: list[str], stored: dict[str, str] | None = None,
                 unsent: list[str] | None = None, waited: float = 0.0) -> None:
        self.stream = stream
        self.outcome = outcome
        self.keys = keys
        self.stored = stored or {}
        self.unsent = unsent or []
        self.waited = waited
        RedisUnavailable.__init__(self, what, url, cause)
        jobs = _jobs(keys)
        if outcome == "not stored":
            told = (f"{jobs} NOT stored: no request reached Redis (every attempt failed to "
                    "connect or was refused); sending again is safe.")
        else:
            told = (f"{jobs} stored once or not at all (a request may have reached Redis, "
                    "its reply was lost). Send again with the same keys: a second copy of a "
                    "stored job is acknowledged without running by workers with dedup on "
                    f"(without dedup it runs twice); status({stream!r}, key) tells a job a "
                    "worker has taken.")
        if self.stored:
            told += f" {len(self.stored)} earlier jobs of this send_many were stored (.stored)."
        if self.unsent:
            told += f" {len(self.unsent)} later jobs were not sent (.unsent)."
        self.args = (f"{what}: no answer from Redis at {redact_url(url)} within "
                     f"{waited:.1f} s{_detail(cause)}. {told}",)


def _jobs(keys: list[str]) -> str:
    if len(keys) == 1:
        return f"job {keys[0]!r} was"
    return f"its {len(keys)} jobs ({keys[0]!r} ... {keys[-1]!r}) were"


def _detail(cause: BaseException | None) -> str:
    return f" ({type(cause).__name__}: {cause})" if cause else ""


class StreamNotFound(StreamworkError):
    """The stream named does not exist (or is not a stream)."""

    def __init__(self, stream: str, detail: str = "does not exist") -> None:
        self.stream = stream
        super().__init__(
            f"stream {stream!r} {detail}. Run `streamwork inspect` with no STREAM to list "
            "the streams on this server (check --url / $REDIS_URL, and the database number)."
        )


class GroupNotFound(StreamworkError):
    """The stream has consumer groups, but not the one named (``groups``: those it has)."""

    def __init__(self, stream: str, group: str, groups: list[str]) -> None:
        self.stream = stream
        self.group = group
        self.groups = groups
        found = ", ".join(repr(g) for g in groups)
        super().__init__(
            f"stream {stream!r} has no consumer group {group!r}; its groups are {found}. "
            "Check the name (group=... in Python, --group on the command line); a group is "
            "created when its first worker starts.")


class WorkerFailed(StreamworkError):
    """A worker stopped because one of its internal loops met an error that backing off
    cannot cure (anything but connection loss, timeouts, LOADING, BUSY, TRYAGAIN,
    CLUSTERDOWN, MASTERDOWN, READONLY, OOM or a vanished group). It drained first; what it
    still held stays pending and is reclaimed by other workers. ``started`` False: it
    failed while starting (Redis refused it, ``on_start`` raised), before it held a job."""

    def __init__(self, task: str, cause: BaseException, *, started: bool = True) -> None:
        self.task = task
        self.cause = cause
        self.started = started
        if isinstance(cause, PermissionDenied):
            super().__init__(
                f"worker stopped: Redis refused its {task} a permission. {cause} "
                + ("It held no jobs yet; start" if not started else
                   "Held jobs stay pending for other workers; start")
                + " the worker again once its user has the permission.")
            return
        hint = credentials_hint(cause)
        what = (f"Redis refused its connection: {hint} (it said: {describe(cause)})" if hint
                else f"its {task} failed with {describe(cause)}")
        if not started:
            super().__init__(
                f"worker did not start: {what}. It held no jobs yet; fix the cause (its "
                "traceback is logged) and start the worker again.")
            return
        super().__init__(
            f"worker stopped: {what}. "
            "Held jobs stay pending for other workers; fix the cause (see the traceback "
            "in the log) and start the worker again."
        )


class JobFailed(StreamworkError):
    """``result()`` found the job dead (its attempts are spent, or its handler raised
    DeadLetter), cancelled, or ended by a worker without running (expired). ``status`` is
    the job's `JobStatus` (state, reason, error, dead-letter id)."""

    def __init__(self, status: Any) -> None:
        self.status = status
        self.reason: str = status.reason
        self.dead_letter_id: str | None = status.dead_letter_id
        if status.state == "cancelled":
            super().__init__(
                f"job {status.key!r} of group {status.group!r} on stream {status.stream!r} "
                f"was cancelled: {status.reason or 'no reason given'}. It will not run; "
                "send it again under a new key to run it.")
            return
        if status.state != "dead":  # a worker ended it without running it (expired, ...)
            super().__init__(
                f"job {status.key!r} of group {status.group!r} on stream {status.stream!r} "
                f"is {status.state}: {status.reason or 'it did not run'}. It will not run; "
                "send it again to run it.")
            return
        error = str(status.error or "").strip()
        replay = (f"`streamwork dlq replay {status.stream} --id {status.dead_letter_id}`"
                  if status.dead_letter_id
                  else f"`streamwork dlq replay {status.stream} --id ID` (ID from that list)")
        super().__init__(
            f"job {status.key!r} of group {status.group!r} on stream {status.stream!r} is "
            f"dead after {status.attempts} attempt(s): {status.reason or 'failed'}"
            + (f" ({error})" if error and "\n" not in error else "")
            + f". See it with `streamwork dlq list {status.stream}`; once the cause is "
            f"fixed, {replay} runs it again."
            # a traceback goes last, on lines of its own, so nothing it holds (or lacks)
            # can leave the sentences above unclosed
            + ("\nIts last error:\n" + "\n".join("  " + line for line in error.split("\n"))
               if "\n" in error else "")
        )


class DecodeError(StreamworkError):
    """A stream entry is not a valid streamwork envelope (``reason`` is a stable code); the
    entry went to the dead letters with its original fields, byte for byte. Also raised by
    a producer's ``status``/``result`` (reason ``result:invalid``) when its codec's
    decoder fails on a job's result."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


class BenchError(StreamworkError):
    """The benchmark could not complete (a run stalled, a dependency is missing)."""


class LockError(StreamworkError):
    """Base for lock problems; carries the lock's resource name."""

    def __init__(self, message: str, resource: str) -> None:
        self.resource = resource
        super().__init__(message)


class LockNotAcquired(LockError):
    """The lock could not be taken: held elsewhere, or too few instances answered."""

    def __init__(self, resource: str, granted: int, answered: int, total: int, quorum: int) -> None:
        self.granted = granted
        self.answered = answered
        self.total = total
        self.quorum = quorum
        super().__init__(
            f"lock {resource!r} not acquired: {granted} of {total} instances granted it "
            f"({answered} answered, quorum is {quorum}). It is held elsewhere or too many "
            "instances are down; retry later or pass blocking_timeout=.",
            resource,
        )


class LockLost(LockError):
    """The lease expired or another holder took it; writes under it must stop."""


class HandlerControl(StreamworkError):
    """Base of the exceptions a handler raises on purpose to steer its job."""


class Retry(HandlerControl):
    """Raise from a handler to run the job again; delay=None uses the worker's backoff."""

    # defaults for a subclass whose __init__ does not call this one
    delay: float | None = None
    reason: str = ""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and delay < 0:
            raise ConfigError("Retry.delay", f"must be >= 0 seconds or None, got {delay!r}")
        self.delay = delay
        self.reason = reason
        super().__init__(reason or "retry requested")


class DeadLetter(HandlerControl):
    """Raise from a handler to skip retries and move the job to the dead-letter stream."""

    reason: str = ""  # for a subclass whose __init__ does not call this one

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
