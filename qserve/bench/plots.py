"""PNG charts for a benchmark report (matplotlib, Agg backend: no display needed).

    qserve report benchmarks/reports/embedded-default   # re-draws decision, latency_vs_batch, accuracy_vs_size.png

decision.png: latency and throughput against agreement, the bars drawn and the recommendation ringed;
latency_vs_batch.png and accuracy_vs_size.png. Each variant keeps one colour-blind-safe colour-marker pair in every
chart, and labels go through chartlabels.place, so they never overlap.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qserve.bench.chartlabels import Label, place
from qserve.benchreport import recommendation, shown, summary_rows
from qserve.intervals import wilson
from qserve.variants import AGREEMENT_BAR, REGISTRY, VARIANTS

DPI = 110
# each backend's own (Backend.colour), then Okabe & Ito's others: distinct under every colour-vision deficiency
FAMILY_COLOURS = {b.name: b.colour for b in REGISTRY.values() if b.colour}
SPARE_COLOURS = tuple(c for c in ("#D55E00", "#56B4E9", "#000000", "#F0E442") if c not in FAMILY_COLOURS.values())
PRECISION_MARKERS = {"fp32": "o", "bf16": "s", "fp16": "D", "int8": "^", "int4": "v", "nf4": "P", "fp4": "X"}
SPARE_MARKERS = ("h", "p", "*", "<", ">", "d", "8", "H")
EDGE: dict[str, Any] = {"markeredgecolor": "black", "markeredgewidth": 0.5}  # every marker's outline


@dataclass(frozen=True)
class Style:
    colour: str
    marker: str
    family: str
    precision: str


def _ok(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in report["variants"] if v["status"] == "ok"]


def styles(variants: list[dict[str, Any]]) -> dict[str, Style]:
    """name -> Style: colour by backend family, marker by precision, each pair used once (a taken pair moves to a
    spare marker; an unknown family takes a spare colour)."""
    out: dict[str, Style] = {}
    used: set[tuple[str, str]] = set()
    spare_colour: dict[str, str] = {}
    for v in sorted(variants, key=lambda v: v["name"]):
        spec = v.get("spec") or {}
        head, _, tail = v["name"].partition("-")
        family = str(spec.get("backend") or getattr(VARIANTS.get(v["name"]), "backend", head))
        precision = str(spec.get("dtype") or tail or "?")
        if family not in FAMILY_COLOURS and family not in spare_colour:
            spare_colour[family] = SPARE_COLOURS[len(spare_colour) % len(SPARE_COLOURS)]
        colour = FAMILY_COLOURS.get(family) or spare_colour[family]
        candidates = [PRECISION_MARKERS.get(precision)] + list(SPARE_MARKERS) + list(PRECISION_MARKERS.values())
        marker = next((m for m in candidates if m and (colour, m) not in used), "o")
        used.add((colour, marker))
        out[v["name"]] = Style(colour, marker, family, precision)
    return out


def _legend_order(names: list[str], st: dict[str, Style]) -> list[str]:
    fam = list(FAMILY_COLOURS)
    prec = list(PRECISION_MARKERS)

    def key(n: str) -> tuple:
        s = st[n]
        return (
            fam.index(s.family) if s.family in fam else len(fam),
            s.family,
            prec.index(s.precision) if s.precision in prec else len(prec),
            n,
        )

    return sorted(names, key=key)


def _handle(name: str, s: Style, size: float = 7.0):
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="", marker=s.marker, color=s.colour, markersize=size, label=name, **EDGE)


def _plain_log_ticks(axis) -> None:
    """Log-axis ticks as plain numbers (2, 30, 250), minor ones only at 2x, 3x and 5x."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda x, _: f"{x:g}" if f"{x:.0e}"[0] in "235" else ""))
    axis.set_tick_params(which="both", labelsize=8)


def _freeze_layout(fig) -> None:
    """Run the layout once, then fix it: chartlabels.place works in pixels (see chartlabels.py)."""
    fig.canvas.draw()
    fig.set_layout_engine("none")


def _furniture(fig, *more) -> list:
    """Legends and titles (and `more` artists): a label pushed out of its axes must not land on them."""
    r = fig.canvas.get_renderer()
    parts = list(fig.legends) + [a.title for a in fig.axes] + list(more)
    return [p.get_window_extent(r) for p in parts]


