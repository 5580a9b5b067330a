"""report.html: the whole benchmark report as one self-contained page to open in a browser.

    qserve report benchmarks/reports/embedded-default && xdg-open benchmarks/reports/embedded-default/report.html

report.md's content converted (so the two never disagree), charts inline as data: URIs; no script, and a CSP
that fetches nothing.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

from qserve.benchreport import recommendation

_IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")
_CELL_SPLIT = re.compile(r"(?<!\\)\|")
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

STYLE = Path(__file__).with_name("report.css").read_text(encoding="utf-8")  # the page's stylesheet


def _inline(text: str) -> str:
    """The markdown report.md uses inside a line: `code`, **bold**, and \\| in table cells."""
    out = html.escape(text.replace("\\|", "|"), quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL_SPLIT.split(line.strip().strip("|"))]


def _table(lines: list[str], highlight: str | None) -> str:
    head, align, body = _cells(lines[0]), _cells(lines[1]), [_cells(x) for x in lines[2:]]
    cls = [' class="r"' if a.endswith(":") else "" for a in align] + [""] * len(head)
    rows = ["<tr>" + "".join(f"<th{cls[i]}>{_inline(c)}</th>" for i, c in enumerate(head)) + "</tr>"]
    for r in body:
        mark = ' class="recommended"' if highlight and r and r[0] == highlight else ""
        rows.append(f"<tr{mark}>" + "".join(f"<td{cls[i]}>{_inline(c)}</td>" for i, c in enumerate(r)) + "</tr>")
    return '<div class="scroll"><table>\n' + "\n".join(rows) + "\n</table></div>"


def _figure(alt: str, data: bytes) -> str:
    b64 = base64.b64encode(data).decode("ascii")
    return (
        f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'
        f"<figcaption>{html.escape(alt)}</figcaption></figure>"
    )


def md_to_html(
    md: str, images: dict[str, bytes], highlight: str | None = None, skip: frozenset[str] | set[str] = frozenset()
) -> str:
    """report.md's own subset of markdown (headings, paragraphs, lists, tables, images) as HTML.
    Images are inlined from `images` (file name -> bytes); lines in `skip` are left out."""
    blocks: list[list[str]] = [[]]
    for line in md.splitlines():
        if line.strip() and line not in skip:
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    out = []
    for b in (b for b in blocks if b):
        first = b[0]
        if first.startswith("#"):
            level = min(len(first) - len(first.lstrip("#")), 4)
            out.append(f"<h{level}>{_inline(first.lstrip('#').strip())}</h{level}>")
            b = b[1:]
            if not b:
                continue
            first = b[0]
        if first.startswith("|") and len(b) >= 2:
            out.append(_table(b, highlight))
        elif all(x.startswith("- ") for x in b):
            out.append("<ul>" + "".join(f"<li>{_inline(x[2:])}</li>" for x in b) + "</ul>")
        elif len(b) == 1 and (image := _IMAGE.match(first)):
            alt, src = image.groups()
            if src in images:
                out.append(_figure(alt, images[src]))
        else:
            out.append(f"<p>{_inline(' '.join(b))}</p>")
    return "\n".join(out)


def render_html(report: dict[str, Any], md: str, images: dict[str, bytes]) -> str:
    """The page, from report.json, the report.md rendered from it, and the charts' PNG bytes: the verdict and the
    summary table first, so they fill the first screen."""
    model = report.get("model") or {}
    title = f"{model.get('name') or 'variants'} on {report['config']['device']}: qserve benchmark"
    rec, lines = recommendation(report).variant, md.splitlines()
    verdict = lines[2] if len(lines) > 2 and lines[2].startswith("**") else ""  # report.render_md's verdict_line
    top = [f"<h1>{html.escape(lines[0].lstrip('#').strip())}</h1>"]
    if verdict:
        none = "" if rec else " none"
        top.append(f'<section class="rec{none}" id="recommended">{_inline(verdict)}</section>')
    body = md_to_html(md, images, highlight=rec, skip={lines[0], verdict})
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<link rel="icon" href="data:,">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<header>\n"
        + "\n".join(top)
        + "\n</header>\n<main>\n"
        + body
        + "\n</main>\n"
        "<footer>Written by <code>qserve bench</code> / <code>qserve report</code> from report.json; "
        "report.md, report.csv and report.json beside this file hold the same numbers.</footer>\n"
        "</body>\n</html>\n"
    )
