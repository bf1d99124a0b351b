"""Logger names and the one helper that shapes structured fields for log records.

The CLI configures output (text or JSON). A worker run from Python (``run()``,
``serve()``) in an application that configured no logging at all gets the same text lines
on stderr (`ensure_logging`), which step aside as soon as the application configures its
own: without them an outage or a dead job would pass without a word.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import datetime, timezone
from typing import Any, Final

from streamwork._text import utf8

#: the logger of a worker's delivery loop and its background loops (one name, so log
#: configuration does not depend on how the package splits its modules)
WORKER_LOGGER: Final = "streamwork.worker"

ERROR_LIMIT: Final = 500  #: characters of an exception's message kept in a log line
CUT: Final = "…"  #: marks where a message or traceback was cut


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the given structured fields, Nones dropped. The names are
    those of the OpenTelemetry attributes: stream, group, consumer, key, entry_id, attempt,
    duration_ms, outcome, error_type, reason, count; failures add ``error`` (the message,
    see ``describe``), ``traceback`` (dead letters) and ``delay_ms`` (retries)."""
    return {"sw": {k: v for k, v in values.items() if v is not None}}


def cap(text: str, limit: int = ERROR_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, the cut marked (and how much was cut), so one
    huge message cannot flood the logs."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}{CUT} ({len(text) - limit} more characters)"


def error_message(exc: BaseException, limit: int | None = ERROR_LIMIT) -> str:
    """``str(exc)``, capped (``limit`` None: whole); an exception whose ``__str__`` raises
    falls back to its ``repr``, then to "<unprintable TypeName>": logging a failure never
    fails."""
    try:
        text = str(exc)
    except Exception:
        try:
            text = repr(exc)
        except Exception:
            text = f"<unprintable {_type_name(exc)}>"
    text = utf8(text)  # a lone surrogate (a file name) would fail to encode, in Redis too
    return text if limit is None else cap(text, limit)


def describe(exc: BaseException) -> str:
    """``"TypeError: unsupported operand ..."``: the exception's type and capped message,
    as failure lines show it."""
    message = error_message(exc)
    return f"{_type_name(exc)}: {message}" if message else _type_name(exc)


def error_fields(exc: BaseException | None) -> dict[str, str]:
    """``error_type`` and ``error`` (the capped message) of an exception, for ``fields``;
    none for None."""
    if exc is None:
        return {}
    return {"error_type": _type_name(exc), "error": error_message(exc)}


def traceback_text(exc: BaseException, limit: int) -> str:
    """The exception's formatted traceback, its last ``limit`` characters (the innermost
    frames and the error) with the cut marked; each part (a frame, an error's message) is
    capped first, so a huge message cannot push the frames out. Never raises."""
    try:
        parts = traceback.format_exception(exc)
    except Exception:
        return describe(exc)
    text = utf8("".join(cap(part.rstrip("\n")) + "\n" for part in parts).rstrip("\n"))
    return text if len(text) <= limit else CUT + text[-limit:]


def seconds(value: float) -> str:
    """A delay for a log line: ``0.05``, ``1.23``, ``300``."""
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _type_name(exc: BaseException) -> str:
    return type(exc).__name__


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...``: readable, still greppable. An
    ``error`` field the message already shows is not repeated; a ``traceback`` field
    follows on the next lines, as a logged exception's would."""

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extra = getattr(record, "sw", None)
        if extra:
            message = record.getMessage()
            pairs = " ".join(f"{k}={v}" for k, v in extra.items()
                             if k != "traceback" and not (k == "error" and str(v) in message))
            if pairs:
                base += " " + pairs
            if extra.get("traceback"):
                base += "\n" + str(extra["traceback"])
        return base


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": utc_time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(getattr(record, "sw", None) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def utc_time(created: float) -> str:
    """A record's time for JSON lines: ISO 8601 in UTC with its zone, to the millisecond
    (``2026-12-04T19:26:54.123Z``), the same on every host whatever its time zone."""
    when = datetime.fromtimestamp(created, tz=timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


#: the text lines of `streamwork run` (and of `ensure_logging`)
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Set up root logging for the CLI: text or JSON lines on stderr."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class _Fallback(logging.StreamHandler):  # type: ignore[type-arg]
    """The lines `ensure_logging` sets up: `streamwork run`'s text lines on stderr, on the
    ``streamwork`` logger, until the application configures logging of its own (a handler
    on the root logger or on a streamwork logger, even after the worker started): then it
    writes nothing more and gives the ``streamwork`` logger back its level, so no line is
    written twice and the application's levels rule. As a filter of the loggers streamwork
    writes to, it sees each record before any handler does: the first record after the
    application's change is held to the application's level too."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.setFormatter(TextFormatter(TEXT_FORMAT))
        self.set_level = False  # whether the streamwork logger's level is ours (INFO)
        self.retired = False
        self.gated: list[logging.Logger] = []  # the loggers this is a filter of

    def filter(self, record: logging.LogRecord) -> bool:
        """As a logger's filter: let ``record`` through unless the application has just
        configured logging and its level hides it. (As a handler's: always.)"""
        if self.retired or not _configured(self):
            return True
        self.retired = True
        if self.set_level:
            logging.getLogger(PACKAGE_LOGGER).setLevel(logging.NOTSET)
        for logger in self.gated:
            logger.removeFilter(self)
        return record.levelno >= logging.getLogger(record.name).getEffectiveLevel()

    def emit(self, record: logging.LogRecord) -> None:
        if self.retired or _configured(self):  # a logger without the filter: a late one
            self.filter(record)
            return
        self.stream = sys.stderr  # as lastResort does: stderr as it is now (tests swap it)
        super().emit(record)


#: the package's logger, parent of every streamwork logger (it holds a NullHandler)
PACKAGE_LOGGER: Final = "streamwork"
_fallback: _Fallback | None = None


def _streamwork_loggers() -> list[logging.Logger]:
    """The ``streamwork`` logger and those below it that exist now."""
    manager = logging.Logger.manager
    names = [PACKAGE_LOGGER, *(n for n in list(manager.loggerDict)
                               if n.startswith(PACKAGE_LOGGER + "."))]
    found = (manager.loggerDict.get(name) for name in names)
    return [logger for logger in found if isinstance(logger, logging.Logger)]


def _configured(ours: logging.Handler | None = None) -> bool:
    """Whether the application configured logging: a handler on the root logger, or one
    other than a NullHandler (and ``ours``) on a streamwork logger."""
    if any(h is not ours for h in logging.getLogger().handlers):
        return True
    return any(h is not ours and not isinstance(h, logging.NullHandler)
               for logger in _streamwork_loggers() for h in logger.handlers)


def ensure_logging() -> None:
    """If the application configured no logging at all (no handler on the root logger,
    none on a streamwork logger), set up what `streamwork run` shows: INFO and above as
    text lines on stderr. Logging the application did configure is never touched; the
    lines set up here step aside once it does (`_Fallback`). Once per process."""
    global _fallback
    if _fallback is not None or _configured():
        return
    handler = _fallback = _Fallback()
    package = logging.getLogger(PACKAGE_LOGGER)
    if package.level == logging.NOTSET and package.getEffectiveLevel() > logging.INFO:
        package.setLevel(logging.INFO)
        handler.set_level = True
    for logger in _streamwork_loggers():
        logger.addFilter(handler)
        handler.gated.append(logger)
    package.addHandler(handler)