def _pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported when a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(report: dict[str, Any]) -> str:
    cfg = report["config"]
    cpu = ((report.get("environment") or {}).get("cpu") or {}).get("model")
    where = cpu if not str(cfg["device"]).startswith("cuda") else (report.get("environment") or {}).get("gpu")
    name = (report.get("model") or {}).get("name") or "variants"
    return f"{name} on {where or cfg['device']}, threads={cfg['threads']}"


# -- decision chart ----------------------------------------------------------------------------------------
def ranked_latency(report: dict[str, Any]) -> tuple[dict[str, float | None], str]:
    """({variant: the p50 the recommendation ranked it by}, what that p50 is): real-text b1, else the headline shape."""
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    rec = recommendation(report)
    if rec.ranking and rec.shape and rec.shape != f"b{b}/s{s}":
        return {r.variant: r.p50_ms for r in rec.ranking}, "b1 on real texts, p50"
    return {r.variant: r.p50_ms for r in summary_rows(report)}, f"b{b}/s{s} p50"


def decision_points(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant with an agreement: name, ranked p50 (and interval), throughput, size, agreement, bits."""
    spec = {v["name"]: v.get("spec") or {} for v in report["variants"]}
    ranked, _ = ranked_latency(report)
    cis = {r.variant: r.p50_ci for r in recommendation(report).ranking}
    return [
        {"name": r.variant, "p50": ranked.get(r.variant), "p50_ci": cis.get(r.variant), "throughput": r.throughput}
        | {"size_mb": r.size_mb, "agreement": r.agreement, "bits": spec[r.variant].get("bits")}
        for r in summary_rows(report)
        if r.status == "ok" and r.agreement is not None
    ]


def decision_figure(report: dict[str, Any]):
    """The decision chart as a matplotlib Figure (None without agreement numbers: a speed-only run)."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    pts = decision_points(report)
    if not pts:
        return None
    st = styles(_ok(report))
    full = recommendation(report)
    rec = full.variant
    ref = report.get("agreement_reference") or "fp32"
    s = report["headline"]["seq"]
    bmax = max(report["config"]["batch_sizes"])
    n = next((v["accuracy"].get("n") for v in _ok(report) if (v.get("accuracy") or {}).get("n")), None)
    biggest = max(p["size_mb"] or 0 for p in pts) or 1.0

    def area(p: dict[str, Any]) -> float:  # marker area proportional to size on disk
        return max(24.0, 300.0 * (p["size_mb"] or 0) / biggest)

    fig, axes = plt.subplots(1, 2, figsize=(13.5, 5.8), dpi=DPI, layout="constrained")
    _, what = ranked_latency(report)
    tie = " — a tie, broken by the tie rule" if full.tied else ""
    versus = f"\n{rec} vs runner-up {full.runner_up}: {full.ratio_text}{tie}" if full.ratio_text else ""
    panels = [
        (
            axes[0],
            "p50",
            f"{what} (ms, log; bars: interval over rounds): left is faster",
            "Latency (what the recommendation ranks by) vs agreement" + versus,
        ),
        (
            axes[1],
            "throughput",
            f"b{bmax}/s{s} throughput (seq/s, log): right is faster",
            f"Throughput at batch {bmax} vs agreement",
        ),
    ]
    bars = sorted({bar for bar in AGREEMENT_BAR.values()}, reverse=True)
    bar_bits = {bar: "/".join(str(k) for k in sorted(AGREEMENT_BAR) if AGREEMENT_BAR[k] == bar) for bar in bars}
    ys = [p["agreement"] * 100 for p in pts] + [bar * 100 for bar in bars]
    lo, hi = min(ys), max(ys)
    pad = max(0.25, (hi - lo) * 0.12)
    for ax, key, xlabel, title in panels:
        for p in pts:
            if p[key] is None:
                continue
            sv, xy = st[p["name"]], ([p[key]], [p["agreement"] * 100])
            if key == "p50" and p.get("p50_ci"):  # the interval of the median over rounds
                lo_ci, hi_ci = p["p50_ci"]
                xerr = [[max(0.0, p[key] - lo_ci)], [max(0.0, hi_ci - p[key])]]
                ax.errorbar(*xy, xerr=xerr, fmt="none", ecolor=sv.colour, elinewidth=1.2, capsize=3, zorder=2)
            dot = {"marker": sv.marker, "c": sv.colour, "edgecolors": "black", "linewidths": 0.5, "alpha": 0.9}
            ax.scatter(*xy, s=area(p), zorder=3, **dot)
            if p["name"] == rec:
                ring = (math.sqrt(area(p)) + 9) ** 2
                ax.scatter(*xy, s=ring, marker="o", facecolors="none", edgecolors="black", linewidths=1.8, zorder=4)
        for bar, ls in zip(bars, ("--", ":", "-.")):
            ax.axhline(bar * 100, color="0.3", lw=1, ls=ls, zorder=1)
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
        ax.margins(x=0.18)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"agreement with {ref} on {n or 'the'} test reviews (%)")
        ax.set_title(title, fontsize=11)
        ax.grid(True, which="both", alpha=0.25)
    handles = [_handle(nm, st[nm]) for nm in _legend_order([p["name"] for p in pts], st)]
    handles.append(Line2D([], [], linestyle="", label=" "))
    for mb in _size_refs(biggest):
        size = math.sqrt(max(24.0, 300.0 * mb / biggest))
        handles.append(
            Line2D([], [], linestyle="", marker="o", color="0.75", markersize=size, label=f"{mb:g} MB on disk", **EDGE)
        )
    for bar, ls in zip(bars, ("--", ":", "-.")):
        handles.append(Line2D([], [], color="0.3", lw=1, ls=ls, label=f"agreement bar {bar:.0%} ({bar_bits[bar]}-bit)"))
    if rec:
        mark: dict[str, Any] = {"marker": "o", "markersize": 13, "markerfacecolor": "none", "markeredgecolor": "black"}
        handles.append(Line2D([], [], linestyle="", markeredgewidth=1.8, label=f"recommended: {rec}", **mark))
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False, labelspacing=0.9)
    head = fig.suptitle(
        f"Which variant is fast and faithful? {_title(report)}"
        + (f" — recommended: {rec}" if rec else " — no variant meets its bar"),
        fontsize=12,
    )
    _freeze_layout(fig)
    for ax, key, *_ in panels:
        labels = [
            Label(
                p[key],
                p["agreement"] * 100,
                p["name"] + (" (recommended)" if p["name"] == rec else ""),
                radius_px=(math.sqrt(area(p)) + (9 if p["name"] == rec else 0)) / 2 * DPI / 72,
                bold=p["name"] == rec,
            )
            for p in pts
            if p[key] is not None
        ]
        labels.sort(key=lambda lab: not lab.bold)  # the recommendation gets the first pick of spots
        place(ax, labels, avoid=_furniture(fig, head))
    return fig


