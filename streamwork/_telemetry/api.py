"""OpenTelemetry for streamwork: spans, metrics, context propagation (API only).

Everything here is a no-op until the application (or ``streamwork run --otlp`` /
``--metrics-port``) installs an SDK. Names (see docs/guides/observability.md): counters
``streamwork.messages.<what>`` and ``streamwork.lock.<what>``, the histogram
``streamwork.handler.duration`` and the gauges ``streamwork.stream.<what>``, with the
attributes ``stream``, ``group`` and ``outcome``. Spans use the messaging semantic
conventions (``messaging.system = "redis"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.metrics import CallbackOptions, Observation

from streamwork._text import text

SYSTEM: Final = "redis"  #: messaging.system of every span
COUNTERS: Final = (
    "produced", "consumed", "acked", "retried", "dead_lettered", "deduplicated", "reclaimed",
)
LOCK_COUNTERS: Final = ("contended", "lost", "unreachable")
GAUGES: Final = ("lag", "pending", "delayed", "dead", "oldest_pending_idle", "paused")

_PACKAGE: Final = "streamwork"
_tracer = trace.get_tracer(_PACKAGE)
_meter = metrics.get_meter(_PACKAGE)
_counters = {
    name: _meter.create_counter(f"streamwork.messages.{name}", unit="{message}",
                                description=f"messages {name.replace('_', ' ')}")
    for name in COUNTERS
}
_lock_counters = {
    name: _meter.create_counter(f"streamwork.lock.{name}", unit="{lock}",
                                description=f"job leases {name}")
    for name in LOCK_COUNTERS
}
#: bucket bounds of handler durations, in seconds (OpenTelemetry's default bounds, 0 to
#: 10000, suit milliseconds: with seconds nearly every job fell in the first bucket)
DURATION_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                           2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_duration = _meter.create_histogram(
    "streamwork.handler.duration", unit="s", description="time spent in handle()",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS)


@dataclass
class _GaugeBoard:
    """Last values read from Redis by each worker, reported by the observable gauges."""

    values: dict[tuple[str, str, str], float] = field(default_factory=dict)

    def observe(self, what: str) -> Iterable[Observation]:
        for (gauge, stream, group), value in list(self.values.items()):
            if gauge == what:
                attrs = {"stream": stream, "group": group} if group else {"stream": stream}
                yield Observation(value, attrs)


_board = _GaugeBoard()


def _gauge_callback(what: str) -> Any:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return _board.observe(what)

    return callback


for _what in GAUGES:
    _meter.create_observable_gauge(
        f"streamwork.stream.{_what}", callbacks=[_gauge_callback(_what)],
        description=f"{_what} of a stream (per group where it applies)")


def tracing_enabled() -> bool:
    """True once an SDK tracer provider is installed (spans would be recorded)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def metrics_enabled() -> bool:
    """True once an SDK meter provider is installed (instruments would record)."""
    return type(metrics.get_meter_provider()).__name__ not in (
        "_ProxyMeterProvider", "NoOpMeterProvider")


def set_gauges(stream: str, group: str, lag: float | None, pending: int, delayed: int,
               dead: int) -> None:
    """Record the latest stream figures for the observable gauges."""
    if lag is not None:
        _board.values[("lag", stream, group)] = lag
    else:  # Redis could not tell (entries deleted): report none rather than a stale one
        _board.values.pop(("lag", stream, group), None)
    _board.values[("pending", stream, group)] = pending
    _board.values[("delayed", stream, "")] = delayed
    _board.values[("dead", stream, "")] = dead


def set_oldest_pending_idle(stream: str, group: str, seconds: float) -> None:
    """Record how long the group's oldest pending delivery has been idle (0: none pending);
    over the visibility timeout, its consumer is dead or stalled."""
    _board.values[("oldest_pending_idle", stream, group)] = seconds


def set_paused(stream: str, group: str, paused: bool) -> None:
    """Record whether the group is paused (1) or runs (0), as its worker last read it."""
    _board.values[("paused", stream, group)] = 1.0 if paused else 0.0


def start_counting(stream: str, group: str) -> None:
    """Make the group's counters exist at 0 from the start (a counter series otherwise
    appears at its first increment, which ``increase()`` in an alert rule cannot see)."""
    attrs = {"stream": stream, "group": group}
    for counter in _counters.values():
        counter.add(0, attrs)
    for counter in _lock_counters.values():
        counter.add(0, attrs)


def count(what: str, n: int, stream: str, group: str = "", outcome: str | None = None) -> None:
    """Add ``n`` to ``streamwork.messages.<what>``."""
    if n:
        attrs = {"stream": stream, "group": group} if group else {"stream": stream}
        if outcome:
            attrs["outcome"] = outcome
        _counters[what].add(n, attrs)


def count_lock(what: str, n: int, stream: str, group: str) -> None:
    """Add ``n`` to ``streamwork.lock.<what>``."""
    if n:
        _lock_counters[what].add(n, {"stream": stream, "group": group})


def record_duration(seconds: float, stream: str, group: str, outcome: str) -> None:
    _duration.record(seconds, {"stream": stream, "group": group, "outcome": outcome})


def inject(headers: dict[str, str]) -> None:
    """Add the current trace context (W3C ``traceparent``) to a job's headers."""
    if tracing_enabled():
        propagate.inject(headers)


def producer_span(stream: str, count_: int = 1) -> Any:
    """A PRODUCER span around one send (``with producer_span(...):``); a no-op context
    when no SDK is installed."""
    if not tracing_enabled():
        return contextlib.nullcontext()
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.destination.name": stream,
        "messaging.operation.type": "send",
    }
    if count_ != 1:
        attrs["messaging.batch.message_count"] = count_
    return _tracer.start_as_current_span(f"send {stream}", kind=trace.SpanKind.PRODUCER,
                                         attributes=attrs)


def consumer_span(stream: str, group: str, entry_id: str, attempt: int, key: str,
                  headers: Mapping[str, str],
                  options: Mapping[str, Any] | None = None) -> trace.Span:
    """Start the CONSUMER span of one delivery, parented to the producer's context; its
    ``streamwork.priority`` is the level the job was sent at (from its job ``options``,
    ``msg.options``)."""
    parent = propagate.extract(headers) if "traceparent" in headers else context.Context()
    return _tracer.start_span(
        f"process {stream}", context=parent, kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": SYSTEM, "messaging.destination.name": stream,
            "messaging.consumer.group.name": group, "messaging.message.id": entry_id,
            "messaging.operation.type": "process", "messaging.redis.attempt": attempt,
            "streamwork.key": key, "streamwork.priority": (options or {}).get("priority", "normal"),
        })


def end_span(span: trace.Span | None, outcome: str, error: BaseException | None = None) -> None:
    """Close a delivery's span with its outcome (acked, retried, dead_lettered, lost, ...)."""
    if span is None:
        return
    span.set_attribute("streamwork.outcome", outcome)
    if error is not None:
        try:  # the SDK calls str() on it, which a user's exception may make raise
            span.record_exception(error)
        except Exception:
            span.add_event("exception", {"exception.type": type(error).__name__,
                                         "exception.message": text(error)})
        span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}"))
    span.end()
