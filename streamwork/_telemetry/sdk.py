"""Install an OpenTelemetry SDK for ``streamwork run``: OTLP export and/or a Prometheus
scrape endpoint. Libraries embedding streamwork configure their own SDK instead.

OTLP follows the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_PROTOCOL`` = ``http/protobuf`` (default) or ``grpc``,
``OTEL_SERVICE_NAME``, ``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_METRIC_EXPORT_INTERVAL``, ...).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any, Final

from streamwork.errors import StreamworkError

#: variables whose presence switches OTLP export on without --otlp
OTLP_SWITCHES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def otlp_requested(flag: bool) -> bool:
    """True when --otlp was given or the standard OTEL_* variables ask for OTLP."""
    wanted = os.environ.get("OTEL_TRACES_EXPORTER", "") == "otlp"
    return flag or wanted or any(os.environ.get(v) for v in OTLP_SWITCHES)


def _missing(extra: str, exc: ImportError) -> StreamworkError:
    return StreamworkError(
        f"{exc.name or 'a package'} is not installed: pip install 'streamwork[{extra}]'")


#: where the Prometheus endpoint listens unless --metrics-host says otherwise: loopback, so
#: nothing is exposed beyond the machine by default
DEFAULT_METRICS_HOST: Final = "127.0.0.1"


def configure(*, otlp: bool, metrics_port: int | None,
              metrics_host: str = DEFAULT_METRICS_HOST) -> Callable[[], None]:
    """Install tracer and meter providers; returns a function that flushes and shuts down.

    With ``metrics_port``, a Prometheus scrape endpoint listens on ``metrics_host``:
    ``metrics_port`` (``0.0.0.0`` or ``::`` to let a scraper in another pod reach it).
    Raises StreamworkError when an extra is missing or the address cannot be bound."""
    if not otlp and metrics_port is None:
        return lambda: None
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise _missing("otlp", exc) from exc
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "streamwork")})
    readers: list[MetricReader] = []
    tracer_provider: Any = None
    metrics_server: Any = None
    if otlp:
        span_exporter, metric_exporter = _otlp_exporters()
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(tracer_provider)
        readers.append(PeriodicExportingMetricReader(metric_exporter))
    if metrics_port is not None:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import start_http_server
        except ImportError as exc:
            raise _missing("prometheus", exc) from exc
        try:
            started = start_http_server(metrics_port, addr=metrics_host)
        except OSError as exc:  # in use, or not an address of this machine
            raise StreamworkError(
                f"cannot serve Prometheus metrics on {metrics_host}:{metrics_port} ({exc}): "
                "give a free --metrics-port and a --metrics-host this machine has "
                "(127.0.0.1, 0.0.0.0 for every interface)") from exc
        # prometheus_client >= 0.17 hands back (server, thread): closed by shutdown()
        metrics_server = started[0] if isinstance(started, tuple) else None
        readers.append(PrometheusMetricReader())
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    metrics.set_meter_provider(meter_provider)

    def shutdown() -> None:
        if tracer_provider is not None:
            tracer_provider.shutdown()
        meter_provider.shutdown()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()

    return shutdown


def _otlp_exporters() -> tuple[Any, Any]:
    grpc = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") == "grpc"
    base = "opentelemetry.exporter.otlp.proto." + ("grpc" if grpc else "http")
    try:
        traces = importlib.import_module(f"{base}.trace_exporter")
        metric = importlib.import_module(f"{base}.metric_exporter")
    except ImportError as exc:
        raise _missing("otlp", exc) from exc
    return traces.OTLPSpanExporter(), metric.OTLPMetricExporter()