def _size_refs(biggest: float) -> list[float]:
    """Two or three round sizes for the legend, up to the biggest variant."""
    nice: list[float] = [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
    return [x for x in nice if x <= biggest][-3:] or [1]


# -- latency and throughput against batch size -------------------------------------------------------------
def latency_figure(report: dict[str, Any]):
    plt = _pyplot()

    s = report["headline"]["seq"]
    variants = _ok(report)
    if not variants:
        return None
    st = styles(variants)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13.5, 5.4), dpi=DPI, layout="constrained")
    drawn = []
    for i, v in enumerate(variants):
        recs = sorted((r for r in v.get("fixed") or [] if r.get("seq") == s and "p50" in r), key=lambda r: r["batch"])
        if not recs:
            continue
        sv = st[v["name"]]
        bs = [r["batch"] for r in recs]
        p50 = [r["p50"] for r in recs]
        lo = [0.0] * len(recs)  # whiskers only upward: p50 -> p99, the tail a server sees
        hi = [r["p99"] - r["p50"] for r in recs]
        kw = {"marker": sv.marker, "color": sv.colour, "markersize": 6, "lw": 1.3, **EDGE}
        # nudge each variant sideways a little so whiskers at the same batch size don't hide each other
        dodge = [bb * 1.04 ** (i - (len(variants) - 1) / 2) for bb in bs]
        ax1.errorbar(dodge, p50, yerr=[lo, hi], capsize=3, elinewidth=1, **kw)
        ax2.plot(bs, [r["throughput"] for r in recs], **kw)
        drawn.append(v["name"])
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.grid(True, which="both", alpha=0.3)
        bsz = report["config"]["batch_sizes"]
        ax.set_xticks(bsz)
        ax.set_xticklabels([str(bb) for bb in bsz])
        _plain_log_ticks(ax.yaxis)
    ax1.set_ylabel("latency per batch (ms), p50 with whisker to p99")
    ax1.set_title(f"Latency vs batch size (seq {s})")
    ax2.set_ylabel("throughput (sequences/s)")
    ax2.set_title(f"Throughput vs batch size (seq {s})")
    # one legend for both panels: the same variant is the same colour and marker in each
    label = {v["name"]: shown(v, report) for v in variants}
    handles = [_handle(label[nm], st[nm]) for nm in _legend_order(drawn, st)]
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False, labelspacing=0.9)
    fig.suptitle(_title(report))
    return fig


