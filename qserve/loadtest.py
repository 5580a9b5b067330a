"""Load-test a running qserve server and check every answer against the expected label.

    qserve loadtest http://127.0.0.1:8000 --concurrency 1,8,32,64 --duration 10

Expected labels come from a first sequential pass (or a csv of text,label); in the timed runs a wrong label is a
mismatch, no answer is lost, a non-200 an error. Bounded in time and requests, and loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import functools
import ipaddress
import json
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from qserve import QserveError
from qserve.intervals import percentile

MAX_CONCURRENCY = 1024
MAX_DURATION_S = 600.0

_OPENERS = (
    "I thought|Honestly,|My friends said|The critics agreed|From the first scene,|To be fair,|After two hours,|"
    "In the end"
).split("|")
_JUDGEMENTS = (
    "this film was a delight|the movie was a tedious mess|the acting felt wooden|the story moved me to tears|"
    "the script was lazy and predictable|the soundtrack was wonderful|nothing about it worked|"
    "it is a quiet masterpiece|the pacing dragged badly|every performance was superb|the jokes fell flat|"
    "I would happily watch it again"
).split("|")


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
    if parts.scheme != "http" or not parts.hostname:
        raise QserveError(f"URL {url!r}: expected http://127.0.0.1:PORT (plain http to a loopback address)")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except socket.gaierror as e:
        raise QserveError(f"URL {url!r}: cannot resolve {parts.hostname!r} ({e})") from None
    addrs = {info[4][0] for info in infos}
    if not addrs or not all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs):
        raise QserveError(
            f"URL {url!r}: {parts.hostname} is not a loopback address ({sorted(addrs)}); "
            "loadtest only targets 127.0.0.0/8, ::1 or localhost"
        )
    path = parts.path.rstrip("/") or "/v1/classify"
    return f"{parts.scheme}://{parts.netloc}{path}"


class Conn:
    """One keep-alive HTTP/1.1 connection that POSTs JSON: the load generator's whole client, cheap in CPU (a
    general async client spent more CPU per request than the server it measured on the same cores)."""

    def __init__(self, url: str, headers: dict[str, str], timeout_s: float):
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise QserveError(f"URL {url!r}: loadtest speaks plain http to loopback servers only")
        self.host, self.port = parts.hostname, parts.port or 80
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.head = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\n{extra}Content-Length: "
        ).encode()
        self.timeout_s = timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        return await asyncio.wait_for(self._post(body), self.timeout_s)

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None  # opened with the writer, above or on an earlier call
        self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            await self.close()
            raise
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        if "content-length" in hdrs:
            data = await self.reader.readexactly(int(hdrs["content-length"]))
        elif hdrs.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            await self.reader.readuntil(b"\r\n")
            data = b"".join(chunks)
        else:
            data = await self.reader.read()
            hdrs["connection"] = "close"
        if hdrs.get("connection", "").lower() == "close":
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def _percentiles(lat_s: list[float]) -> dict[str, float | None]:
    """Client-side latency percentiles, computed by the bench's (tested) statistics."""
    if not lat_s:
        return dict.fromkeys(("p50_ms", "p90_ms", "p99_ms", "mean_ms", "max_ms"))
    ms = [x * 1000.0 for x in lat_s]
    return {**{f"p{q}_ms": percentile(ms, q) for q in (50, 90, 99)}, "mean_ms": sum(ms) / len(ms), "max_ms": max(ms)}


async def _expected_pass(conn: Conn, url: str, texts: list[str]) -> tuple[list[str], list[dict[str, float]]]:
    labels, scores = [], []
    for t in dict.fromkeys(texts):
        status, data = await conn.post(json.dumps({"inputs": t}).encode())
        if status != 200:
            raise QserveError(f"sequential pass: {url} answered {status}: {data[:300].decode(errors='replace')}")
        preds = json.loads(data)["predictions"][0]
        labels.append(preds[0]["label"])
        scores.append({p["label"]: p["score"] for p in preds})
    return labels, scores


