"""OpenTelemetry: spans across producer and consumer, counters, histogram, gauges,
OTLP export to a real receiver, and the Prometheus scrape endpoint."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import redis
from opentelemetry import metrics, trace
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamwork as sw
from streamwork._redis.server import free_port
from streamwork._telemetry.api import DURATION_BUCKETS
from streamwork._wire.keys import StreamKeys
from streamwork._worker.core.loops import gauges
from streamwork._worker.features import FEATURES
from streamwork.testing import await_for, run_until_idle, wait_for
from tests.workers.ledger import LedgerWorker

STREAM = "jobs"
_SPANS = InMemorySpanExporter()
_READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def _sdk() -> None:
    """Install an in-memory SDK once (OpenTelemetry allows one global provider)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_SPANS))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))


def _points(name: str) -> list[Any]:
    data = _READER.get_metrics_data()
    found = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def _total(name: str, **attrs: str) -> float:
    return sum(p.value for p in _points(name)
               if all(p.attributes.get(k) == v for k, v in attrs.items()))


async def test_consumer_span_is_a_child_of_the_producer_span(
    redis_url: str, r: redis.Redis
) -> None:
    """The consumer span of a delivery lives in the producer's trace, under its span."""
    _SPANS.clear()
    producer = sw.Producer.from_url(redis_url)
    producer.send(STREAM, {}, key="traced")
    await run_until_idle(LedgerWorker.from_url(redis_url), r)
    spans = _SPANS.get_finished_spans()
    send = [s for s in spans if s.name == f"send {STREAM}"]
    process = [s for s in spans if s.name == f"process {STREAM}"]
    assert len(send) == 1 and len(process) == 1
    assert process[0].context.trace_id == send[0].context.trace_id
    assert process[0].parent is not None and process[0].parent.span_id == send[0].context.span_id
    assert process[0].kind == trace.SpanKind.CONSUMER
    attrs = process[0].attributes or {}
    assert attrs["messaging.system"] == "redis"
    assert attrs["messaging.destination.name"] == STREAM
    assert attrs["messaging.consumer.group.name"] == "testers"
    assert attrs["streamwork.outcome"] == "acked"
    producer.close()


async def test_each_outcome_counts_and_the_duration_is_recorded(
    redis_url: str, r: redis.Redis
) -> None:
    """produced/consumed/acked/retried/dead_lettered counters move by what happened."""
    before = {w: _total(f"streamwork.messages.{w}", stream=STREAM)
              for w in ("produced", "consumed", "acked", "retried", "dead_lettered")}
    hist_before = sum(p.count for p in _points("streamwork.handler.duration"))
    producer = sw.Producer.from_url(redis_url)
    producer.send_many(STREAM, [{}] * 5 + [{"fail_until": 2}, {"dead": True}])
    _SPANS.clear()
    await run_until_idle(LedgerWorker.from_url(redis_url), r)
    after = {w: _total(f"streamwork.messages.{w}", stream=STREAM) for w in before}
    delta = {w: after[w] - before[w] for w in before}
    assert delta == {"produced": 7, "consumed": 8, "acked": 6, "retried": 1,
                     "dead_lettered": 1}, delta
    assert sum(p.count for p in _points("streamwork.handler.duration")) - hist_before == 8
    # bucket bounds in seconds, not OpenTelemetry's default (which suits milliseconds)
    assert all(tuple(p.explicit_bounds) == DURATION_BUCKETS
               for p in _points("streamwork.handler.duration"))
    # the outcome attribute says how (the README lists its values)
    assert _total("streamwork.messages.acked", stream=STREAM, outcome="success") >= 6
    assert _total("streamwork.messages.retried", stream=STREAM, outcome="error") >= 1
    assert _total("streamwork.messages.dead_lettered", stream=STREAM,
                  outcome="dead_letter") >= 1
    outcomes = sorted((s.attributes or {}).get("streamwork.outcome", "")
                      for s in _SPANS.get_finished_spans() if s.name.startswith("process"))
    assert outcomes == ["acked"] * 6 + ["dead_lettered", "retried"]
    failed = [s for s in _SPANS.get_finished_spans()
              if (s.attributes or {}).get("streamwork.outcome") == "retried"]
    assert failed[0].events and failed[0].events[0].name == "exception"
    assert failed[0].status.status_code == trace.StatusCode.ERROR
    producer.close()


class Chaining(sw.StreamWorker):
    """Sends two jobs to ``chained`` per job, then fails while the attempt is below the
    payload's ``fail_until`` (its sends dropped with the failed completion)."""

    stream = "chaining"
    group = "testers"
    read_block = 0.1
    retry_delay = 0.05

    async def handle(self, msg: sw.Message) -> None:
        msg.send_many("chained", [{}, {}])
        if msg.attempt < msg.payload.get("fail_until", 0):
            raise RuntimeError("fails after sending")


