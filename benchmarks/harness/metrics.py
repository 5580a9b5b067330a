"""A server's /metrics, read with prometheus_client's text parser (never by hand).

python -c "from benchmarks.harness.metrics import total; print(total({}, 'qserve_batch_size_count'))"
"""

from __future__ import annotations

import time

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from qserve import QserveError

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""(sample name, its labels sorted) -> value"""


def scrape(url: str) -> Samples:
    """Every sample the server at `url` exposes on /metrics now."""
    text = httpx2.get(f"{url}/metrics", timeout=10, trust_env=False).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of sample `name` over every label set that has `labels` (all of them when none are given)."""
    return sum(
        v
        for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == want for k, want in labels.items())
    )


def batch_totals(url: str) -> tuple[float, float]:
    """(forwards, texts in them) so far, from the server's qserve_batch_size histogram, over all its models."""
    s = scrape(url)
    return total(s, "qserve_batch_size_count"), total(s, "qserve_batch_size_sum")


def per_worker(url: str, workers: int, timeout_s: float = 120.0) -> dict[str, Samples]:
    """Each worker's /metrics under `qserve serve --workers N`, by worker id: a scrape answers for the worker that
    accepted its (fresh) connection, and a worker still loading accepts none, so scrape until every id was seen (a
    QserveError after `timeout_s` seconds)."""
    seen: dict[str, Samples] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        ids = [dict(lab).get("worker") for (n, lab) in samples if n == "qserve_worker_info"]
        if ids and ids[0] is not None:
            seen.setdefault(ids[0], samples)
        if len(seen) >= workers:
            return seen
        if time.monotonic() > deadline:
            raise QserveError(
                f"{url}: /metrics answered for workers {sorted(seen)} only, of {workers}, in {timeout_s:.0f} s"
            )
        time.sleep(0.02)
