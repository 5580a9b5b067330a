"""The bench report's eager-vs-graphs rows, rendered from synthetic child results of a CUDA run (no GPU here), and
nothing new in a CPU run's report; the floor's saturating shapes on a GPU.

    python -m pytest tests/unit/test_bench_graphs_report.py -q
"""

from __future__ import annotations

import csv
import io

from qserve.bench import analysis
from qserve.bench.config import BenchConfig
from qserve.bench.report import render_csv, render_md
from qserve.bench.stats import summarize


def _fixed(p50s: dict[tuple[int, int], float]) -> list[dict]:
    out = []
    for (b, s), p in p50s.items():
        rec = {"batch": b, "seq": s, **summarize([p * 0.9, p, p, p * 1.2])}
        rec["throughput"] = b / (rec["mean"] / 1e3)
        out.append(rec)
    return out


def _meta(name: str, dtype: str, backend: str) -> analysis.VariantMeta:
    from qserve.artifact import Manifest, ModelMeta
    from qserve.variants import spec_of

    spec = spec_of({"name": name, "backend": backend, "bits": 16, "dtype": dtype})
    manifest = Manifest(
        spec=spec, labels=("negative", "positive"), max_length=128, model_name="m", parity={"agreement": 1.0}
    )
    return analysis.VariantMeta(f"/v/{name}", manifest, ModelMeta(dataset="default"), None, disk_bytes=1_000_000)


GRAPHS = {
    "asked": "auto",
    "mode": "graphs",
    "why": "auto: graphs measured faster than eager at load (b1/s32 0.300 "
    "vs 2.900 ms, b32/s128 0.700 vs 3.200 ms, graphs vs eager)",
    "graphs": {"count": 27},
}


def _report(device: str, with_graphs: bool) -> dict:
    cfg = BenchConfig(batch_sizes=[1, 32], seq_lens=[128], threads=2, device=device).validate()
    ok = {"status": "ok", "load_s": 0.5, "device": device, "peak_rss_mb": 500.0}
    raws = [
        {**ok, "name": "torch-bf16", "fixed": _fixed({(1, 128): 0.4, (32, 128): 0.9})},
        {**ok, "name": "onnx-fp32", "fixed": _fixed({(1, 128): 2.0, (32, 128): 9.0})},
    ]
    if with_graphs:
        raws[0].update(
            execution=GRAPHS, fixed_eager=[{**r, "mode": "eager"} for r in _fixed({(1, 128): 2.5, (32, 128): 2.7})]
        )
    metas = [_meta("torch-bf16", "bf16", "torch"), _meta("onnx-fp32", "fp32", "onnx")]
    report = {
        "format": "qserve-bench/1",
        "created": "2020-01-01T00:00:00+00:00",
        "run": {"name": "r", "out": "x"},
        "config": cfg.to_json(),
        "headline": {"batch": 1, "seq": 128},
        "model": {"name": "m"},
        "floor": {},
        "environment": {
            "cpu": {"model": "Test CPU", "cores": 16, "flags": []},
            "threads": 2,
            "device": device,
            "versions": {},
            "python": "3",
            "platform": "linux",
            "gpu": "NVIDIA H200",
        },
        "variants": [analysis.variant_entry(m, r) for m, r in zip(metas, raws, strict=True)],
    }
    return analysis.finish(report)


def test_cuda_report_shows_each_torch_variant_eager_and_with_graphs():
    rep = _report("cuda", with_graphs=True)
    v = rep["variants"][0]
    assert v["execution"]["mode"] == "graphs" and len(v["fixed_eager"]) == 2
    md = render_md(rep)
    assert "## Eager and CUDA graphs (torch variants on CUDA)" in md
    section = md.split("## Eager and CUDA graphs")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| torch-bf16")]
    assert [r.split("|")[1].strip() for r in rows] == ["torch-bf16 (eager)", "torch-bf16 (graphs)"]
    eager, graphed = ([c.strip() for c in r.split("|")[1:-1]] for r in rows)
    assert eager[1] == "2.500" and graphed[1] == "0.400" and graphed[4] == "6.25×"  # p50 2.5 -> 0.4 ms
    assert eager[4] == "–" and float(graphed[5].rstrip("×")) > 1
    assert "- torch-bf16: **graphs** (auto: graphs measured faster" in section
    assert "onnx-fp32" not in section  # other backends have no execution record
    kinds = [(r["variant"], r["kind"]) for r in csv.DictReader(io.StringIO(render_csv(rep)))]
    assert kinds.count(("torch-bf16", "fixed_eager")) == 2 and ("onnx-fp32", "fixed_eager") not in kinds


def test_a_cpu_report_has_no_graph_section_or_rows():
    rep = _report("cpu", with_graphs=False)
    assert "execution" not in rep["variants"][0] and "fixed_eager" not in rep["variants"][0]
    assert "Eager and CUDA graphs" not in render_md(rep)
    assert "fixed_eager" not in render_csv(rep)


def test_the_floor_adds_saturating_cubes_on_a_gpu_only():
    from qserve.bench.floor import GPU_SATURATING, gemm_shapes, shapes_for

    cfg = {"dim": 384, "n_layers": 6, "hidden_dim": 1536, "n_heads": 12}
    base = gemm_shapes(cfg, 128)
    assert shapes_for(base, "cpu") == base  # CPU: unchanged
    gpu = shapes_for(base, "cuda:0")
    assert gpu[: len(base)] == base and gpu[len(base) :] == GPU_SATURATING  # model shapes stay first
    assert (8192, 8192, 8192) in gpu
