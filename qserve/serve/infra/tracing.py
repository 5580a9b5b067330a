"""OpenTelemetry traces of served requests: on when OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_TRACES_EXPORTER) is set.

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_SERVICE_NAME=qserve qserve serve models/x/variants/ov-int8

Off, only this module's standard-library part is imported and a request pays one `is None` check. On, a request
collects timestamps (RequestTrace) and its spans are built when it ends, so the batcher and the runtime never call
OpenTelemetry. The spans and the OTEL_* variables: docs/serving.md, Traces.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qserve import QserveError, __version__
from qserve.extras import require

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from qserve.runtime.base import Phase

log = logging.getLogger("qserve.serve")
TRACE_KEY = "qserve_trace"
"""Where a request's RequestTrace lives in its ASGI scope's state (and in the gRPC service's stand-in scope)."""
TRACE_HEADER = "x-trace-id"
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")


def wanted(environ: Mapping[str, str] | None = None) -> str | None:
    """The span exporter the environment asks for (otlp, console), or None: tracing off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    chosen = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if chosen:
        first = chosen.split(",")[0].strip()
        if first not in EXPORTERS:
            raise QserveError(
                f"OTEL_TRACES_EXPORTER={chosen!r}: qserve exports traces with one of {', '.join(EXPORTERS)}"
            )
        return None if first == "none" else first
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return "otlp"
    return None


def from_env(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing as the OTEL_* environment configures it, or None (off: nothing is imported)."""
    env = os.environ if environ is None else environ
    kind = wanted(env)
    if kind is None:
        return None
    on = "tracing (on: OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_ENDPOINT is set)"
    require("opentelemetry.sdk.trace", on)  # the SDK, before anything of it is imported
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if kind == "console":
        exporter: Any = ConsoleSpanExporter()  # one of three OpenTelemetry exporter classes (no stubs: Any anyway)
    else:
        protocol = (
            (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
            .strip()
            .lower()
        )
        if protocol not in PROTOCOLS:
            raise QserveError(
                f"OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL={protocol!r}: qserve exports OTLP over {' or '.join(PROTOCOLS)}"
            )
        module = require(
            f"opentelemetry.exporter.otlp.proto.{'grpc' if protocol == 'grpc' else 'http'}.trace_exporter",
            f"OTLP over {protocol}",
        )
        exporter = module.OTLPSpanExporter()  # endpoint, headers, timeout: from the OTEL_EXPORTER_OTLP_* variables
    # An explicit attribute would override OTEL_SERVICE_NAME, so name the service only when it is not set.
    attrs = {"service.version": __version__}
    if not env.get("OTEL_SERVICE_NAME"):
        attrs["service.name"] = "qserve"
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: %s spans%s", kind, f" over OTLP {protocol}" if kind == "otlp" else "")
    return Tracing(provider)


class Tracing:
    """One app's tracer (its own provider, not the process-global one: tests run several apps in one process)."""

    def __init__(self, provider: TracerProvider):
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("qserve.serve", __version__)

    def begin(self, name: str, carrier: Mapping[str, str], attributes: Mapping[str, Any] | None = None) -> RequestTrace:
        """Open the request's server span now, under the client's traceparent (from `carrier`) if any."""
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        start = time.time_ns()
        root = self.tracer.start_span(
            name,
            context=extract(dict(carrier)),
            kind=SpanKind.SERVER,
            start_time=start,
            attributes=dict(attributes or {}),
        )
        return RequestTrace(self, root, start)

    def shutdown(self) -> None:
        """Export what is still buffered, then stop the exporter (the app's shutdown calls this)."""
        self.provider.shutdown()


class RequestTrace:
    """Timestamps one request collects while it runs; finish() turns them into spans."""

    def __init__(self, tracing: Tracing, root: Span, start_ns: int):
        self.tracing = tracing
        self.root = root
        self.start_ns = start_ns
        self.queued_ns: int | None = None
        self.answered_ns: int | None = None
        self.phases: list[Phase] = []
        self.trace_id = format(root.get_span_context().trace_id, "032x")

    def queued(self) -> None:
        self.queued_ns = time.time_ns()

    def answered(self, phases: list[Phase]) -> None:
        self.answered_ns = time.time_ns()
        self.phases = phases

    def finish(self, status: int, attributes: Mapping[str, Any] | None = None) -> None:
        """End the request now: its step spans from the collected times, then the server span."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        end = time.time_ns()
        root, tracer = self.root, self.tracing.tracer
        parent = trace.set_span_in_context(root)

        def child(step: str, t0: int, t1: int, attrs: Mapping[str, Any] | None = None) -> None:
            tracer.start_span(step, context=parent, start_time=t0, attributes=dict(attrs or {})).end(end_time=t1)

        child("receive", self.start_ns, self.queued_ns or end)
        if self.queued_ns is not None and self.phases:
            child("queue wait", self.queued_ns, max(self.queued_ns, min(p[1] for p in self.phases)))
        for step, t0, t1, attrs in self.phases:
            child(step, t0, t1, attrs)
        if self.answered_ns is not None:
            child("respond", self.answered_ns, end)
        for k, v in (attributes or {}).items():
            root.set_attribute(k, v)
        if status >= 500:
            root.set_status(Status(StatusCode.ERROR, f"status {status}"))
        root.end(end_time=end)
