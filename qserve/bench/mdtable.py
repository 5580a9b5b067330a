"""The pieces every section of a bench report's markdown is written with: blocks, a table, and a cell ("–" where
nothing was measured).

    python -c "from qserve.bench.mdtable import cell, md_table; print(*md_table(['a', 'b'], [['x', cell(1.5)]]))"
"""

from __future__ import annotations

from typing import Any


def cell(x: Any, nd: int = 2, suffix: str = "") -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{nd}f}{suffix}"
    return f"{x}{suffix}"


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.2%}"


def md_table(header: list[str], rows: list[list[str]], align: list[str] | None = None) -> list[str]:
    align = align or ["---"] + ["---:"] * (len(header) - 1)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def blocks(*parts: str | list[str]) -> list[str]:
    """Markdown blocks, each followed by a blank line: a str is one line (a heading, a paragraph), a list a table."""
    return [line for p in parts for line in ([p] if isinstance(p, str) else p) + [""]]
