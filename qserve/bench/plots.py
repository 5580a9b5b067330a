"""PNG plots for a benchmark report (matplotlib, Agg backend: no display needed).

    qserve report benchmarks/reports/<run>          # re-draws latency_vs_batch.png, accuracy_vs_size.png

latency_vs_batch.png: p50 latency per batch (with p90..p99 whiskers) and throughput
against batch size at the headline sequence length, one line per variant.
accuracy_vs_size.png: test accuracy against size on disk, one labelled point per variant
(drawn only when accuracy was measured).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MARKERS = "osD^v<>pXh*"


def _ok(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in report["variants"] if v["status"] == "ok"]


def latency_vs_batch(report: dict[str, Any], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["headline"]["seq"]
    variants = _ok(report)
    if not variants:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    for i, v in enumerate(variants):
        recs = sorted((r for r in v.get("fixed") or [] if r.get("seq") == s and "p50" in r), key=lambda r: r["batch"])
        if not recs:
            continue
        bs = [r["batch"] for r in recs]
        p50 = [r["p50"] for r in recs]
        lo = [0.0] * len(recs)  # whiskers only upward: p50 -> p99, the tail a server sees
        hi = [r["p99"] - r["p50"] for r in recs]
        m = MARKERS[i % len(MARKERS)]
        # nudge each variant sideways a little so whiskers at the same batch size don't hide each other
        dodge = [b * 1.04 ** (i - (len(variants) - 1) / 2) for b in bs]
        ax1.errorbar(dodge, p50, yerr=[lo, hi], marker=m, capsize=3, label=v["name"], elinewidth=1)
        ax2.plot(bs, [r["throughput"] for r in recs], marker=m, label=v["name"])
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.grid(True, which="both", alpha=0.3)
        bsz = report["config"]["batch_sizes"]
        ax.set_xticks(bsz)
        ax.set_xticklabels([str(b) for b in bsz])
    ax1.set_ylabel("latency per batch (ms), p50 with whisker to p99")
    ax1.set_title(f"Latency vs batch size (seq {s})")
    ax2.set_ylabel("throughput (sequences/s)")
    ax2.set_title(f"Throughput vs batch size (seq {s})")
    ax1.legend(fontsize=8)
    cfg = report["config"]
    fig.suptitle(f"{(report.get('model') or {}).get('name') or ''} — {cfg['device']}, threads={cfg['threads']}")
    return _save(fig, path)


def accuracy_vs_size(report: dict[str, Any], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(v["disk_bytes"] / 1e6, v["accuracy"]["accuracy"] * 100, v["name"]) for v in _ok(report)
           if (v.get("accuracy") or {}).get("accuracy") is not None and v.get("disk_bytes")]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 5), constrained_layout=True)
    placed: list[tuple[float, float]] = []
    for i, (x, y, name) in enumerate(pts):
        ax.scatter([x], [y], marker=MARKERS[i % len(MARKERS)], s=60, label=name)
        # Variants often coincide (torch-fp32 and onnx-fp32: same size, same accuracy); stack
        # their labels instead of printing them on top of each other.
        near = sum(1 for px, py in placed if abs(px - x) / x < 0.25 and abs(py - y) < 0.15)
        placed.append((x, y))
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 4 + 11 * near), fontsize=8)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda x, _: f"{x:g}")  # 2, 30, 250 rather than 2×10⁰
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    ax.margins(x=0.2)  # room for the point labels
    ax.set_xlabel("size on disk (MB, log scale)")
    ax.set_ylabel("test accuracy (%)")
    acc = next(v["accuracy"] for v in _ok(report) if v.get("accuracy"))
    ax.set_title(f"Accuracy vs size ({acc.get('dataset')} test, n={acc.get('n')})")
    ax.grid(True, which="both", alpha=0.3)
    ys = [p[1] for p in pts]
    pad = max(0.5, (max(ys) - min(ys)) * 0.2)
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    """Save via a temp file + rename, like every other report file."""
    import os

    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    written = [latency_vs_batch(report, out / "latency_vs_batch.png"),
               accuracy_vs_size(report, out / "accuracy_vs_size.png")]
    return [p for p in written if p is not None]