async def _level(
    make_conn: Callable[[], Conn],
    texts: list[str],
    expected: list[str],
    exp_scores: list[dict] | None,
    concurrency: int,
    duration_s: float,
    max_requests: int,
) -> dict[str, Any]:
    lat: list[float] = []
    errors: Counter[str] = Counter()
    counts = {"sent": 0, "answered": 0, "ok": 0, "mismatched": 0}
    max_diff = [0.0]
    end = time.perf_counter() + duration_s

    bodies = [json.dumps({"inputs": t}).encode() for t in texts]

    async def worker(wid: int) -> None:
        conn = make_conn()
        i = wid
        while time.perf_counter() < end and counts["sent"] < max_requests:
            counts["sent"] += 1
            idx = i % len(texts)
            i += concurrency
            t0 = time.perf_counter()
            try:
                status, data = await conn.post(bodies[idx])
            except Exception as e:  # noqa: BLE001 - every failure is a counted outcome
                errors[f"no answer: {type(e).__name__}"] += 1
                await conn.close()
                continue
            counts["answered"] += 1
            if status != 200:
                errors[f"HTTP {status}"] += 1
                continue
            lat.append(time.perf_counter() - t0)
            preds = json.loads(data)["predictions"][0]
            counts["ok"] += 1
            if preds[0]["label"] != expected[idx]:
                counts["mismatched"] += 1
            if exp_scores is not None:
                got = {p["label"]: p["score"] for p in preds}
                max_diff[0] = max(max_diff[0], max(abs(got[k] - v) for k, v in exp_scores[idx].items()))

        await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {
        "concurrency": concurrency,
        "duration_s": elapsed,
        "requests": counts["sent"],
        "ok": counts["ok"],
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "lost": counts["sent"] - counts["answered"],
        "mismatched": counts["mismatched"],
        "max_score_diff": max_diff[0] if exp_scores is not None else None,
        "throughput_rps": counts["ok"] / elapsed if elapsed > 0 else 0.0,
        **_percentiles(lat),
    }


async def _run(
    url: str,
    concurrencies: list[int],
    duration_s: float,
    texts: list[str],
    labels: list[str] | None,
    max_requests: int,
    api_key: str | None,
    timeout_s: float,
    on_level: Callable[[str, int], None] | None,
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    make_conn = functools.partial(Conn, url, headers, timeout_s)
    t0 = time.perf_counter()
    if labels is None:
        first = make_conn()
        uniq_labels, uniq_scores = await _expected_pass(first, url, texts)
        await first.close()
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
        levels.append(await _level(make_conn, texts, expected, exp_scores, c, duration_s, max_requests))
        if on_level:
            on_level("end", c)
    return {
        "url": url,
        "texts": len(texts),
        "expected_from": source,
        "sequential_pass_s": seq_s,
        "duration_s": duration_s,
        "max_requests": max_requests,
        "levels": levels,
    }


def run_loadtest(
    url: str,
    concurrencies: list[int],
    duration_s: float,
    texts: list[str] | None = None,
    labels: list[str] | None = None,
    max_requests: int = 100_000,
    api_key: str | None = None,
    timeout_s: float = 30.0,
    on_level: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Run each concurrency level for duration_s (or max_requests, first reached); `on_level("start"|"end", c)` around
    each level."""
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
    return asyncio.run(
        _run(target, concurrencies, duration_s, texts, labels, max_requests, api_key, timeout_s, on_level)
    )


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"target {report['url']}  texts {report['texts']}  expected labels from {report['expected_from']}",
        f"{'conc':>5} {'requests':>9} {'ok':>8} {'err':>5} {'lost':>5} {'mismatch':>8} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}",
    ]
    for lv in report["levels"]:

        def ms(v: float | None) -> str:
            return f"{v:8.2f}" if v is not None else f"{'-':>8}"

        lines.append(
            f"{lv['concurrency']:>5} {lv['requests']:>9} {lv['ok']:>8} {lv['errors']:>5} {lv['lost']:>5} "
            f"{lv['mismatched']:>8} {ms(lv['p50_ms'])} {ms(lv['p99_ms'])} {lv['throughput_rps']:8.1f}"
        )
        if lv["error_kinds"]:
            lines.append(f"      errors: {lv['error_kinds']}")
    return "\n".join(lines)
