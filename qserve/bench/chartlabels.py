"""Point labels that never overlap: a greedy placer on the renderer's own text boxes.

    qserve report benchmarks/reports/embedded-default     # every labelled chart goes through place()

place() measures each label with the Agg renderer and keeps the first position, on rings of growing radius,
whose box touches no earlier label, marker or avoided box (a leader line when set away). The layout must be final
first (boxes are in pixels). Labels carry gid "qserve-label" for the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only for annotations: the caller has matplotlib loaded already
    from matplotlib.axes import Axes
    from matplotlib.text import Annotation
    from matplotlib.transforms import Bbox

LABEL_GID = "qserve-label"
PAD_PX = 2.0  # air between a label and whatever it must not touch
# 16 directions, the horizontal ones first: a label beside its point reads best.
ANGLES = (0, 180, 30, 150, 330, 210, 60, 120, 300, 240, 90, 270, 15, 165, 345, 195)


@dataclass(frozen=True)
class Label:
    x: float
    """Data coordinates of the point the label names."""
    y: float
    text: str
    radius_px: float = 5.0
    """Half the marker's width in pixels: the label starts beyond it."""
    bold: bool = False


def _box(cx: float, cy: float, w: float, h: float, pad: float = PAD_PX) -> tuple[float, float, float, float]:
    return (cx - w / 2 - pad, cy - h / 2 - pad, cx + w / 2 + pad, cy + h / 2 + pad)


def _hits(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(a: tuple[float, float, float, float], area: tuple[float, float, float, float]) -> bool:
    return a[0] >= area[0] and a[1] >= area[1] and a[2] <= area[2] and a[3] <= area[3]


def boxes_overlap(boxes: list[Bbox]) -> list[tuple[int, int]]:
    """Index pairs of boxes that overlap (for tests and for place()'s own check)."""
    ext = [(b.x0, b.y0, b.x1, b.y1) for b in boxes]
    return [(i, j) for i in range(len(ext)) for j in range(i + 1, len(ext)) if _hits(ext[i], ext[j])]


def place(
    ax: Axes, labels: list[Label], avoid: list[Bbox] | None = None, fontsize: float = 8, max_radius_px: float = 320.0
) -> list[Annotation]:
    """Annotate each point with its text where it overlaps nothing placed before it; returns the annotations."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # the Agg canvas (the only one used) has it
    px_to_pt = 72.0 / fig.dpi
    inner = ax.get_window_extent(renderer)
    inner_area = (inner.x0, inner.y0, inner.x1, inner.y1)
    whole = fig.bbox
    fig_area = (whole.x0 + 2, whole.y0 + 2, whole.x1 - 2, whole.y1 - 2)
    points = [ax.transData.transform((lab.x, lab.y)) for lab in labels]
    # Every marker is an obstacle for every label, its own included.
    taken = [_box(px, py, 2 * lab.radius_px, 2 * lab.radius_px, pad=1.0) for (px, py), lab in zip(points, labels)]
    taken += [(b.x0, b.y0, b.x1, b.y1) for b in (avoid or [])]
    out = []
    for (px, py), lab in zip(points, labels):
        weight = "bold" if lab.bold else "normal"
        probe = ax.text(lab.x, lab.y, lab.text, fontsize=fontsize, fontweight=weight, ha="center", va="center")
        bb = probe.get_window_extent(renderer)
        probe.remove()
        cx, cy, far = _find(px, py, bb.width, bb.height, lab.radius_px, taken, (inner_area, fig_area), max_radius_px)
        # set away from its point, a label gets a leader line that says which point it names
        arrow = (
            {"arrowstyle": "-", "lw": 0.6, "color": "0.35", "shrinkA": 1, "shrinkB": lab.radius_px * px_to_pt}
            if far
            else None
        )
        out.append(
            ax.annotate(
                lab.text,
                (lab.x, lab.y),
                xytext=((cx - px) * px_to_pt, (cy - py) * px_to_pt),
                textcoords="offset points",
                ha="center",
                va="center",
                fontsize=fontsize,
                fontweight=weight,
                annotation_clip=False,
                gid=LABEL_GID,
                zorder=5,
                arrowprops=arrow,
            )
        )
        taken.append(_box(cx, cy, bb.width, bb.height))
    return out


def _find(
    px: float, py: float, w: float, h: float, r0: float, taken: list, areas: tuple, max_r: float
) -> tuple[float, float, bool]:
    """Centre (cx, cy) of the first free spot and whether it needs a leader line: inside the axes first, then the
    figure, then ever larger rings."""
    for area in areas:
        r = r0 + PAD_PX
        while r <= max_r:
            for a in ANGLES:
                c, s = math.cos(math.radians(a)), math.sin(math.radians(a))
                # the box's near edge sits r from the point along this direction
                cx, cy = px + c * (r + w / 2), py + s * (r + h / 2)
                box = _box(cx, cy, w, h)
                if _inside(box, area) and not any(_hits(box, t) for t in taken):
                    return cx, cy, r > r0 + 12
            r += 4.0
    r = max_r
    while True:  # never give up with an overlap: go further out, past the figure if it must
        r += 8.0
        for a in ANGLES:
            c, s = math.cos(math.radians(a)), math.sin(math.radians(a))
            cx, cy = px + c * (r + w / 2), py + s * (r + h / 2)
            box = _box(cx, cy, w, h)
            if not any(_hits(box, t) for t in taken):
                return cx, cy, True
