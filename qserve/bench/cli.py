"""`qserve bench` and `qserve report`: measure variants, (re-)render reports.

    qserve bench models/minilm-imdb-variants/* --batch-sizes 1,8,32 --seq-lens 32,128,256 --threads 2
    qserve report benchmarks/reports/minilm-l6-distilbert-cpu-t2

`qserve bench` writes into --out (default benchmarks/reports/<model>-<device>-t<threads>,
or benchmarks/reports/<--name>): report.json, report.csv, report.md,
latency_vs_batch.png and (when accuracy was measured) accuracy_vs_size.png. It refuses
to overwrite a non-empty --out without --force. A VARIANT_DIR that holds variant
directories (e.g. models/minilm-imdb-variants) stands for all of them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from qserve import QserveError


def expand_variant_dirs(paths: list[str]) -> list[Path]:
    """Each path is a variant dir (has manifest.json) or a folder of them (expanded, sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir() and not (p / "manifest.json").exists():
            kids = sorted(k for k in p.iterdir() if k.is_dir() and (k / "manifest.json").exists())
            if kids:
                out.extend(kids)
                continue
        if not p.exists():
            raise QserveError(f"VARIANT_DIR {p} does not exist; pass directories written by `qserve export`")
        out.append(p)  # a broken variant is still benchmarked, so its failure is reported
    return out


def register(subparsers) -> None:
    from qserve.bench.config import BenchConfig

    d = BenchConfig()
    p = subparsers.add_parser(
        "bench", help="benchmark variants (latency, throughput, memory, size, accuracy), each in its own process",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("variants", nargs="+", metavar="VARIANT_DIR", help="variant directories (or a folder of them)")
    p.add_argument("--batch-sizes", default=",".join(map(str, d.batch_sizes)),
                   help="comma-separated batch sizes for fixed-shape latency (default %(default)s)")
    p.add_argument("--seq-lens", default=",".join(map(str, d.seq_lens)),
                   help="comma-separated sequence lengths in tokens (default %(default)s)")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads for torch and ONNX Runtime (default: physical cores)")
    p.add_argument("--device", default=d.device, help="cpu, cuda, cuda:N or auto (default %(default)s)")
    p.add_argument("--out", type=Path, default=None,
                   help="report directory (default benchmarks/reports/<model>-<device>-t<threads>)")
    p.add_argument("--name", default=None, help="run name for the default --out")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty --out")
    p.add_argument("--allow-extra-files", action="store_true",
                   help="load variants whose directory holds files the manifest does not list (refused by default)")
    p.add_argument("--no-accuracy", dest="accuracy", action="store_false",
                   help="speed only: skip accuracy and agreement")
    p.add_argument("--dataset", default=None, help="dataset for accuracy (default: the variant's qserve_model.json)")
    p.add_argument("--seed", type=int, default=None, help="split seed (default: the variant's, else 42)")
    p.add_argument("--max-eval-samples", type=int, default=None,
                   help="cap on test texts for accuracy (default: the variant's, else the whole test split)")
    p.add_argument("--long-text", default=None, metavar="POLICIES",
                   help="compare long-text policies on the test split, e.g. head,head-tail,windows (each of head, "
                        "tail, head-tail[:H], windows[:W[:S[:mean|max]]]): accuracy, agreement and texts/s per "
                        "policy, head always included (default: each variant's own policy only)")
    p.add_argument("--real-text-samples", type=int, default=d.real_text_samples,
                   help="test texts for real-text latency; 0 skips it (default %(default)s)")
    p.add_argument("--invariance-samples", type=int, default=d.invariance_samples,
                   help="test texts scored alone and in mixed batches of 8 and 32 (batch invariance); 0 skips it "
                        "(default %(default)s)")
    p.add_argument("--time-budget", type=float, default=d.time_budget_s,
                   help="seconds of timed calls per shape (default %(default)s)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="warm-up calls per shape (default %(default)s)")
    p.add_argument("--min-iters", type=int, default=d.min_iters,
                   help="timed calls per shape even past the budget (default %(default)s)")
    p.add_argument("--max-iters", type=int, default=d.max_iters, help="cap on timed calls per shape (default %(default)s)")
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="skip measuring peak GEMM rates (the floor is then not stated)")
    p.add_argument("--floor-budget", type=float, default=d.floor_budget_s,
                   help="seconds per GEMM shape when measuring peak rates (default %(default)s)")
    p.add_argument("--child-timeout", type=float, default=d.child_timeout_s,
                   help="kill a variant's process after this many seconds (default %(default)s)")
    p.set_defaults(func=cmd_bench)

    r = subparsers.add_parser("report", help="re-render report.md/csv and plots from a bench report.json",
                              description="Re-render report.md, report.csv and the PNG plots from report.json.")
    r.add_argument("report", metavar="REPORT_JSON_OR_DIR", help="report.json or the directory holding it")
    r.add_argument("--out", type=Path, default=None, help="write here instead of beside report.json")
    r.set_defaults(func=cmd_report)


def config_from_args(args) -> "BenchConfig":  # noqa: F821
    from qserve.bench.config import BenchConfig, parse_int_list

    return BenchConfig(
        batch_sizes=parse_int_list(args.batch_sizes, "--batch-sizes"), seq_lens=parse_int_list(args.seq_lens, "--seq-lens"),
        threads=args.threads, device=args.device, out=args.out, accuracy=args.accuracy, dataset=args.dataset,
        seed=args.seed, max_eval_samples=args.max_eval_samples, real_text_samples=args.real_text_samples,
        invariance_samples=args.invariance_samples,
        long_text=args.long_text.split(",") if args.long_text is not None else None,
        time_budget_s=args.time_budget, warmup=args.warmup, min_iters=args.min_iters, max_iters=args.max_iters,
        floor=args.floor, floor_budget_s=args.floor_budget, child_timeout_s=args.child_timeout, name=args.name, force=args.force,
        allow_extra_files=args.allow_extra_files,
    ).validate()


def cmd_bench(args) -> int:
    from qserve.bench.runner import run_bench

    cfg = config_from_args(args)
    report = run_bench(expand_variant_dirs(args.variants), cfg)
    out = Path(report["run"]["out"])
    print((out / "report.md").read_text(encoding="utf-8").split("\n## ", 1)[0].rstrip())
    print(f"\nwrote {out}/report.md, report.json, report.csv and plots")
    failed = [v["name"] for v in report["variants"] if v["status"] != "ok"]
    if failed:
        print(f"{len(failed)} variant(s) failed: {', '.join(failed)} (details in report.md)")
        return 1
    return 0


def cmd_report(args) -> int:
    from qserve.bench.report import load_report, write_reports

    report, where = load_report(args.report)
    out = args.out or where
    written = write_reports(report, out, write_json=Path(out).resolve() != where.resolve())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