# -- accuracy against size ---------------------------------------------------------------------------------
def accuracy_figure(report: dict[str, Any]):
    plt = _pyplot()

    ok = [v for v in _ok(report) if (v.get("accuracy") or {}).get("accuracy") is not None and v.get("disk_bytes")]
    if not ok:
        return None
    st = styles(_ok(report))
    rec = recommendation(report).variant
    acc0 = ok[0]["accuracy"]
    fig, ax = plt.subplots(figsize=(9.5, 5.6), dpi=DPI, layout="constrained")
    ys, labels = [], []
    spread = _spread([v["disk_bytes"] / 1e6 for v in ok])
    for v, x in zip(ok, spread):
        a, n = v["accuracy"]["accuracy"], int(v["accuracy"].get("n") or 0)
        y = a * 100
        lo, hi = wilson(round(a * n), n) if n else (a, a)
        sv = st[v["name"]]
        kw = {"marker": sv.marker, "color": sv.colour, "markersize": 8, "alpha": 0.9, "zorder": 3, **EDGE}
        ax.errorbar([x], [y], yerr=[[y - lo * 100], [hi * 100 - y]], capsize=3, elinewidth=1, **kw)
        ys += [lo * 100, hi * 100]
        labels.append(Label(x, y, shown(v, report), radius_px=4 * DPI / 72, bold=v["name"] == rec))
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.margins(x=0.25)
    pad = max(0.3, (max(ys) - min(ys)) * 0.1)
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    ax.set_xlabel("size on disk (MB, log scale; variants of one size spread apart a little, to stay visible)")
    ax.set_ylabel("test accuracy (%), whiskers: 95% interval")
    n = acc0.get("n")
    ax.set_title(
        f"Accuracy vs size ({acc0.get('dataset')} test, n={n}): where whiskers overlap, the "
        "difference is within sampling noise",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    _freeze_layout(fig)
    labels.sort(key=lambda lab: not lab.bold)
    place(ax, labels, avoid=_furniture(fig))
    return fig


def _spread(sizes: list[float], step: float = 1.035) -> list[float]:
    """Sizes within 3% of each other moved apart a few percent on the log axis, so no marker hides another."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and sizes[i] <= sizes[groups[-1][0]] * 1.03:
            groups[-1].append(i)
        else:
            groups.append([i])
    out = list(sizes)
    for g in groups:
        for k, i in enumerate(g):
            out[i] = sizes[i] * step ** (k - (len(g) - 1) / 2)
    return out


# -- files -------------------------------------------------------------------------------------------------
def _save(fig, path: Path) -> Path:
    """Save via a temp file + rename, like every other report file."""
    import matplotlib.pyplot as plt

    tmp = path.with_name(f".{path.name}.tmp.png")
    # no metadata beyond matplotlib's version: re-rendering the same report.json gives the same bytes
    fig.savefig(tmp, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    os.replace(tmp, path)
    return path


CHARTS = {
    "decision.png": decision_figure,
    "latency_vs_batch.png": latency_figure,
    "accuracy_vs_size.png": accuracy_figure,
}


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """Draw every chart from `report` as it is now; one it cannot draw is removed, never left from an earlier draw."""
    written = []
    for name, draw in CHARTS.items():
        fig = draw(report)
        if fig is not None:
            written.append(_save(fig, out / name))
        else:
            (out / name).unlink(missing_ok=True)
    return written
