"""The report's charts for 12 variants: no two labels overlap, each variant its own colour-marker pair,
the recommendation ringed and named; report.html is one self-contained file.

    python -m pytest tests/unit/test_bench_plots.py -q
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

EMBEDDED = Path(__file__).resolve().parents[2] / "benchmarks" / "reports" / "embedded-default" / "report.json"


@pytest.fixture(scope="module")
def report() -> dict:
    r = json.loads(EMBEDDED.read_text(encoding="utf-8"))
    assert len([v for v in r["variants"] if v["status"] == "ok"]) == 12
    return r


def crowded(report: dict) -> dict:
    """The same 12 variants with every speed, size and agreement pulled onto two points: a worst case
    for labels (the real report has four fp32 variants at one size and agreement already)."""
    r = copy.deepcopy(report)
    for i, v in enumerate(r["variants"]):
        v["disk_bytes"] = 92_000_000
        v["agreement"] = 1.0 if i % 2 else 0.999
        v["accuracy"]["accuracy"] = 0.841
        for rec in v["fixed"]:
            rec["p50"], rec["p99"], rec["throughput"] = 10.0 * rec["batch"], 12.0 * rec["batch"], 100.0
    return r


def _label_boxes(fig):
    from matplotlib.text import Text

    from qserve.bench.chartlabels import LABEL_GID

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        texts = [t for t in ax.texts if t.get_gid() == LABEL_GID]
        # Text's own extent: an Annotation's would include its leader line
        out.append([(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts])
    return out


@pytest.mark.parametrize("which", ["real", "crowded"])
@pytest.mark.parametrize("chart", ["decision_figure", "accuracy_figure"])
def test_no_two_labels_overlap(report, which, chart):
    import matplotlib.pyplot as plt

    from qserve.bench import plots
    from qserve.bench.chartlabels import boxes_overlap

    r = report if which == "real" else crowded(report)
    fig = getattr(plots, chart)(r)
    try:
        per_axes = _label_boxes(fig)
        for labels in per_axes:
            if not labels:
                continue
            assert len(labels) == 12, [t for t, _ in labels]
            bad = boxes_overlap([b for _, b in labels])
            assert bad == [], [(labels[i][0], labels[j][0]) for i, j in bad]
        assert sum(1 for labels in per_axes if labels) == (2 if chart == "decision_figure" else 1)
    finally:
        plt.close(fig)


def _drawn_texts(fig) -> list:
    """(text, extent) of every text the figure draws: titles, axis and tick labels, legends, point labels (a tick
    label outside its axis' view is not drawn)."""
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            ticks = axis.get_major_ticks() + axis.get_minor_ticks()
            hidden |= {id(t.label1) for t in ticks if not lo <= t.get_loc() <= hi}
    return [
        (t.get_text(), Text.get_window_extent(t, renderer))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and id(t) not in hidden
    ]


@pytest.mark.parametrize("which", ["real", "crowded", "main job"])
@pytest.mark.parametrize("chart", ["decision.png", "latency_vs_batch.png", "accuracy_vs_size.png"])
def test_no_chart_text_overlaps_any_other(report, which, chart):
    """Every text of every chart, from the renderer's own extents: the decision chart's two x-axis labels once
    overlapped."""
    import matplotlib.pyplot as plt

    from qserve.bench import plots
    from qserve.bench.chartlabels import boxes_overlap

    main_job = EMBEDDED.parents[1] / "pipeline-auto-zen4" / "report.json"
    r = {"real": report, "crowded": crowded(report)}.get(which) or json.loads(main_job.read_text(encoding="utf-8"))
    fig = plots.CHARTS[chart](r)
    try:
        texts = _drawn_texts(fig)
        assert len(texts) > 20
        bad = boxes_overlap([b for _, b in texts])
        assert bad == [], [(texts[i][0], texts[j][0]) for i, j in bad]
    finally:
        plt.close(fig)


def test_each_variant_has_its_own_colour_and_marker(report):
    import matplotlib.pyplot as plt

    from qserve.bench import plots

    ok = [v for v in report["variants"] if v["status"] == "ok"]
    st = plots.styles(ok)
    pairs = [(s.colour, s.marker) for s in st.values()]
    assert len(st) == 12 and len(set(pairs)) == 12
    # colour says the backend family, the marker the precision
    assert st["torch-fp32"].colour == st["torch-bf16"].colour != st["ov-bf16"].colour
    assert st["ov-bf16"].marker == st["torch-bf16"].marker != st["ov-fp32"].marker
    # two variants of one family and precision (other options) still get distinct pairs
    twin = copy.deepcopy(ok[0])
    twin["name"] = ok[0]["name"] + "-alt"
    assert len({(s.colour, s.marker) for s in plots.styles(ok + [twin]).values()}) == 13
    # what is drawn: one legend per figure, covering both panels, with those same unique pairs
    for draw in (plots.decision_figure, plots.latency_figure):
        fig = draw(report)
        try:
            assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
            drawn = {
                h.get_label(): (h.get_color(), h.get_marker())
                for h in fig.legends[0].legend_handles
                if h.get_label() in st
            }
            assert drawn == {n: (s.colour, s.marker) for n, s in st.items()}
        finally:
            plt.close(fig)


def test_decision_chart_rings_and_names_the_recommendation(report):
    import matplotlib.pyplot as plt

    from qserve.bench import plots

    rec = report["recommended"]["variant"]
    fig = plots.decision_figure(report)
    try:
        for ax in fig.axes:
            named = [t for t in ax.texts if t.get_text().startswith(rec)]
            assert len(named) == 1 and "recommended" in named[0].get_text()
            assert named[0].get_fontweight() == "bold"
            assert {round(line.get_ydata()[0], 6) for line in ax.get_lines()} == {97.0, 99.0}  # both bars
            assert ax.get_xscale() == "log"
        assert rec in fig.get_suptitle()
    finally:
        plt.close(fig)
    speed_only = copy.deepcopy(report)
    for v in speed_only["variants"]:
        v["agreement"] = None
    assert plots.decision_figure(speed_only) is None


def test_report_html_is_self_contained(report, tmp_path):
    from qserve.bench.report import write_reports

    written = write_reports(report, tmp_path)
    assert sorted(p.name for p in written) == [
        "accuracy_vs_size.png",
        "decision.png",
        "latency_vs_batch.png",
        "report.csv",
        "report.html",
        "report.json",
        "report.md",
    ]
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    # nothing to fetch: no external URL in any src/href, every chart inline
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:|#)""", page)
    assert page.count('src="data:image/png;base64,') == 3
    assert "default-src 'none'" in page and "<script" not in page
    # the verdict up top, then the summary table (its row highlighted), the chart, the details from report.md
    top, main = page.split("<main>")
    rec = report["recommended"]["variant"]
    assert 'id="recommended"' in top and f"Serve {rec}:" in top and "Intel(R) Xeon(R) Processor" in main
    assert main.index(f'<tr class="recommended"><td>{rec}</td>') < main.index("<figure>") < main.index("Details: how")
    assert "batch invariance: max |Δprob| / label flips</th>" in page  # an escaped pipe stays one column
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert md.splitlines()[2].startswith(f"**Serve {rec}:**") and md.index("| variant |") < md.index("(decision.png)")
