"""Export streamwork traces and metrics over OTLP from your own process.

`streamwork run --otlp` does this for you; a service that embeds workers configures the
SDK itself, as here. Needs: pip install 'streamwork[otlp]'.
Run: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python examples/otel_otlp.py [URL]
"""

import sys

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import streamwork as sw
from streamwork.testing import RedisServer

resource = Resource.create({"service.name": "billing"})
tracer_provider = TracerProvider(resource=resource)
tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(tracer_provider)
meter_provider = MeterProvider(
    resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
metrics.set_meter_provider(meter_provider)


class Billing(sw.StreamWorker):
    stream = "orders"
    group = "billing"

    async def handle(self, msg: sw.Message) -> None:
        with trace.get_tracer("billing").start_as_current_span("charge card"):
            pass  # runs inside the consumer span, itself inside the producer's trace
        if msg.payload.get("last"):
            self.stop()


def main(url: str) -> None:
    with sw.Producer.from_url(url) as producer:
        producer.send_many("orders", [{"n": i} for i in range(9)] + [{"last": True}])
    Billing.from_url(url).run()
    tracer_provider.shutdown()
    meter_provider.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with RedisServer() as server:
            main(server.url)
