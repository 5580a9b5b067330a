"""Prometheus metrics for one app, in the app's own CollectorRegistry.

    curl -s 127.0.0.1:8000/metrics | grep qserve_batch_size

A registry per app (not the global REGISTRY) lets several apps live in one process, as tests and benchmarks do.
Request and model series carry a `model` label; a Batcher gets a ModelMetrics, the same names bound to its model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# A refusal should cost microseconds: these resolve 5 us .. 10 ms.
SERIES_CACHE = 4096
"""Request series (route, method, status, model) kept bound; more than this are looked up each time."""
REJECTION_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2)
QUEUE_WAIT_BUCKETS = (1e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, protocols: Sequence[str] = ("other",)) -> None:
        # protocols: the served protocols' metrics labels (router.Table.labels), for the help text
        self.registry = r = CollectorRegistry()
        m = ["model"]
        self.requests = Counter(
            "qserve_requests_total",
            "HTTP requests by route template, method, status and model",
            ["route", "method", "status", "model"],
            registry=r,
        )
        self.protocol = Counter(
            "qserve_protocol_requests_total",
            f"HTTP requests by protocol ({', '.join(protocols)}), status and model",
            ["protocol", "status", "model"],
            registry=r,
        )
        self.latency = Histogram(
            "qserve_request_latency_seconds",
            "HTTP request latency (server side)",
            ["route", "method", "status", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram("qserve_batch_size", "Texts per forward pass", m, buckets=BATCH_BUCKETS, registry=r)
        self.queue_depth = Gauge("qserve_queue_depth", "Texts waiting for a batch", m, registry=r)
        self.inference = Histogram(
            "qserve_inference_seconds", "Wall time of one batch in the runtime", m, buckets=LATENCY_BUCKETS, registry=r
        )
        self.texts = Counter("qserve_texts_total", "Texts classified", m, registry=r)
        self.truncated = Counter("qserve_truncated_texts_total", "Texts cut to the model's max_length", m, registry=r)
        self.batch_failures = Counter("qserve_batch_failures_total", "Batches whose runtime call raised", m, registry=r)
        self.rejected = Counter(
            "qserve_rejected_total", "Requests refused before inference, by reason", ["reason", "model"], registry=r
        )
        self.ready = Gauge("qserve_model_ready", "1 while the model is loaded and serving", m, registry=r)
        self.queue_wait = Histogram(
            "qserve_queue_wait_seconds",
            "Per admitted text: time from entering the queue to the start of its forward pass",
            m,
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.inline = Counter(
            "qserve_inline_batches_total",
            "Batches of a request alone in the server, run on the "
            "event loop instead of the inference thread (--inline-lone)",
            m,
            registry=r,
        )
        self.lane = Counter(
            "qserve_lane_batches_total",
            "Batches run in a lane: several at once, each on one "
            "single-threaded worker, while other requests are in the server",
            m,
            registry=r,
        )
        self.rejection = Histogram(
            "qserve_rejection_seconds",
            "Server time spent refusing a request before inference (429 queue full)",
            m,
            buckets=REJECTION_BUCKETS,
            registry=r,
        )
        self.connections = Gauge("qserve_open_connections", "HTTP connections open now", registry=r)
        self.connections_closed = Counter(
            "qserve_connections_closed_total",
            "Connections the server closed on its own, by reason "
            "(idle, header_timeout, body_timeout, keep_alive, connection_limit)",
            ["reason"],
            registry=r,
        )
        self.drain = Counter(
            "qserve_drain_requests_total",
            "Requests since the shutdown signal: answered during the drain, answered after it (queued or in "
            "flight when the listener closed), refused as the server stopped",
            ["phase"],
            registry=r,
        )
        self.drain_seconds = Gauge(
            "qserve_drain_seconds", "Seconds from the shutdown signal to the listener's close", registry=r
        )
        self.depth_parts: dict[str, dict[int, int]] = {}  # per model: each live batcher's queue depth
        # Lifecycle: loads, swaps and unloads by outcome; the version each model serves (value 1).
        self.loads = Counter(
            "qserve_model_loads_total",
            "Repository loads by outcome (loaded, swapped, refused) and unloads",
            ["model", "outcome"],
            registry=r,
        )
        self.version = Gauge(
            "qserve_model_version_info",
            "The version (manifest short hash) a model serves",
            ["model", "version"],
            registry=r,
        )
        # Shadow agreement (shadow.py): the served model against its reference on sampled live texts.
        self.shadow_agreement = Gauge(
            "qserve_shadow_agreement",
            "Rolling share of sampled texts whose label equals the reference's",
            m,
            registry=r,
        )
        self.shadow_dprob = Gauge(
            "qserve_shadow_abs_dprob",
            "Rolling quantiles of max |prob - reference prob| per sampled text",
            ["model", "quantile"],
            registry=r,
        )
        self.shadow_samples = Counter(
            "qserve_shadow_samples_total", "Sampled texts the reference re-scored", m, registry=r
        )
        self.shadow_dropped = Counter(
            "qserve_shadow_dropped_total",
            "Sampled texts dropped because the shadow queue was full (the reference could not keep up)",
            m,
            registry=r,
        )
        self._series: dict[tuple[str, str, int, str], tuple[Any, Any, Any]] = {}
        self.shadow_bar = Gauge(
            "qserve_shadow_agreement_bar", "The variant's agreement bar (its bench bar for its bits)", m, registry=r
        )

    def observe_request(
        self, route: str, method: str, status: int, seconds: float, model: str = "", protocol: str = "other"
    ) -> None:
        key = (route, method, status, model)
        series = self._series.get(key)
        if series is None:  # once per (route, method, status, model): labels() off the hot path
            labels = (route, method, str(status), model)
            series = (
                self.requests.labels(*labels),
                self.latency.labels(*labels),
                self.protocol.labels(protocol, str(status), model),
            )
            if len(self._series) < SERIES_CACHE:  # routes are templates, so this stays small; a bound all the same
                self._series[key] = series
        series[0].inc()
        series[1].observe(seconds)
        series[2].inc()

    def reject(self, reason: str, model: str = "") -> None:
        self.rejected.labels(reason, model).inc()

    def for_model(self, name: str) -> ModelMetrics:
        """The series one model's Batcher writes, bound to its label."""
        return ModelMetrics(self, name)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelMetrics:
    """What a Batcher records (batch_size, queue_depth, inference, texts, truncated, batch_failures,
    queue_wait, inline, lane), bound to one model's label. During a hot swap the old model's batcher drains beside the
    new one: the queue depth gauge shows the sum of both."""

    def __init__(self, metrics: Metrics, name: str):
        self.name = name
        self.batch_size = metrics.batch_size.labels(name)
        self.inference = metrics.inference.labels(name)
        self.texts = metrics.texts.labels(name)
        self.truncated = metrics.truncated.labels(name)
        self.batch_failures = metrics.batch_failures.labels(name)
        self.queue_wait = metrics.queue_wait.labels(name)
        self.inline = metrics.inline.labels(name)
        self.lane = metrics.lane.labels(name)
        self.queue_depth = _SharedDepth(metrics.queue_depth.labels(name), metrics.depth_parts.setdefault(name, {}))


class _SharedDepth:
    """queue_depth.set(n) from one of possibly two batchers of a model (old and new during a swap)."""

    def __init__(self, gauge: Gauge, parts: dict[int, int]):
        self.gauge = gauge
        self.parts = parts  # every live batcher's depth for this model, by share

    def set(self, n: int) -> None:
        self.parts[id(self)] = n
        self.gauge.set(sum(self.parts.values()))

    def release(self) -> None:
        self.parts.pop(id(self), None)
        self.gauge.set(sum(self.parts.values()))
