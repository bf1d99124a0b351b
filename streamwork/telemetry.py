"""OpenTelemetry glue (API only: no-op until the application configures an SDK)."""

from __future__ import annotations

from opentelemetry import propagate


def inject(headers: dict[str, str]) -> None:
    """Add the current trace context (W3C ``traceparent``) to a job's headers."""
    propagate.inject(headers)
