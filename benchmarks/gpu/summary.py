"""The offline GPU check's summary: every stage's outcome, versions and numbers, as JSON and as markdown.

    python -m benchmarks.gpu.tools summary WORK_DIR OUT_DIR      # the CLI (run by benchmarks/gpu/check.sh)

collect() reads the work dir one call of check.sh leaves (stages.tsv, preflight.json, env.json, run.json,
serve/, graphs/, floor/, study/) and, for call A, the pipeline's run dir; render() makes the md;
tools.summary writes both with provenance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_stages(path: Path) -> list[dict[str, Any]]:
    """stages.tsv rows (name, status, exit code, seconds, note, limit s, estimate s) as check.sh writes them."""
    rows = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) >= 4:
                rows.append(
                    {
                        "stage": parts[0],
                        "status": parts[1],
                        "rc": int(parts[2]),
                        "seconds": float(parts[3]),
                        "note": parts[4] if len(parts) > 4 else "",
                        "limit_s": float(parts[5]) if len(parts) > 5 and parts[5] else None,
                        "estimate_s": float(parts[6]) if len(parts) > 6 and parts[6] else None,
                    }
                )
    return rows


TRAIN_KEYS = (
    "precision",
    "device",
    "gpu",
    "train_time_s",
    "optimizer_steps",
    "step_time_median_s",
    "samples_per_s",
    "peak_memory_bytes",
    "peak_memory_kind",
    "val_accuracy",
    "test_accuracy",
    "sizes",
    "precision_choice",
    "time_budget",
)


def collect(work: Path, run: Path | None = None) -> dict[str, Any]:
    """Everything one call of the check produced, as one JSON-shaped dict (what tools.summary writes); `run`:
    the pipeline's run dir (call A)."""
    run = run or work / "run"
    out: dict[str, Any] = {
        "format": "qserve-gpu-check/3",
        "run": _read(work / "run.json") or {},
        "preflight": _read(work / "preflight.json"),
        "env": _read(work / "env.json"),
        "stages": read_stages(work / "stages.tsv"),
        "graphs": None,
        "floor": None,
        "training": None,
        "pipeline": None,
        "bench": None,
        "gate": None,
        "loadtest": None,
        "study": None,
    }
    m = _read(run / "checkpoint" / "train_metrics.json")
    if m:
        cfg = m.get("config") or {}
        out["training"] = {k: m.get(k) for k in TRAIN_KEYS} | {
            "batch_size": cfg.get("batch_size"),
            "max_length": cfg.get("max_length"),
            "epochs": cfg.get("epochs"),
            "tokens_per_s": (m["samples_per_s"] * cfg["max_length"])
            if m.get("samples_per_s") and cfg.get("max_length")
            else None,
        }
    report = _read(run / "report" / "report.json")
    if report:
        pipe = report.get("pipeline") or {}
        out["pipeline"] = {
            "stage_s": pipe.get("stage_s"),
            "machine": pipe.get("machine"),
            "plan": pipe.get("plan"),
            "skipped": pipe.get("skipped"),
            "export_failed": pipe.get("export_failed"),
            "recommended": {k: (report.get("recommended") or {}).get(k) for k in ("variant", "why")},
        }
        cfg = report.get("config") or {}
        b, s = (report.get("headline") or {}).get("batch", 1), (report.get("headline") or {}).get("seq", 128)
        bmax = max(cfg.get("batch_sizes") or [b])
        rows = {}
        for v in report.get("variants", []):
            fixed = {(r.get("batch"), r.get("seq")): r for r in v.get("fixed") or []}
            mem = v.get("memory") or {}
            rows[v["name"]] = {
                "status": v.get("status"),
                "device": v.get("device"),
                "isolation": v.get("isolation", "process"),
                "p50_ms": (fixed.get((b, s)) or {}).get("p50"),
                "throughput": (fixed.get((bmax, s)) or {}).get("throughput"),
                "accuracy": (v.get("accuracy") or {}).get("accuracy"),
                "agreement": v.get("agreement"),
                "cuda_max_allocated_mb": (mem.get("cuda") or {}).get("max_allocated_mb"),
                "peak_rss_mb": mem.get("peak_rss_mb"),
                "load_s": v.get("load_s"),
                "wall_s": v.get("wall_s"),
                "error": v.get("error"),
            }
        out["bench"] = {
            "device": cfg.get("device"),
            "headline": [b, s],
            "bmax": bmax,
            "variants": rows,
            "gpu": (report.get("environment") or {}).get("gpu"),
        }
        gate = report.get("gate") or {}
        out["gate"] = {"rows": gate.get("rows"), "why": gate.get("why")} if gate else None
    lt = _read(work / "serve" / "loadtest.json") or _read(work / "loadtest.json")
    if lt:
        out["loadtest"] = [
            {
                k: lv.get(k)
                for k in (
                    "concurrency",
                    "requests",
                    "ok",
                    "errors",
                    "lost",
                    "mismatched",
                    "p50_ms",
                    "p99_ms",
                    "throughput_rps",
                )
            }
            for lv in lt["levels"]
        ]
    graphs = _read(work / "graphs" / "report.json")
    if graphs:
        out["graphs"] = {k: graphs.get(k) for k in ("gpu", "summary", "checks", "errors", "steps", "done")}
    floor = _read(work / "floor" / "report.json")
    if floor:
        out["floor"] = {
            "gpu": (floor.get("environment") or {}).get("gpu"),
            "peaks": (floor.get("floor") or {}).get("peaks"),
            "error": (floor.get("floor") or {}).get("error"),
            "variants": [
                {k: v.get(k) for k in ("name", "status", "device", "floor")} for v in floor.get("variants", [])
            ],
        }
    study = _read(work / "study" / "precision_study.json")
    if study:
        out["study"] = [
            {
                k: r.get(k)
                for k in ("label", "ok", "train_time_s", "step_time_median_s", "peak_memory_bytes", "test_accuracy")
            }
            for r in study.get("runs", [])
        ]
    return out