async def test_chained_jobs_count_as_produced_once_their_job_completes(
        redis_url: str, r: redis.Redis) -> None:
    """A handler's msg.send counts in ``produced`` of the target stream, as Producer.send
    does, only for completions that wrote them (not for an attempt that failed)."""
    before = _total("streamwork.messages.produced", stream="chained")
    with sw.Producer.from_url(redis_url) as producer:
        producer.send_many("chaining", [{}, {}, {"fail_until": 2}])
    worker = Chaining.from_url(redis_url)
    await run_until_idle(worker, r)
    assert worker.counts["retried"] == 1
    assert r.xlen("chained") == 6
    assert worker.counts["produced"] == 6
    assert _total("streamwork.messages.produced", stream="chained") - before == 6


async def test_gauges_read_real_lag_pending_delayed_dead(redis_url: str, r: redis.Redis) -> None:
    """The stream gauges report what XINFO, ZCARD, XLEN and XPENDING say."""
    stream = "gauged"  # a stream no other test's worker reports on
    keys = StreamKeys.for_stream(stream)
    producer = sw.Producer.from_url(redis_url)
    producer.send_many(stream, [{}] * 6)
    producer.send(stream, {}, delay=3600)
    r.xgroup_create(stream, "testers", id="0")
    read = r.xreadgroup("testers", "someone", {stream: ">"}, count=2)
    first_id = read[0][1][0][0]
    r.xclaim(stream, "testers", "someone", 0, [first_id], idle=5000, justid=True)
    r.xadd(keys.dead, {"reason": "x"})
    worker = LedgerWorker.from_url(redis_url, stream=stream)
    from streamwork._worker.core.consumer import Consumer

    consumer = Consumer(worker.handle, worker.config, worker.url, "probe",
                        features=FEATURES)
    await gauges.read_gauges(consumer.ctx)
    await consumer.redis.aclose()

    def gauge(what: str) -> float:
        points = [p for p in _points(f"streamwork.stream.{what}")
                  if p.attributes.get("stream") == stream]
        assert len(points) == 1, points
        return float(points[0].value)

    assert gauge("pending") == 2
    assert gauge("lag") == 4
    assert gauge("delayed") == 1
    assert gauge("dead") == 1
    assert 5.0 <= gauge("oldest_pending_idle") < 30.0  # idle 5 s when read (XCLAIM IDLE)
    producer.close()


async def test_gauges_and_spans_count_the_priority_levels(
        redis_url: str, r: redis.Redis) -> None:
    """Lag and pending gauges include the jobs sent at high and low; a delivery's span
    says its level."""
    from streamwork._wire.priorities import sibling_streams

    stream = "leveled"  # a stream no other test's worker reports on
    high, low = sibling_streams(StreamKeys.for_stream(stream))
    producer = sw.Producer.from_url(redis_url)
    producer.send(stream, {})
    producer.send_many(stream, [{}] * 2, priority="high")
    producer.send_many(stream, [{}] * 3, priority="low")
    for name in (stream, high, low):
        r.xgroup_create(name, "testers", id="0")
    r.xreadgroup("testers", "someone", {high: ">"}, count=1)
    worker = LedgerWorker.from_url(redis_url, stream=stream)
    from streamwork._worker.core.consumer import Consumer

    consumer = Consumer(worker.handle, worker.config, worker.url, "probe",
                        features=FEATURES)
    await gauges.read_gauges(consumer.ctx)
    await consumer.redis.aclose()

    def gauge(what: str) -> float:
        points = [p for p in _points(f"streamwork.stream.{what}")
                  if p.attributes.get("stream") == stream]
        assert len(points) == 1, points
        return float(points[0].value)

    assert gauge("pending") == 1
    assert gauge("lag") == 1 + 1 + 3
    _SPANS.clear()
    producer.send(STREAM, {}, key="urgent", priority="high")
    await run_until_idle(LedgerWorker.from_url(redis_url), r)
    [span] = [s for s in _SPANS.get_finished_spans() if s.name == f"process {STREAM}"]
    assert (span.attributes or {})["streamwork.priority"] == "high"
    producer.close()


async def test_paused_gauge_follows_the_pause(redis_url: str) -> None:
    """``streamwork.stream.paused`` is 1 while the worker's group is paused, 0 otherwise,
    set by the worker's own read of the pause (once a second)."""
    stream = "gauged-pause"  # a stream no other test's worker reports on

    def paused() -> float | None:
        points = [p for p in _points("streamwork.stream.paused")
                  if p.attributes.get("stream") == stream]
        return float(points[0].value) if points else None

    worker = LedgerWorker.from_url(redis_url, stream=stream)
    task = asyncio.create_task(worker.serve())
    try:
        await await_for(lambda: paused() == 0.0, timeout=20, message="gauge at 0")
        async with sw.AsyncProducer.from_url(redis_url) as p:
            await p.pause(stream, worker.config.group, reason="gauge")
            await await_for(lambda: paused() == 1.0, timeout=20, message="gauge at 1")
            await p.resume(stream, worker.config.group)
            await await_for(lambda: paused() == 0.0, timeout=20, message="gauge back to 0")
    finally:
        worker.stop()
        await task
    points = [p for p in _points("streamwork.stream.paused")
              if p.attributes.get("stream") == stream]
    assert [dict(p.attributes) for p in points] == [{"stream": stream, "group": "testers"}]


