"""The gate's report: one table (markdown and json) and one picture whose intervals are visible.

    qserve gate RUN_DIR/variants/onnx-int8 RUN_DIR/variants/ov-int8 --out benchmarks/reports/gate

gate.md     variant, n, agreement [lo, hi], accuracy delta [lo, hi], the worst class, ECE before/after, verdict
gate.json   every result in full (what each manifest holds under `gate` and `calibration`)
gate.png    agreement with its interval per variant, the bar drawn: a bound left of the bar fails
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qserve.files import refuse_existing, write_json_atomic, write_text_atomic
from qserve.placement import mark
from qserve.provenance import provenance, with_header

FILES = ("gate.md", "gate.json", "gate.png")


def _pct(x: float | None, signed: bool = False) -> str:
    return "—" if x is None else (f"{x:+.2%}" if signed else f"{x:.2%}")


def _interval(iv: dict[str, float] | None, signed: bool = False) -> str:
    if not iv:
        return "—"
    return f"{_pct(iv['value'], signed)} [{_pct(iv['lo'], signed)}, {_pct(iv['hi'], signed)}]"


def decision(g: dict[str, Any]) -> str:
    """passed, failed or undecided (a verdict from before the sequential gate: passed or failed)."""
    return str(g.get("decision") or ("passed" if g["passed"] else "failed"))


def row(result: dict[str, Any]) -> dict[str, str]:
    """One variant's table row, as text."""
    g = result["gate"]
    worst = g.get("worst_class")
    cal = g.get("calibration") or {}
    ece = cal.get("ece") or {}
    extra = ""
    if "macro_f1" in cal:
        f1 = cal["macro_f1"]
        extra = f"; macro F1 {f1['at_0.5']:.3f} at 0.5 -> {f1['at_thresholds']:.3f} at per-label thresholds"
    if "temperature" in (result.get("calibration") or {}):
        extra = f"; T = {result['calibration']['temperature']:.3f}"
    # a variant scored on another device than its reference (a CUDA run's CPU variant) says so, as bench tables do
    where = mark((g.get("machine") or {}).get("device"), (g.get("reference") or {}).get("device"))
    return {
        "variant": result["variant"] + where,
        "n": str(g["agreement"]["of"]),
        "agreement [lo, hi]": _interval(g["agreement"]),
        "accuracy delta [lo, hi]": _interval(g["accuracy"]["delta"], signed=True),
        "worst class": "—" if not worst else f"{worst['label']}: {_interval(worst)} (n={worst['n']})",
        "ECE before -> after": ("—" if not ece else f"{ece['before']:.4f} -> {ece['after']:.4f}") + extra,
        "verdict": decision(g).upper() + f" at n={g['agreement']['of']} (lower bound >= "
        f"{g['bar']['agreement_lower_bound']:.0%})",
    }


def markdown(results: list[dict[str, Any]]) -> str:
    if not results:
        return "# Release gate\n\nNo variant was gated.\n"
    first = results[0]["gate"]
    d, m = first["data"], first["machine"]
    lines = [
        "# Release gate",
        "",
        f"Each variant against {first['reference']['name']} of the same checkpoint on `{d['dataset']}` "
        f"({d['split']} split, seed {d['seed']}, {d['n']} texts, fingerprint `{d['fingerprint'][:12]}`), "
        f"{first['bar']['confidence']:.0%} intervals: agreement by Wilson, the accuracy delta by a paired "
        f"bootstrap over texts. A variant passes on the LOWER bound of agreement, never the point estimate; "
        "where an interval straddles a bar, more texts are scored under the sequential rule each verdict states "
        "(its intervals then at the confidence of its looks). "
        f"Measured on {m.get('gpu') or m.get('cpu')} ({m['device']}), {first['when']}"
        + (
            f"; the reference on {first['reference']['device']}"
            if first["reference"].get("device") and mark(m["device"], first["reference"]["device"])
            else ""
        )
        + ".",
        "",
    ]
    rows = [row(r) for r in results]
    head = list(rows[0])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]
    lines.append("")
    for r in results:
        g = r["gate"]
        lines.append(
            f"- **{r['variant']}**: "
            + decision(g)
            + f" at {g['agreement']['of']} texts"
            + ("" if g["passed"] else ": " + "; ".join(g["reasons"]))
            + (f" ({g['sequential']['rule']}; looks at {g['sequential']['planned']})" if g.get("sequential") else "")
            + f" (agreement: {g['metric']}; at least {g['bar']['min_n']} "
            + ("pairs" if r["problem_type"].startswith("multi") else "texts")
            + " are needed for the bound to reach the bar at all)."
        )
        for p in g.get("per_class") or []:
            lines.append(
                f"  - {p['label']}: "
                + (
                    f"{_interval(p['agreement'])} over {p['n']} ({p['flips']} flipped)"
                    if p["n"]
                    else "no text (the reference never answers it)"
                )
            )
        cal = r.get("calibration")
        if cal:
            fit = cal["fitted_on"]
            lines.append(
                f"  - calibration fitted on the {fit['split']} split ({fit['n']} texts the gate did not "
                "score): "
                + (
                    f"temperature {cal['temperature']:.4f}"
                    if "temperature" in cal
                    else "thresholds " + ", ".join(f"{lab} {t:.3f}" for lab, t in zip(r["labels"], cal["thresholds"]))
                )
            )
    return "\n".join(lines) + "\n"


def picture(results: list[dict[str, Any]], path: Path) -> Path | None:
    """Agreement and its interval per variant, the bar as a line (None without results)."""
    if not results:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["variant"] for r in results]
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(names) + 1.6))
    for i, r in enumerate(results):
        a = r["gate"]["agreement"]
        color = "tab:green" if r["gate"]["passed"] else "tab:red"
        xerr = [[a["value"] - a["lo"]], [a["hi"] - a["value"]]]
        ax.errorbar([a["value"]], [i], xerr=xerr, fmt="o", color=color, capsize=5, lw=2)
        ax.annotate(
            f"n={a['of']}  [{a['lo']:.2%}, {a['hi']:.2%}]",
            (a["lo"], i),
            xytext=(0, 8),
            textcoords="offset points",
            fontsize=8,
        )
        ax.axvline(r["gate"]["bar"]["agreement_lower_bound"], color="gray", ls="--", lw=1)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.7, len(names) - 0.3)
    from matplotlib.ticker import PercentFormatter

    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("agreement with fp32, 95% interval (dashed: the bar for the lower bound)")
    ax.set_title("Release gate: green passes, red fails")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(results: list[dict[str, Any]], out: Path, force: bool = False) -> list[Path]:
    """gate.md, gate.json and gate.png in `out` (refused over other files unless `force`)."""
    out = Path(out)
    if out.exists() and not force and any(p.name not in FILES for p in out.iterdir()):
        refuse_existing(out, force)
    out.mkdir(parents=True, exist_ok=True)

    report = {"format": "qserve-gate-report/1", "results": results, "provenance": provenance()}
    write_text_atomic(out / "gate.md", render(report))
    write_json_atomic(out / "gate.json", report)
    written = [out / "gate.md", out / "gate.json"]
    png = picture(results, out / "gate.png")
    return written + ([png] if png else [])


def render(report: dict[str, Any]) -> str:
    """gate.md from gate.json (what `make reports` re-renders): the table under its provenance line."""
    return with_header(markdown(report["results"]), report.get("provenance"))


def load(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(Path(path).read_text(encoding="utf-8"))["results"])
