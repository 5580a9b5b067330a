"""Load-test a running qserve server and check every answer against the expected label.

    qserve loadtest http://127.0.0.1:8000 --concurrency 1,8,32,64 --duration 10

Expected labels come from a first sequential pass over the texts (one request at a
time, so batching cannot be involved) or from a csv file of text,label. Every
response in the timed runs is then checked: a wrong label is a mismatch, a request
without an HTTP answer is lost, any non-200 is an error (counted by status). The
tool is bounded in time and requests and only talks to loopback addresses, so it
cannot be pointed at someone else's service.
"""

from __future__ import annotations

import asyncio
import csv
import ipaddress
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from qserve import QserveError

MAX_CONCURRENCY = 1024
MAX_DURATION_S = 600.0

_OPENERS = ["I thought", "Honestly,", "My friends said", "The critics agreed", "From the first scene,",
            "To be fair,", "After two hours,", "In the end"]
_JUDGEMENTS = ["this film was a delight", "the movie was a tedious mess", "the acting felt wooden",
               "the story moved me to tears", "the script was lazy and predictable",
               "the soundtrack was wonderful", "nothing about it worked", "it is a quiet masterpiece",
               "the pacing dragged badly", "every performance was superb", "the jokes fell flat",
               "I would happily watch it again"]


def default_texts(n: int = 96) -> list[str]:
    """Deterministic, distinct review-like sentences of varied length (no dataset needed)."""
    out = []
    for i in range(n):
        a = _OPENERS[i % len(_OPENERS)]
        b = _JUDGEMENTS[(i * 5) % len(_JUDGEMENTS)]
        c = _JUDGEMENTS[(i * 7 + 3) % len(_JUDGEMENTS)]
        extra = f", and {c}" * (i % 4)
        out.append(f"{a} {b}{extra} (review {i}).")
    return out


def read_texts_file(path: str | Path) -> tuple[list[str], list[str] | None]:
    """A .csv with a header holding `text` (and optionally `label`), or plain text, one per line."""
    path = Path(path)
    if not path.is_file():
        raise QserveError(f"--texts {path}: no such file")
    if path.suffix.lower() == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if not rows or "text" not in rows[0]:
            raise QserveError(f"--texts {path}: a csv needs a header with a 'text' column (and optionally 'label')")
        texts = [r["text"] for r in rows if r["text"].strip()]
        labels = [r["label"] for r in rows if r["text"].strip()] if "label" in rows[0] else None
        return texts, labels
    texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise QserveError(f"--texts {path}: no non-empty lines")
    return texts, None


