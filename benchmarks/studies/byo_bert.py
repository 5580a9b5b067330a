"""Bring your own BERT, on real weights: the embedded all-MiniLM-L6-v2 as a BertForSequenceClassification.

    python -m benchmarks.studies.byo_bert                      # train -> export --all -> agreement -> bench -> serve
    python -m benchmarks.studies.byo_bert --skip-bench         # without the latency bench

The embedded default maps these weights into DistilBERT's layout; here they load as what they are
(`qserve train --model embedded-bert`: segment embeddings, pooler, token_type_ids in every graph),
the layout issue #21 found ov-int8 crashing on. Each stage is the real CLI in a child process:

1. `qserve train --model embedded-bert --max-samples 1500` (IMDb, the embedded data set)
2. `qserve export CHECKPOINT --all` (a failed variant is one line and a non-zero exit: recorded, not fatal)
3. agreement of every variant with the checkpoint's fp32 predictions on 2,000 held-out test reviews,
   through `load_runtime(...).predict`, the path bench and serve use; bar: ov-int8 >= 99%
4. `qserve bench` over the variants (latency, memory, accuracy; its own report under report/)
5. `qserve serve` on ov-int8: one /v1/classify request must return the in-process answer

Writes benchmarks/reports/byo-bert/report.{json,md} (the run directory, models/byo-bert by default, holds
the checkpoint, variants and bench report). Exit status 1 when ov-int8 misses the bar or a stage fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import numpy as np

from benchmarks.harness import ROOT, Server, reviews, write_report
from exporters.core import checkpoint_info, reference_logits, variant_policy
from qserve.artifact import ModelMeta, read_model_meta
from qserve.devices import cpu_info, cpu_label
from qserve.provenance import provenance, with_header
from qserve.runtime import load_runtime

OUT = ROOT / "benchmarks" / "reports" / "byo-bert"
BAR = {"ov-int8": 0.99}
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
}


def qserve(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    print("$ qserve " + " ".join(argv), flush=True)
    res = subprocess.run(
        [sys.executable, "-m", "qserve", *argv],
        cwd=ROOT,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    print(res.stdout[-4000:], flush=True)
    if check and res.returncode != 0:
        raise SystemExit(f"qserve {argv[0]} exited {res.returncode}")
    return res


def agreement(checkpoint: Path, variants: list[Path], samples: int) -> dict[str, dict]:
    """Each variant's prediction agreement with the checkpoint's fp32 on `samples` test reviews."""
    info = checkpoint_info(checkpoint)
    meta = info.meta
    if meta is None or not meta.dataset:
        raise SystemExit(f"{checkpoint} records no dataset in its qserve_model.json")
    texts = reviews(samples, meta.dataset, seed=meta.seed if meta.seed is not None else 42)
    max_length = info.max_length
    # the yardstick reads each review as the variants do: under the policy the checkpoint recorded (head-tail
    # by default), which every variant's manifest carries; a reference cut another way would count the
    # policy's difference as the variant's
    policy = variant_policy(info)
    ref = np.concatenate(
        [reference_logits(checkpoint, texts[i : i + 64], max_length, policy) for i in range(0, len(texts), 64)]
    )
    out = {}
    for v in variants:
        t0 = time.perf_counter()
        rt = load_runtime(v, "cpu")
        if str(rt.long_text) != policy:
            raise SystemExit(f"{v}: long-text policy {rt.long_text} differs from the checkpoint's {policy}")
        got = np.concatenate([rt.logits(texts[i : i + 32]) for i in range(0, len(texts), 32)])
        rt.close()
        out[v.name] = {
            "agreement": float(np.mean(got.argmax(-1) == ref.argmax(-1))),
            "max_abs_logit_diff": float(np.abs(got - ref).max()),
            "mean_abs_margin_error": float(np.mean(np.abs(np.diff(got, axis=1) - np.diff(ref, axis=1)))),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"  {v.name}: agreement {out[v.name]['agreement']:.2%}", flush=True)
    return out


def serve_check(variant: Path) -> dict:
    """`qserve serve` on `variant` in a child; one request, compared with the in-process answer."""
    text = "A wonderful, moving film with superb performances."
    with tempfile.TemporaryDirectory(prefix="byo-bert-serve-") as tmp:
        srv = Server([str(variant), "--device", "cpu"], ROOT, Path(tmp) / "server.log", env=ENV)
        try:
            srv.wait_ready(180)
            r = httpx2.post(srv.url + "/v1/classify", json={"inputs": text}, trust_env=False, timeout=30)
            served = max(p["score"] for p in r.json()["predictions"][0])
        finally:
            srv.stop()
    rt = load_runtime(variant, "cpu")
    local = float(rt.predict([text]).max())
    rt.close()
    return {
        "variant": variant.name,
        "status": r.status_code,
        "served_score": served,
        "local_score": local,
        "match": abs(served - local) < 1e-5,
    }


def render(report: dict) -> str:
    lines = [
        f"# Bring your own BERT: {report['model']} (`--model embedded-bert`)",
        "",
        f"Trained with `qserve train --model embedded-bert --max-samples {report['max_samples']}`; "
        f"agreement with that checkpoint's fp32 on {report['samples']:,} held-out test reviews, through "
        f"`load_runtime(...).predict`, every review read as the checkpoint records (long-text policy "
        f"`{report.get('long_text') or 'head'}`), the reference cut the same way; the checkpoint's own test "
        f"accuracy {report.get('test_accuracy', float('nan')):.2%}. "
        "Generated by `python -m benchmarks.studies.byo_bert`.",
        "",
        f"Machine: {cpu_label(report['environment']['cpu'])}, {report['environment']['cpu_count']} logical CPUs.",
        "",
        f"export --all: exit {report['export']['exit']}"
        + (f", failed: {report['export']['failed']}" if report["export"]["failed"] else ""),
        "",
        "| variant | agreement | max abs logit diff | mean abs margin error | bar |",
        "|---|---|---|---|---|",
    ]
    for name, r in report["agreement"].items():
        bar = f">= {BAR[name]:.0%}: {'pass' if r['agreement'] >= BAR[name] else 'FAIL'}" if name in BAR else ""
        lines.append(
            f"| {name} | {r['agreement']:.2%} | {r['max_abs_logit_diff']:.3g} | "
            f"{r['mean_abs_margin_error']:.3g} | {bar} |"
        )
    if report.get("serve"):
        s = report["serve"]
        lines += [
            "",
            f"serve: {s['variant']} answered {s['status']}, score {s['served_score']:.6f} "
            f"(in-process {s['local_score']:.6f}, {'same' if s['match'] else 'DIFFERENT'})",
        ]
    if report.get("bench"):
        lines += ["", f"bench report: {report['bench']}"]
    return "\n".join(lines) + "\n"


def render_md(report: dict) -> str:
    """report.md: the provenance header (command, commit, CPU), then `render`."""
    return with_header(render(report), report["provenance"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", type=Path, default=ROOT / "models" / "byo-bert")
    p.add_argument("--max-samples", type=int, default=1500, help="training reviews (default %(default)s)")
    p.add_argument("--samples", type=int, default=2000, help="test reviews for agreement (default %(default)s)")
    p.add_argument("--skip-bench", action="store_true", help="skip `qserve bench` (latency and memory)")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    ckpt, variants_dir = args.run_dir / "checkpoint", args.run_dir / "variants"
    if not (ckpt / "qserve_model.json").is_file():
        qserve("train", "--model", "embedded-bert", "--max-samples", str(args.max_samples), "--out", str(ckpt))
    exported = qserve(
        "export", str(ckpt), "--all", "--out", str(variants_dir), "--device", "cpu", "--force", check=False
    )
    # one indented "    failed: VARIANT: TYPE: message" line per failed variant
    failed = [ln.split(":")[1].strip() for ln in exported.stdout.splitlines() if ln.startswith("    failed: ")]
    variants = sorted(d for d in variants_dir.iterdir() if (d / "manifest.json").is_file())

    report = {
        "model": "minilm-l6-bert",
        "max_samples": args.max_samples,
        "samples": args.samples,
        "environment": {"cpu": cpu_info(), "cpu_count": os.cpu_count()},
        "long_text": (read_model_meta(ckpt) or ModelMeta()).long_text,
        "test_accuracy": json.loads((ckpt / "train_metrics.json").read_text(encoding="utf-8")).get("test_accuracy"),
        "export": {"exit": exported.returncode, "failed": failed},
        "agreement": agreement(ckpt, variants, args.samples),
    }
    if not args.skip_bench:
        bench_dir = args.out / "bench"  # committed beside this report
        qserve("bench", *map(str, variants), "--out", str(bench_dir), "--device", "cpu", "--force")
        report["bench"] = (
            str((bench_dir / "report.md").relative_to(ROOT))
            if bench_dir.is_relative_to(ROOT)
            else str(bench_dir / "report.md")
        )
    if (variants_dir / "ov-int8").is_dir():
        report["serve"] = serve_check(variants_dir / "ov-int8")

    report["provenance"] = provenance()
    write_report(args.out, report, render(report))
    ok = all(report["agreement"].get(n, {}).get("agreement", 0.0) >= b for n, b in BAR.items())
    ok = ok and exported.returncode == 0 and (report.get("serve") or {}).get("match", False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
