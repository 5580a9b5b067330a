"""onnx-int8 and ov-int8 agreement with fp32 before and after a dependency upgrade, on one checkpoint (issue #47).

    python -m benchmarks.studies.deps_upgrade models/minilm-tf457 --label after            # this venv
    OLD_VENV/bin/python -m benchmarks.studies.deps_upgrade CKPT --label before              # a venv with the old pins
    python -m benchmarks.studies.deps_upgrade --render benchmarks/reports/deps-upgrade      # report.md from report.json

Each run exports onnx-fp32, onnx-int8 and ov-int8 from the checkpoint with the exporters of the environment it
runs in (the qserve on its import path, the libraries of its venv), scores the first --n test reviews of the
embedded default's test split through each variant's runtime (qserve.runtime.load_runtime, default options),
and compares each with the torch-fp32 variant's logits through the same runtime contract (same tokenization and
long-text policy): top-label agreement and max |Δlogit|. It records the versions it ran with and merges its run
into DIR/report.json under --label.
Agreement is not a timing: it may be measured on a loaded machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import exporters
from benchmarks.harness import ROOT, write_markdown, write_report
from benchmarks.harness.data import reviews
from qserve.provenance import provenance, with_header
from qserve.runtime import load_runtime
from qserve.variants import library_versions

REFERENCE = "torch-fp32"
VARIANTS = ("onnx-fp32", "onnx-int8", "ov-int8")
LIBRARIES = (
    "torch",
    "transformers",
    "tokenizers",
    "optimum",
    "optimum-onnx",
    "optimum-intel",
    "onnx",
    "onnxruntime",
    "openvino",
    "nncf",
    "huggingface-hub",
)


def cpu_name() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
        platform.processor(),
    )


def measure(checkpoint: Path, n: int) -> dict:
    texts = reviews(n)
    run: dict = {
        "checkpoint": str(checkpoint),
        "texts": len(texts),
        "cpu": cpu_name(),
        "versions": library_versions(LIBRARIES),
        "python": platform.python_version(),
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="deps-upgrade-") as tmp:
        exporters.export(checkpoint, REFERENCE, Path(tmp) / REFERENCE)
        ref = load_runtime(Path(tmp) / REFERENCE, "cpu").logits(texts)
        for name in VARIANTS:
            t0 = time.perf_counter()
            manifest = exporters.export(checkpoint, name, Path(tmp) / name).to_json()
            export_s = time.perf_counter() - t0
            got = load_runtime(Path(tmp) / name, "cpu").logits(texts)
            rec = manifest.get("onnx") or manifest.get("openvino") or {}
            run["variants"][name] = {
                "agreement_pct": round(100.0 * float(np.mean(got.argmax(-1) == ref.argmax(-1))), 2),
                "max_abs_logit_diff": round(float(np.abs(got - ref).max()), 5),
                "mean_abs_logit_diff": round(float(np.abs(got - ref).mean()), 5),
                "export_s_loaded_machine": round(export_s, 1),
                "opset": rec.get("opset"),
                "exported_with": rec.get("exported_with"),
                "smoothing": (rec.get("smoothing_choice") or {}).get("chosen"),
            }
            print(name, run["variants"][name], flush=True)
    return run


def render(data: dict) -> str:
    """report.md from report.json (what `make reports` re-renders)."""
    runs = data["runs"]
    labels = [k for k in ("before", "after") if k in runs] + [k for k in runs if k not in ("before", "after")]
    lines = [
        "# Dependency upgrade: agreement with fp32 before and after (issue #47)",
        "",
        f"Checkpoint: `{data['checkpoint']}` ({data.get('checkpoint_note', '')}). "
        f"{runs[labels[0]]['texts']} test reviews of the embedded default; fp32 = the torch-fp32 variant's logits "
        "through the runtime, in the same environment. CPU: "
        + ", ".join(sorted({runs[k]["cpu"] for k in labels}))
        + ".",
        "",
        "Agreement is the share of reviews whose top label equals fp32's. Measured on a machine shared "
        "with other jobs: agreement does not depend on load; the export seconds do, and are shown only as "
        "measured on that loaded machine.",
        "",
        "| variant | " + " | ".join(f"{k}: agreement % | {k}: max abs Δlogit" for k in labels) + " |",
        "|---|" + "---:|---:|" * len(labels),
    ]
    for name in VARIANTS:
        cells = []
        for k in labels:
            v = runs[k]["variants"].get(name, {})
            cells += [str(v.get("agreement_pct", "")), str(v.get("max_abs_logit_diff", ""))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| library | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for lib in LIBRARIES:
        lines.append(
            f"| {lib} | " + " | ".join(str(runs[k]["versions"].get(lib) or "not installed") for k in labels) + " |"
        )
    lines += ["", "Per variant (the ONNX graph's origin is in the notes below):", ""]
    for k in labels:
        for name in VARIANTS:
            v = runs[k]["variants"].get(name, {})
            lines.append(
                f"- {k}, {name}: "
                + ", ".join(
                    [f"opset {v['opset']}"] * bool(v.get("opset"))
                    + [str(v["exported_with"])] * bool(v.get("exported_with"))
                    + [f"smoothing {v['smoothing']}"] * bool(v.get("smoothing"))
                    + [f"export {v.get('export_s_loaded_machine')} s (loaded machine)"]
                )
            )
    for note in data.get("notes", []):
        lines += ["", note]
    return with_header("\n".join(lines).rstrip() + "\n", data.get("provenance"))


def write_md(out: Path) -> None:
    data = json.loads((out / "report.json").read_text(encoding="utf-8"))
    write_markdown(out / "report.md", render(data), data.get("provenance"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", nargs="?", type=Path)
    ap.add_argument("--label", default="after", help="the run's name in report.json: before or after")
    ap.add_argument("--n", type=int, default=1000, help="test reviews scored")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "reports" / "deps-upgrade")
    ap.add_argument("--render", type=Path, help="only write DIR/report.md from DIR/report.json")
    args = ap.parse_args(argv)
    if args.render:
        write_md(args.render)
        return 0
    if args.checkpoint is None:
        ap.error("give a checkpoint directory (or --render DIR)")
    run = measure(args.checkpoint, args.n)
    path = args.out / "report.json"
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"runs": {}}
    data["checkpoint"] = str(args.checkpoint)
    data["runs"][args.label] = run
    data["provenance"] = {
        **provenance(),
        "note": "(The command of the run labelled `" + args.label + "`; each run records its own versions and CPU.)",
    }
    write_report(args.out, data, render(data), echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
