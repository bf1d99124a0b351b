"""A paused consumer group, as its Redis hash holds it (``GroupKeys.paused``); pure.

The hash has two fields: ``reason`` (UTF-8 text, may be empty) and ``since`` (Unix ms of
the pause). No hash: the group runs. Producers write it, workers, ``inspect`` and the
dashboard read it, all through here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from streamwork.errors import ConfigError

MAX_REASON_CHARS: Final = 1000  #: longest pause reason accepted: it is shown, not stored data


@dataclass(frozen=True, slots=True)
class PauseState:
    """Why and since when a consumer group is paused (``Producer.paused``): its workers
    start no job until it is resumed."""

    reason: str  #: what the operator said ("" when nothing)
    since: float  #: when it was paused, Unix seconds


def pause_fields(reason: object, now_ms: int) -> dict[str, str | int]:
    """The hash fields of a pause with ``reason``, made at ``now_ms``; ConfigError for a
    reason that is not text."""
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise ConfigError("reason", f"must be a str (why the group is paused), got {reason!r}")
    if len(reason) > MAX_REASON_CHARS:
        raise ConfigError("reason", f"must be at most {MAX_REASON_CHARS} characters, got "
                                    f"{len(reason)}: say why in a sentence")
    try:
        reason.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("reason", "must be valid UTF-8 text") from None
    return {"reason": reason, "since": now_ms}


def parse_pause(raw: Any) -> PauseState | None:
    """The state an ``HGETALL`` of the pause hash answered (None: not paused). Fields that
    do not parse still mean paused: a hash that is there pauses the group."""
    if not raw:
        return None
    got = {_text(k): v for k, v in raw.items()}
    try:
        since = int(got.get("since") or 0) / 1000
    except ValueError:
        since = 0.0
    return PauseState(_text(got.get("reason") or b""), since)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
