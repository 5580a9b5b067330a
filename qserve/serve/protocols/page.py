"""The served models' page at `/`, and /v1/report, the bench numbers behind each served variant.

    qserve serve models/minilm-l6-distilbert-imdb      # then open http://127.0.0.1:8000/ in a browser

The page (page.html) holds no model data: it reads the JSON routes and classifies through /v1/classify as any
client would, so it is open (with --api-key it asks for the key). See docs/protocols.md ("The served models' page").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import HTMLResponse

from qserve import QserveError
from qserve.artifact import VariantError, read_manifest
from qserve.benchreport import Row, load_report, recommendation, summary_rows
from qserve.rundir import RunDir
from qserve.serve.core.schemas import ErrorResponse
from qserve.serve.core.state import ServeState
from qserve.serve.protocols.spec import ProtocolSpec, Route

PAGE_HTML = Path(__file__).with_name("page.html")


class BenchRow(BaseModel):
    """One variant's headline numbers from the bench report (None where not measured)."""

    variant: str
    size_mb: float | None = None
    p50_ms: float | None = None
    """p50 of the figure the recommendation ranks by (ReportSummary.shape): b1 on real test texts, else b1/s128."""
    p99_ms: float | None = None
    fixed_p50_ms: float | None = None
    """p50 at the headline fixed shape (b1/s128), whatever the ranking used."""
    meets_bar: bool | None = None
    """Whether its agreement meets its bar: a variant the recommendation could choose."""
    throughput: float | None = None
    accuracy: float | None = None
    agreement: float | None = None
    speedup: float | None = None
    peak_mem_mib: float | None = None


class ReportSummary(BaseModel):
    """Why this variant: the bench report beside it, if there is one."""

    model: str | None = None
    """The served model's name (several models: each has its own report)."""
    served: str
    """The served variant's directory name (its name in the report)."""
    report: str | None = None
    """Path of the report.json read; None when there is none (see reason)."""
    reason: str | None = None
    created: str | None = None
    machine: str | None = None
    threads: int | None = None
    shape: str | None = None
    """The headline shape the recommendation ranks by, e.g. b1/s128."""
    batch_max: int | None = None
    recommended: str | None = None
    why: str | None = None
    served_is_recommended: bool | None = None
    measured_files_match: bool | None = None
    """Whether the report measured these exact files (the pipeline's inputs.json); None if unknown."""
    rows: list[BenchRow] = []
    """The served variant's row, then the recommended one's if it is another, then every other candidate (meets
    its agreement bar) in the recommendation's order."""


def report_summary(variant_dir: str | Path) -> ReportSummary:
    if not variant_dir:
        return ReportSummary(served="", reason="no variant dir configured")
    v = Path(variant_dir)
    served, path = v.name, RunDir.holding(v).report_json
    if not path.is_file():
        return ReportSummary(served=served, reason=f"no bench report at {path}; `qserve pipeline` writes one")
    try:
        report, _ = load_report(path)
    except QserveError as e:
        return ReportSummary(served=served, report=str(path), reason=str(e))
    rows = {r.variant: r for r in summary_rows(report) if r.status == "ok"}
    rec = report.get("recommended") or {}
    env, cfg = report.get("environment") or {}, report.get("config") or {}
    machine = env.get("gpu") if str(cfg.get("device", "")).startswith("cuda") else (env.get("cpu") or {}).get("model")
    ranked = [r.variant for r in recommendation(report).ranking if r.meets_bar]  # in ranked order, as the report's
    keep = [served, *([rec["variant"]] if rec.get("variant") else []), *ranked]
    out = ReportSummary(
        served=served,
        report=str(path),
        created=report.get("created"),
        machine=machine,
        threads=cfg.get("threads"),
        shape=rec.get("shape") or "b{batch}/s{seq}".format(**report["headline"]),
        batch_max=max(cfg.get("batch_sizes") or [0]) or None,
        recommended=rec.get("variant"),
        why=rec.get("why"),
        served_is_recommended=(rec["variant"] == served) if rec.get("variant") else None,
        measured_files_match=_same_files(path.parent / "inputs.json", v),
        rows=[_row(rows[n]) for n in dict.fromkeys(keep) if n in rows],
    )
    if served not in rows:
        out.reason = f"{path} has no measured row for {served}"
    return out


def _row(r: Row) -> BenchRow:
    """The summary row, its latency the one the recommendation ranked by (so the page and the ranking agree)."""
    return BenchRow(
        variant=r.variant,
        size_mb=r.size_mb,
        p50_ms=r.b1_ms,
        p99_ms=r.b1_p99_ms,
        fixed_p50_ms=r.p50_ms,
        meets_bar=r.meets_bar,
        throughput=r.throughput,
        accuracy=r.accuracy,
        agreement=r.agreement,
        speedup=r.speedup,
        peak_mem_mib=r.peak_mem_mib,
    )


def _same_files(stamp: Path, variant_dir: Path) -> bool | None:
    """The pipeline stamps the manifests' file lists it measured; compare with what is served."""
    try:
        measured = json.loads(stamp.read_text(encoding="utf-8")).get(variant_dir.name)
        served = read_manifest(variant_dir).to_json()["files"]
    except (OSError, ValueError, AttributeError, VariantError, KeyError):
        return None
    return None if measured is None else measured == served


def _csp(page: str) -> str:
    """Only this page's own inline script (by hash) and styles run; it may talk to this server only."""
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.S)
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'" for s in scripts)
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


@cache
def _page(auth: str) -> tuple[str, dict[str, str]]:
    page = PAGE_HTML.read_text(encoding="utf-8").replace("{{AUTH}}", auth)
    headers = {
        "Content-Security-Policy": _csp(page),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
    return page, headers


async def index(st: ServeState, body: bytes, request: Request) -> HTMLResponse:
    # Whether to ask for a key is the one server fact the page carries, so it never has to fail a call to learn it.
    page, headers = _page("required" if st.config.api_key else "none")
    return HTMLResponse(page, headers=headers)


async def v1_report(st: ServeState, body: bytes, request: Request) -> ReportSummary:
    served = st.model(request.query_params.get("model"))
    out = await asyncio.to_thread(report_summary, served.variant_dir or st.config.variant_dir)  # file reads
    out.model = served.name
    return out


MODEL = "A served model (GET /v1/models lists them); default: the default model."
MODEL_QUERY: dict[str, Any] = {
    "name": "model",
    "in": "query",
    "required": False,
    "description": MODEL,
    "schema": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": MODEL, "title": "Model"},
}


# GET / is open (it holds no model data); GET /v1/report needs the key like every JSON route, and counts as /v1's.
PAGE = ProtocolSpec(
    name="page",
    routes=(
        # In the document beside POST / (an inference route, registry.py), so the path's Allow (GET, POST) lists both.
        Route(
            "GET",
            "/",
            index,
            dict(tags=["page"], media_type="text/html", summary="The served models' page (HTML, open)"),
            open=True,
        ),
        Route(
            "GET",
            "/v1/report",
            v1_report,
            dict(
                tags=["v1"],
                summary="The bench report behind a served model's variant: the recommendation and its row",
                responses={401: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
                openapi_extra={"parameters": [MODEL_QUERY]},
            ),
            label="v1",
        ),
    ),
)
