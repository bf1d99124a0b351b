"""Logger names and the one helper that shapes structured fields for log records.

The library installs no handlers; the CLI configures output (text or JSON).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

#: the logger of a worker's delivery loop and its background loops (one name, so log
#: configuration does not depend on how the package splits its modules)
WORKER_LOGGER: Final = "streamwork.worker"


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: the given structured fields, Nones dropped. The names are
    those of the OpenTelemetry attributes: stream, group, consumer, key, entry_id, attempt,
    duration_ms, outcome, error_type, reason, count."""
    return {"sw": {k: v for k, v in values.items() if v is not None}}


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...``: readable, still greppable."""

    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        extra = getattr(record, "sw", None)
        if extra:
            base += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return base


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        out.update(getattr(record, "sw", None) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Set up root logging for the CLI: text or JSON lines on stderr."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
