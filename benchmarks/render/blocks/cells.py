"""How a measured number is written in a rendered cell or sentence: the markdown table, a number, a percentage,
a ratio, a range, minutes; "–" where nothing was measured.

    python -c "from benchmarks.render.blocks.cells import pct, ratio; print(pct(0.9123), ratio(1.5))"
"""

from __future__ import annotations


def table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> str:
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def num(x: float | None, nd: int = 2, suffix: str = "") -> str:
    return "–" if x is None else f"{x:,.{nd}f}{suffix}"


def pct(x: float | None, nd: int = 2) -> str:
    return "–" if x is None else f"{x * 100:.{nd}f}%"


def minutes(s: float) -> str:
    return f"{s / 60:.1f}"


def ratio(v: float | None, nd: int = 2) -> str:
    return "–" if v is None else f"{v:.{nd}f}x"


def span(xs: list[float], nd: int = 2, suffix: str = "") -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.{nd}f}{suffix}" if f"{lo:.{nd}f}" == f"{hi:.{nd}f}" else f"{lo:.{nd}f}-{hi:.{nd}f}{suffix}"