class _Receiver(BaseHTTPRequestHandler):
    bodies: dict[str, list[bytes]] = {"/v1/traces": [], "/v1/metrics": []}

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(name="receiver")
def _receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Receiver)
    for v in _Receiver.bodies.values():
        v.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _received_spans() -> list[Any]:
    spans = []
    for body in _Receiver.bodies.get("/v1/traces", []):
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    return spans


def _received_metric_names() -> set[str]:
    names = set()
    for body in _Receiver.bodies.get("/v1/metrics", []):
        req = ExportMetricsServiceRequest.FromString(body)
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name.startswith("streamwork.messages") and any(
                        a.key == "stream" and a.value.string_value == STREAM
                        for p in m.sum.data_points for a in p.attributes
                    ):
                        names.add(m.name)
    return names


def test_worker_process_exports_spans_and_metrics_over_otlp(
    redis_url: str, r: redis.Redis, receiver: str, spawn_worker: Any
) -> None:
    """`streamwork run --otlp` delivers consumer spans (in the producer's trace) and
    metrics to an OTLP/HTTP receiver."""
    _SPANS.clear()
    producer = sw.Producer.from_url(redis_url)
    producer.send(STREAM, {}, key="otlp-job")
    send = next(s for s in _SPANS.get_finished_spans() if s.name == f"send {STREAM}")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_METRIC_EXPORT_INTERVAL": "300", "OTEL_SERVICE_NAME": "sw-test"}
    proc = spawn_worker("tests.workers.ledger:LedgerWorker", redis_url, "--otlp", env=env)
    wait_for(lambda: [s for s in _received_spans() if s.name == f"process {STREAM}"], 30,
             message="the consumer span at the receiver")
    span = next(s for s in _received_spans() if s.name == f"process {STREAM}")
    assert span.trace_id == send.context.trace_id.to_bytes(16, "big")
    assert span.parent_span_id == send.context.span_id.to_bytes(8, "big")
    wait_for(lambda: {"streamwork.messages.consumed", "streamwork.messages.acked"}
             <= _received_metric_names(), 30, message="counters at the receiver")
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 0
    producer.close()


def test_prometheus_endpoint_serves_the_counters(
    redis_url: str, r: redis.Redis, spawn_worker: Any
) -> None:
    """`streamwork run --metrics-port` serves streamwork counters to a Prometheus scrape."""
    port = free_port()
    spawn_worker("tests.workers.ledger:LedgerWorker", redis_url, "--metrics-port", str(port))
    sw.Producer.from_url(redis_url).send_many(STREAM, [{}] * 10)

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                text: str = resp.read().decode()
        except OSError:
            return ""
        for line in text.splitlines():
            ours = line.startswith("streamwork_messages_acked_total{") and STREAM in line
            if ours and float(line.rsplit(" ", 1)[1]) >= 10:
                return text
        return ""

    text = wait_for(scrape, 30, message="acked_total >= 10 in the scrape")
    assert "streamwork_handler_duration_seconds_bucket" in text


async def test_duplicates_count_as_deduplicated(redis_url: str, r: redis.Redis) -> None:
    """A job sent twice under one key with dedup on counts once as deduplicated."""
    from tests.workers.ledger import DedupLedgerWorker

    before = _total("streamwork.messages.deduplicated", stream=STREAM)
    producer = sw.Producer.from_url(redis_url)
    producer.send(STREAM, {}, key="same")
    await run_until_idle(DedupLedgerWorker.from_url(redis_url), r)
    producer.send(STREAM, {}, key="same")
    await run_until_idle(DedupLedgerWorker.from_url(redis_url), r)
    assert _total("streamwork.messages.deduplicated", stream=STREAM) - before == 1
    assert r.hget("ledger", "same") == b"1"
    producer.close()


async def test_counters_exist_at_zero_from_the_start(redis_url: str, r: redis.Redis) -> None:
    """A worker that has handled nothing yet already reports its group's counters at 0, so
    an alert's increase() sees the first dead letter or retry."""
    stream = "quiet"  # nothing is ever sent to it
    r.xgroup_create(stream, "idlers", id="0", mkstream=True)
    worker = LedgerWorker.from_url(redis_url, stream=stream, group="idlers")
    task = asyncio.create_task(worker.serve())
    try:
        def there() -> bool:
            return all(any(p.attributes.get("stream") == stream and p.value == 0
                           for p in _points(f"streamwork.messages.{what}"))
                       for what in ("consumed", "acked", "retried", "dead_lettered"))
        await await_for(there, timeout=10, message="zero counters of the quiet stream")
    finally:
        worker.stop()
        await task
