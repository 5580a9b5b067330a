"""Prometheus metrics for one app, in the app's own CollectorRegistry.

    curl -s 127.0.0.1:8000/metrics | grep qserve_batch_size

A registry per app (not prometheus_client's global REGISTRY) lets several apps
live in one process, as tests and benchmarks do, without "Duplicated timeseries".
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# A refusal should cost microseconds: these resolve 5 us .. 10 ms.
REJECTION_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2)
QUEUE_WAIT_BUCKETS = (1e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("qserve_requests_total", "HTTP requests by route template, method and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("qserve_request_latency_seconds", "HTTP request latency (server side)",
                                 ["route", "method", "status"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("qserve_batch_size", "Texts per forward pass", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.queue_depth = Gauge("qserve_queue_depth", "Texts waiting for a batch", registry=r)
        self.inference = Histogram("qserve_inference_seconds", "Wall time of one batch in the runtime",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.texts = Counter("qserve_texts_total", "Texts classified", registry=r)
        self.truncated = Counter("qserve_truncated_texts_total", "Texts cut to the model's max_length", registry=r)
        self.batch_failures = Counter("qserve_batch_failures_total", "Batches whose runtime call raised",
                                      registry=r)
        self.rejected = Counter("qserve_rejected_total", "Requests refused before inference, by reason",
                                ["reason"], registry=r)
        self.ready = Gauge("qserve_model_ready", "1 once the model is loaded and serving", registry=r)
        self.queue_wait = Histogram("qserve_queue_wait_seconds",
                                    "Per admitted text: time from entering the queue to the start of its forward pass",
                                    buckets=QUEUE_WAIT_BUCKETS, registry=r)
        self.rejection = Histogram("qserve_rejection_seconds",
                                   "Server time spent refusing a request before inference (429 queue full)",
                                   buckets=REJECTION_BUCKETS, registry=r)
        self.connections = Gauge("qserve_open_connections", "HTTP connections open now", registry=r)
        self.connections_closed = Counter(
            "qserve_connections_closed_total", "Connections the server closed on its own, by reason "
            "(idle, header_timeout, body_timeout, keep_alive, connection_limit)", ["reason"], registry=r)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        labels = (route, method, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
