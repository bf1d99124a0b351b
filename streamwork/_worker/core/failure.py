"""What becomes of a failed job: retried (after a backoff), dead-lettered or cancelled.
The runner decides it here (pure), the flusher writes it (a fail.lua row) and, once Redis
has it, reports it (a counter and one log line)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

from streamwork._redis.replies import FailAction, Failed
from streamwork._telemetry.logs import WORKER_LOGGER, cap, error_message, seconds, traceback_text
from streamwork._text import text
from streamwork._wire.message import Message
from streamwork._wire.records import record_error
from streamwork._worker.core.context import Context
from streamwork._worker.core.delivery import Delivery
from streamwork._worker.core.options import CoreConfig
from streamwork._worker.core.retry import retry_delay_for
from streamwork.errors import DeadLetter, Retry

log = logging.getLogger(WORKER_LOGGER)

TRACEBACK_LIMIT: Final = 2000  #: characters of traceback kept in a dead letter
CANCELLED_QUEUED: Final = "cancelled:queued"  #: a Failure's reason: cancelled, never started


class HandlerTimeout(Exception):
    """A handler ran past its job's time limit (``timeout``)."""


class JobCancelled(Exception):
    """The job was cancelled (``producer.cancel``) while its handler ran."""


def overran(limit: float | None, cancelled: bool) -> HandlerTimeout:
    """The error of a job past its time limit: its async handler ``cancelled``, or its
    thread abandoned."""
    return HandlerTimeout(
        f"the handler ran longer than its time limit of {limit or 0:g} s (timeout) and was "
        f"{'cancelled' if cancelled else 'abandoned; its late outcome is dropped'}")


@dataclass(slots=True)
class Failure:
    """A failed delivery (or one that can never run) on its way to fail.lua."""

    delivery: Delivery | None
    entry_id: bytes
    src: int
    action: FailAction
    delay_ms: int
    attempts: int
    reason: str
    error_type: str
    detail: str
    job_key: str = ""
    body: bytes = b""
    error: BaseException | None = None
    took_ms: float | None = None  # how long the handler ran (for the failure's log line)
    traceback: str = ""  # the error's traceback, capped (for a dead letter's log line)
    ends: Any = None  # an `ends.EndReport` of a delivery-less one (else the delivery's)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A failed job's fate: what fail.lua is asked to do, why, and after how long (s)."""

    action: FailAction
    reason: str
    delay: float = 0.0


def decide(exc: BaseException, msg: Message, timed_out: bool, cfg: CoreConfig) -> Verdict:
    """The fate of ``msg``'s job whose handler raised ``exc`` (``timed_out``: it ran past
    its time limit): cancelled whatever it raised if its job was cancelled; dead-lettered
    if it asked for it (DeadLetter) or used its last attempt; else retried after the
    backoff, or after the delay it asked for (``Retry(delay=...)``)."""
    if msg.cancelled:
        return Verdict(FailAction.CANCEL, "cancelled")
    if isinstance(exc, DeadLetter):
        return Verdict(FailAction.DEAD, f"dead_letter: {text(exc.reason)}")
    if msg.attempt >= cfg.max_deliveries:
        return Verdict(FailAction.DEAD, "timeout" if timed_out else "max_deliveries")
    explicit = exc.delay if isinstance(exc, Retry) else None
    return Verdict(FailAction.RETRY, "timeout" if timed_out else "retry", retry_delay_for(
        msg.attempt, cfg.retry_delay, cfg.retry_max_delay, explicit=explicit))


def failure(d: Delivery, exc: Exception, verdict: Verdict, took_ms: float | None) -> Failure:
    """The record of ``d``'s failure for fail.lua and its log line: the error's type, its
    message with the traceback (capped), the job's body to dead-letter."""
    tb = traceback_text(exc, TRACEBACK_LIMIT)
    m = d.msg
    return Failure(d, d.entry_id, d.src, verdict.action, round(verdict.delay * 1000), m.attempt,
                   verdict.reason, type(exc).__name__, f"{error_message(exc, None)}\n{tb}",
                   m.key, d.body, exc, took_ms=took_ms, traceback=tb)


def fail_row(f: Failure) -> list[Any]:
    """``f`` as fail.lua reads it (one row of its MessagePack argument)."""
    d = f.delivery
    return [f.entry_id, f.src, f.action.value, f.delay_ms, f.attempts, f.job_key,
            d.lease_id if d else "", d.member if d else b"", f.reason, f.error_type,
            f.detail, f.body, record_error(f.error_type, f.detail) if f.job_key else ""]


def message(f: Failure) -> str:
    """The failure's message, capped: the exception's, or the detail of a delivery that
    never ran (undecodable, invalid payload, over max_deliveries on arrival)."""
    return error_message(f.error) if f.error is not None else cap(f.detail)


def described(f: Failure) -> str:
    """``"TypeError: unsupported operand ..."`` for a failure's log line."""
    said = message(f)
    return f"{f.error_type}: {said}" if said else f.error_type


def log_fields(f: Failure) -> dict[str, Any]:
    """The structured fields of a failure's log line (besides stream, group, consumer)."""
    return {"key": f.job_key or None, "entry_id": f.entry_id.decode(), "attempt": f.attempts,
            "duration_ms": f.took_ms, "error_type": f.error_type, "error": message(f),
            "reason": f.reason}


def report(ctx: Context, f: Failure, code: int) -> None:
    """fail.lua answered ``code`` (a `Failed`) for ``f``: count it and log its one line
    (retried, dead-lettered, cancelled) now that the outcome is known."""
    if code == Failed.RETRIED:
        ctx.count("retried", 1, "timeout" if f.reason == "timeout" else "error")
        log.warning("job failed: retrying in %s s: %s", seconds(f.delay_ms / 1000),
                    described(f), extra=ctx.fields(**log_fields(f), delay_ms=f.delay_ms))
    elif code == Failed.DEAD:
        ctx.count("dead_lettered", 1, f.reason.split(":", 1)[0])
        log.error("job dead-lettered (%s) after %d attempt%s: %s", f.reason, f.attempts,
                  "" if f.attempts == 1 else "s", described(f),
                  extra=ctx.fields(**log_fields(f), traceback=f.traceback or None))
    elif code == Failed.DROPPED:  # a feature ended it without running (seam.Drop)
        ctx.count(f.reason, 1)
        ctx.count("dropped", 1, f.reason)
        log.info("job %s: it did not run (%s)", f.reason, f.detail, extra=ctx.fields(
            key=f.job_key, entry_id=f.entry_id.decode(), attempt=f.attempts,
            reason=f.reason))
    elif code == Failed.CANCELLED and f.reason == CANCELLED_QUEUED:
        ctx.count("cancelled", 1, "queued")
        log.info("job cancelled before it started", extra=ctx.fields(
            key=f.job_key, entry_id=f.entry_id.decode(), attempt=f.attempts))
    elif code == Failed.CANCELLED:
        ctx.count("cancelled", 1, "running")
        log.warning("job cancelled while it ran: %s", described(f),
                    extra=ctx.fields(**log_fields(f)))
