"""Each variant's row of a bench report: the summary table's numbers and verdict (md, html, csv, charts, the page).

    python -c "from qserve.bench.report import load_report; from qserve.bench.summary import summary_rows; \\
print(summary_rows(load_report('benchmarks/reports/embedded-default')[0])[0])"
"""

from __future__ import annotations

from typing import Any

from qserve.intervals import wilson
from qserve.placement import mark
from qserve.problemtypes import SINGLE


def shown(v: dict[str, Any], report: dict[str, Any]) -> str:
    """A variant's name as every table shows it: marked ' (cpu)' when it ran on another device than the run's
    (an ONNX or OpenVINO variant measured on the CPU of a CUDA run)."""
    return v["name"] + mark(v.get("device"), (report.get("config") or {}).get("device"))


def fixed_shape(v: dict[str, Any], b: int, s: int) -> dict[str, Any] | None:
    """The variant's fixed-shape latency record at batch b, seq s (None when not measured)."""
    for rec in v.get("fixed") or []:
        if rec.get("batch") == b and rec.get("seq") == s and "p50" in rec:
            return rec
    return None


def peak_memory(v: dict[str, Any]) -> tuple[float | None, str]:
    """(MiB, what it is): CUDA max allocated on GPU, else the child's peak RSS."""
    mem = v.get("memory") or {}
    if mem.get("cuda"):
        if mem["cuda"].get("max_allocated_mb"):
            return mem["cuda"]["max_allocated_mb"], "CUDA max allocated"
        return mem["cuda"].get("device_used_mb"), "CUDA device used"
    return mem.get("peak_rss_mb"), "peak RSS"


def agreement_lower_bound(v: dict[str, Any]) -> float | None:
    """The release gate's 95% lower bound on agreement where it ran, else Wilson's over the texts the bench scored
    (single-label: agreement is then a share of texts)."""
    g, acc, agr = v.get("gate") or {}, v.get("accuracy") or {}, v.get("agreement")
    if g.get("agreement_lower_bound") is not None:
        return g["agreement_lower_bound"]
    n = acc.get("n") if acc.get("problem_type", SINGLE) == SINGLE else None
    return wilson(round(agr * n), n)[0] if agr is not None and n else None


def summary_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per variant: the summary table's cells (b1_ms: the p50 the recommendation ranks by; verdict and
    why: recommend.recommend's) and what the csv, the charts and the served page read."""
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    bmax = max(report["config"]["batch_sizes"])
    ranking = {r["variant"]: r for r in (report.get("recommended") or {}).get("ranking") or []}
    rows = []
    for v in report["variants"]:
        st, big, r = fixed_shape(v, b, s), fixed_shape(v, bmax, s), ranking.get(v["name"]) or {}
        acc, fl, inv = v.get("accuracy") or {}, v.get("floor") or {}, v.get("invariance") or {}
        failed = f"its bench failed: {v.get('failure') or v.get('error') or 'no result'}"
        rows.append(
            {
                "variant": v["name"],
                "shown": shown(v, report),
                "device": v.get("device"),
                "status": v["status"],
                "b1_ms": r.get("p50_ms"),
                "size_mb": v["disk_bytes"] / 1e6 if v.get("disk_bytes") is not None else None,
                "load_s": v.get("load_s"),
                "p50_ms": st["p50"] if st else None,
                "p99_ms": st["p99"] if st else None,
                "throughput": big["throughput"] if big else None,
                "peak_mem_mib": peak_memory(v)[0],
                "accuracy": acc.get("accuracy"),
                "agreement": v.get("agreement"),
                "agreement_lo": None if v["name"] == report.get("agreement_reference") else agreement_lower_bound(v),
                "eval_n": acc.get("n"),
                "speedup": v.get("speedup_vs_torch_fp32"),
                "floor_ms": fl.get("floor_ms"),
                "p50_over_floor": fl.get("p50_over_floor"),
                "invariance_max_abs_dprob": inv.get("max_abs_dprob"),
                "invariance_flips": inv.get("flips"),
                "verdict": r.get("verdict") or ("not a candidate" if v["status"] != "ok" else "–"),
                "why": r.get("verdict_why") or (failed if v["status"] != "ok" else None),
            }
        )
    return rows
