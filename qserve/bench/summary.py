"""The headline row of each variant in a bench report (md table, csv, charts, the served models' page).

    python -c "from qserve.bench.report import load_report; from qserve.bench.summary import summary_rows; \\
print(summary_rows(load_report('benchmarks/reports/embedded-default')[0])[0])"
"""

from __future__ import annotations

from typing import Any

from qserve.bench.invariance import cell
from qserve.bench.rounds import ci_cell
from qserve.placement import mark


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


def summary_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per variant with the headline columns (used by md, csv and plots)."""
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    bmax = max(report["config"]["batch_sizes"])
    rows = []
    for v in report["variants"]:
        st, big = fixed_shape(v, b, s), fixed_shape(v, bmax, s)
        mem, _ = peak_memory(v)
        acc = v.get("accuracy") or {}
        fl = v.get("floor") or {}
        rows.append(
            {
                "variant": v["name"],
                "shown": shown(v, report),
                "device": v.get("device"),
                "status": v["status"],
                "size_mb": v["disk_bytes"] / 1e6 if v.get("disk_bytes") is not None else None,
                "load_s": v.get("load_s"),
                "p50_ms": st["p50"] if st else None,
                "p50_ci": st.get("p50_ci") if st else None,
                "p50_cell": ci_cell(st),
                "p99_ms": st["p99"] if st else None,
                "throughput": big["throughput"] if big else None,
                "peak_mem_mib": mem,
                "accuracy": acc.get("accuracy"),
                "agreement": v.get("agreement"),
                "eval_n": acc.get("n"),
                "speedup": v.get("speedup_vs_torch_fp32"),
                "floor_ms": fl.get("floor_ms"),
                "p50_over_floor": fl.get("p50_over_floor"),
                "floor_peak": fl.get("peak"),
                "invariance_max_abs_dprob": (v.get("invariance") or {}).get("max_abs_dprob"),
                "invariance_flips": (v.get("invariance") or {}).get("flips"),
                "invariance": invariance_cell(v.get("invariance")),
            }
        )
    return rows


def invariance_cell(inv: dict[str, Any] | None) -> str:
    return cell(inv)