def _f(v: Any, spec: str, scale: float = 1.0) -> str:
    return "—" if v is None else format(v * scale, spec)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return (
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows] + [""]
    )


def render(data: dict[str, Any]) -> str:
    run, env = data["run"], data.get("env") or {}
    gpu = env.get("gpu") or {}
    L = ["# qserve GPU check", ""]
    L.append(
        f"- call {run.get('call', '?')}, mode: {run.get('mode') or ('dry' if run.get('dry') else 'GPU')}; "
        f"device {run.get('device')}; total {run.get('total_s', '?')} s of the call's {run.get('budget_s', '?')} s"
        + (f" (times x {run['scale']:g})" if run.get("scale", 1) != 1 else "")
    )
    pre = data.get("preflight") or {}
    if pre.get("missing"):
        L.append(
            f"- **preflight: {pre.get('python')} ({pre.get('version')}) lacks** "
            + "; ".join(f"{k}: {v}" for k, v in pre["missing"].items())
        )
    L.append(
        f"- GPU: {gpu.get('name', 'none')} (capability {gpu.get('capability', '—')}, "
        f"{gpu.get('memory_gib', '—')} GiB, bf16 {gpu.get('bf16', '—')}); torch CUDA {env.get('torch_cuda')}"
    )
    vers = env.get("versions") or {}
    L.append("- versions: " + ", ".join(f"{k} {v}" for k, v in vers.items() if v))
    L.append(f"- ONNX Runtime CUDA provider: {(env.get('onnxruntime_cuda') or {}).get('reason', 'not probed')}")
    if run.get("model_note"):
        L.append(f"- model: {run['model_note']}")
    L += ["", "## Stages", ""]
    L += _table(
        ["stage", "status", "exit", "seconds", "limit s", "estimate s", "note"],
        [
            [
                s["stage"],
                s["status"],
                str(s["rc"]),
                f"{s['seconds']:g}",
                _f(s.get("limit_s"), "g"),
                _f(s.get("estimate_s"), "g"),
                s["note"],
            ]
            for s in data["stages"]
        ],
    )
    graphs = data.get("graphs")
    if graphs and graphs.get("checks"):
        L += ["## Graphs and served speed (the full report: gpu_serving.md)", ""]
        L += _table(
            ["check", "measured", "target", "result"],
            [
                [
                    c["name"],
                    _f(c.get("value"), "g"),
                    c["target"],
                    "–" if c["passed"] is None else ("pass" if c["passed"] else "**missed**"),
                ]
                for c in graphs["checks"]
            ],
        )
    pipe, t = data.get("pipeline"), data.get("training")
    if pipe or t:
        L += ["## `qserve pipeline` (defaults)", ""]
    if pipe:
        st = pipe.get("stage_s") or {}
        L.append("- stage times: " + ", ".join(f"{k} {v:.0f} s" for k, v in st.items()) if st else "- no stage times")
        L.append(f"- machine: {pipe.get('machine')}")
        plan = pipe.get("plan") or {}
        for p in plan.get("placements") or []:
            if p.get("device") != plan.get("device"):
                L.append(
                    f"- {p['variant']}: {p.get('device') or 'skipped'}" + (f" ({p['why']})" if p.get("why") else "")
                )
        for name, why in (pipe.get("export_failed") or {}).items():
            L.append(f"- export failed: {name}: {str(why)[:300]}")
        rec = pipe.get("recommended") or {}
        L.append(f"- recommended: {rec.get('variant') or 'none'} ({rec.get('why')})")
    if t:
        L.append(
            f"- training: {t.get('precision')} ({(t.get('precision_choice') or {}).get('reason', '')}), "
            f"batch {t.get('batch_size')}, max length {t.get('max_length')}, {t.get('epochs')} epoch(s), "
            f"sizes {t.get('sizes')}; {_f(t.get('train_time_s'), '.1f')} s, {_f(t.get('samples_per_s'), '.0f')} "
            f"samples/s = {_f(t.get('tokens_per_s'), ',.0f')} tokens/s; test accuracy "
            f"{_f(t.get('test_accuracy'), '.2%')}, val {_f(t.get('val_accuracy'), '.2%')}"
        )
    if pipe or t:
        L.append("")
    bench = data.get("bench")
    if bench:
        b, s = bench["headline"]
        L += [f"## Bench (run device {bench.get('device')}, {bench.get('gpu') or 'no GPU'})", ""]
        rows = []
        for name, v in bench["variants"].items():
            rows.append(
                [
                    name,
                    str(v.get("device")),
                    v.get("isolation") or "process",
                    str(v["status"]),
                    _f(v["p50_ms"], ".2f"),
                    _f(v["throughput"], ",.0f"),
                    _f(v["accuracy"], ".2%"),
                    _f(v["agreement"], ".2%"),
                    _f(v["cuda_max_allocated_mb"], ".0f"),
                    _f(v["peak_rss_mb"], ".0f"),
                    _f(v["load_s"], ".1f"),
                    _f(v["wall_s"], ".1f"),
                ]
            )
        L += _table(
            [
                "variant",
                "device",
                "process",
                "status",
                f"p50 b{b}/s{s} ms",
                f"b{bench['bmax']}/s{s} seq/s",
                "accuracy",
                "agreement",
                "CUDA max alloc MB",
                "peak RSS MB",
                "load s",
                "wall s",
            ],
            rows,
        )
        L += [f"- {n} failed: {str(v['error'])[:300]}" for n, v in bench["variants"].items() if v.get("error")]
    gate = data.get("gate")
    if gate:
        L += ["## Release gate", ""]
        rows = gate.get("rows") or []
        L += (
            _table(list(rows[0]), [list(r.values()) for r in rows])
            if rows
            else [f"No variant gated: {gate.get('why')}", ""]
        )
    lt = data.get("loadtest")
    if lt:
        L += ["## `qserve serve RUN_DIR` + `qserve loadtest` (96 built-in reviews)", ""]
        L += _table(
            ["clients", "requests", "ok", "errors", "lost", "label changes", "p50 ms", "p99 ms", "req/s"],
            [
                [
                    str(lv["concurrency"]),
                    str(lv["requests"]),
                    str(lv["ok"]),
                    str(lv["errors"]),
                    str(lv["lost"]),
                    str(lv["mismatched"]),
                    _f(lv["p50_ms"], ".2f"),
                    _f(lv["p99_ms"], ".2f"),
                    _f(lv["throughput_rps"], ",.0f"),
                ]
                for lv in lt
            ],
        )
    floor = data.get("floor")
    if floor:
        L += ["## GPU floor (`qserve bench` of torch-bf16; the full report: floor_report.md)", ""]
        peaks = floor.get("peaks") or {}
        L.append(
            "- peaks measured: "
            + ", ".join(
                f"{k} {_f((p or {}).get('gflops') if isinstance(p, dict) else p, ',.0f')} GFLOP/s"
                + (f" ({p['method']})" if isinstance(p, dict) and p.get("method") else "")
                for k, p in peaks.items()
            )
            if peaks
            else f"- no floor: {floor.get('error') or 'not measured'}"
        )
        for v in floor["variants"]:
            fl = v.get("floor") or {}
            L.append(
                f"- {v['name']} ({v.get('device')}): {v.get('status')}; floor {_f(fl.get('floor_ms'), '.4f')} ms, "
                f"p50/floor {_f(fl.get('p50_over_floor'), '.1f')}"
            )
        L.append("")
    study = data.get("study")
    if study:
        L += ["## Precision study (`qserve train --compare`; the full table: precision_study.md)", ""]
        L += _table(
            ["run", "ok", "train s", "median step s", "peak memory GB", "test accuracy"],
            [
                [
                    str(r["label"]),
                    str(r["ok"]),
                    _f(r.get("train_time_s"), ".1f"),
                    _f(r.get("step_time_median_s"), ".4f"),
                    _f(r.get("peak_memory_bytes"), ".2f", 1e-9),
                    _f(r.get("test_accuracy"), ".2%"),
                ]
                for r in study
            ],
        )
    L += ["Logs, the run's report dir and the manifests are in gpu_check_files.tar.gz.", ""]
    return "\n".join(L)