def classify_url(url: str) -> str:
    """The /v1/classify URL for a base URL, after checking the host is loopback."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise QserveError(f"URL {url!r}: expected http://127.0.0.1:PORT (a loopback address)")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise QserveError(f"URL {url!r}: cannot resolve {parts.hostname!r} ({e})") from None
    addrs = {info[4][0] for info in infos}
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise QserveError(f"URL {url!r}: {parts.hostname} is not a loopback address ({sorted(addrs)}); "
                          "loadtest only targets 127.0.0.0/8, ::1 or localhost")
    path = parts.path.rstrip("/") or "/v1/classify"
    return f"{parts.scheme}://{parts.netloc}{path}"


def _percentiles(lat_s: list[float]) -> dict[str, float | None]:
    if not lat_s:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "mean_ms": None, "max_ms": None}
    a = np.asarray(lat_s) * 1000.0
    return {"p50_ms": float(np.percentile(a, 50)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean()), "max_ms": float(a.max())}


async def _expected_pass(client: Any, url: str, texts: list[str]) -> tuple[list[str], list[np.ndarray]]:
    labels, scores = [], []
    for t in dict.fromkeys(texts):
        r = await client.post(url, json={"inputs": t})
        if r.status_code != 200:
            raise QserveError(f"sequential pass: {url} answered {r.status_code}: {r.text[:300]}")
        preds = r.json()["predictions"][0]
        labels.append(preds[0]["label"])
        scores.append({p["label"]: p["score"] for p in preds})
    return labels, scores


async def _level(client: Any, url: str, texts: list[str], expected: list[str], exp_scores: list[dict] | None,
                 concurrency: int, duration_s: float, max_requests: int) -> dict[str, Any]:
    lat: list[float] = []
    errors: Counter[str] = Counter()
    counts = {"sent": 0, "answered": 0, "ok": 0, "mismatched": 0}
    max_diff = [0.0]
    end = time.perf_counter() + duration_s

    async def worker(wid: int) -> None:
        i = wid
        while time.perf_counter() < end and counts["sent"] < max_requests:
            counts["sent"] += 1
            idx = i % len(texts)
            i += concurrency
            t0 = time.perf_counter()
            try:
                r = await client.post(url, json={"inputs": texts[idx]})
            except Exception as e:  # noqa: BLE001 - every failure is a counted outcome
                errors[f"no answer: {type(e).__name__}"] += 1
                continue
            counts["answered"] += 1
            if r.status_code != 200:
                errors[f"HTTP {r.status_code}"] += 1
                continue
            lat.append(time.perf_counter() - t0)
            preds = r.json()["predictions"][0]
            counts["ok"] += 1
            if preds[0]["label"] != expected[idx]:
                counts["mismatched"] += 1
            if exp_scores is not None:
                got = {p["label"]: p["score"] for p in preds}
                max_diff[0] = max(max_diff[0], max(abs(got[k] - v) for k, v in exp_scores[idx].items()))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {"concurrency": concurrency, "duration_s": elapsed, "requests": counts["sent"], "ok": counts["ok"],
            "errors": sum(errors.values()), "error_kinds": dict(errors),
            "lost": counts["sent"] - counts["answered"], "mismatched": counts["mismatched"],
            "max_score_diff": max_diff[0] if exp_scores is not None else None,
            "throughput_rps": counts["ok"] / elapsed if elapsed > 0 else 0.0, **_percentiles(lat)}


async def _run(url: str, concurrencies: list[int], duration_s: float, texts: list[str],
               labels: list[str] | None, max_requests: int, api_key: str | None,
               timeout_s: float, on_level: Callable[[str, int], None] | None) -> dict[str, Any]:
    import httpx2

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx2.Limits(max_connections=max(concurrencies), max_keepalive_connections=max(concurrencies))
    async with httpx2.AsyncClient(headers=headers, limits=limits, timeout=timeout_s, trust_env=False) as client:
        t0 = time.perf_counter()
        if labels is None:
            uniq_labels, uniq_scores = await _expected_pass(client, url, texts)
            by_text = dict(zip(dict.fromkeys(texts), zip(uniq_labels, uniq_scores)))
            expected = [by_text[t][0] for t in texts]
            exp_scores = [by_text[t][1] for t in texts]
            source = "sequential pass"
        else:
            expected, exp_scores, source = labels, None, "file"
        seq_s = time.perf_counter() - t0
        levels = []
        for c in concurrencies:
            if on_level:
                on_level("start", c)
            levels.append(await _level(client, url, texts, expected, exp_scores, c, duration_s, max_requests))
            if on_level:
                on_level("end", c)
    return {"url": url, "texts": len(texts), "expected_from": source, "sequential_pass_s": seq_s,
            "duration_s": duration_s, "max_requests": max_requests, "levels": levels}


def run_loadtest(url: str, concurrencies: list[int], duration_s: float, texts: list[str] | None = None,
                 labels: list[str] | None = None, max_requests: int = 100_000, api_key: str | None = None,
                 timeout_s: float = 30.0, on_level: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Run each concurrency level for duration_s (or max_requests, whichever first); returns the report.

    `on_level("start"|"end", concurrency)` is called around each level (e.g. to scrape /metrics)."""
    target = classify_url(url)
    if not concurrencies or any(not 1 <= c <= MAX_CONCURRENCY for c in concurrencies):
        raise QserveError(f"--concurrency {concurrencies}: each level must be 1..{MAX_CONCURRENCY}")
    if not 0 < duration_s <= MAX_DURATION_S:
        raise QserveError(f"--duration {duration_s}: must be > 0 and <= {MAX_DURATION_S:.0f} s")
    if max_requests < 1:
        raise QserveError(f"--max-requests {max_requests}: must be >= 1")
    texts = texts or default_texts()
    if labels is not None and len(labels) != len(texts):
        raise QserveError(f"{len(labels)} labels for {len(texts)} texts")
    return asyncio.run(_run(target, concurrencies, duration_s, texts, labels, max_requests, api_key, timeout_s,
                           on_level))


def format_report(report: dict[str, Any]) -> str:
    lines = [f"target {report['url']}  texts {report['texts']}  expected labels from {report['expected_from']}",
             f"{'conc':>5} {'requests':>9} {'ok':>8} {'err':>5} {'lost':>5} {'mismatch':>8} "
             f"{'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}"]
    for lv in report["levels"]:
        def ms(v: float | None) -> str:
            return f"{v:8.2f}" if v is not None else f"{'-':>8}"
        lines.append(f"{lv['concurrency']:>5} {lv['requests']:>9} {lv['ok']:>8} {lv['errors']:>5} {lv['lost']:>5} "
                     f"{lv['mismatched']:>8} {ms(lv['p50_ms'])} {ms(lv['p99_ms'])} {lv['throughput_rps']:8.1f}")
        if lv["error_kinds"]:
            lines.append(f"      errors: {lv['error_kinds']}")
    return "\n".join(lines)
