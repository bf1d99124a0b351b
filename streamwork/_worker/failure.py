"""What becomes of a failed job: retried (after a backoff), dead-lettered or cancelled.
Pure: the runner decides with it and the flusher writes what it decided."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from streamwork._redis.replies import FailAction
from streamwork._telemetry.logs import error_message, traceback_text
from streamwork._text import text
from streamwork._wire.message import Message
from streamwork._worker.config import WorkerConfig
from streamwork._worker.delivery import Delivery, Failure
from streamwork._worker.retry import retry_delay_for
from streamwork.errors import DeadLetter, Retry

TRACEBACK_LIMIT: Final = 2000  #: characters of traceback kept in a dead letter


class HandlerTimeout(Exception):
    """A handler ran past its job's time limit (``timeout``)."""


class JobCancelled(Exception):
    """The job was cancelled (``producer.cancel``) while its handler ran."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A failed job's fate: what fail.lua is asked to do, why, and after how long (s)."""

    action: FailAction
    reason: str
    delay: float = 0.0


def decide(exc: BaseException, msg: Message, timed_out: bool, cfg: WorkerConfig) -> Verdict:
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


def failure(d: Delivery, exc: Exception, verdict: Verdict, took_ms: float) -> Failure:
    """The record of ``d``'s failure for fail.lua and its log line: the error's type, its
    message with the traceback (capped), the job's body to dead-letter."""
    tb = traceback_text(exc, TRACEBACK_LIMIT)
    m = d.msg
    return Failure(d, d.entry_id, d.src, verdict.action, round(verdict.delay * 1000), m.attempt,
                   verdict.reason, type(exc).__name__, f"{error_message(exc, None)}\n{tb}",
                   m.key, d.body, exc, took_ms=took_ms, traceback=tb)
