"""A bench report as its readers take it: report.json read and checked, each variant's row typed.

    python -c "from qserve.benchreport import load_report, summary_rows; \\
print(summary_rows(load_report('benchmarks/reports/embedded-default')[0])[0])"

The summary table's numbers and verdict per variant: what the md, html, csv, charts and the served page show.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from qserve import QserveError
from qserve.intervals import wilson
from qserve.placement import mark
from qserve.problemtypes import SINGLE

J = TypeVar("J", bound="JsonRecord")


@dataclass
class JsonRecord:
    """A dataclass whose JSON keys are its field names, in their order; those in OPTIONAL left out when None."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: _json(x) for k, x in out.items() if x is not None or k not in self.OPTIONAL}

    @classmethod
    def from_json(cls: type[J], data: dict[str, Any]) -> J:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def _json(x: Any) -> Any:
    return x.to_json() if isinstance(x, JsonRecord) else [_json(y) for y in x] if isinstance(x, list) else x


@dataclass
class Ratio(JsonRecord):
    """How many times slower one variant is than another: the median of paired per-round ratios (or the ratio of
    the medians, unpaired), its interval and that interval's coverage; `tied` when the interval holds 1."""

    value: float
    lo: float
    hi: float
    level: float
    rounds: int
    paired: bool
    tied: bool

    def text(self) -> str:
        """'Rx [LO, HI]' (the interval's coverage and rounds are said where the ratio is explained)."""
        return f"{self.value:.2f}x [{self.lo:.2f}, {self.hi:.2f}]"


@dataclass
class Ranked(JsonRecord):
    """A variant as the recommendation ranked it (qserve.bench.recommend): the p50 it is ranked by, over the rounds
    it rests on, the bar it meets or not, and its verdict with why."""

    OPTIONAL = ("raced_out", "repair", "gate", "gate_record")
    variant: str
    dir: str | None = None
    p50_ms: float | None = None
    real_b1_p50_ms: float | None = None
    fixed_p50_ms: float | None = None
    agreement: float | None = None
    bar: float = 0.0
    bits: int | None = None
    meets_bar: bool = False
    footprint_bytes: int | None = None
    raced_out: dict[str, Any] | None = None
    repair: dict[str, Any] | None = None
    gate: bool | None = None
    gate_record: dict[str, Any] | None = None
    p50_ci: list[float] | None = None
    round_p50: dict[str, float] | None = None
    median_ms: float | None = None  # over every round: p50_ms is the fast mode's where the rounds fell in two
    stable: bool | None = None
    modes: dict[str, Any] | None = None
    verdict: str | None = None
    verdict_why: str | None = None


# the comparison with the runner-up a recommendation carries (and a run dir's selection record repeats)
VERSUS = ("runner_up", "ratio", "ratio_text", "tied", "tied_with", "tie_break")


@dataclass
class Recommendation(JsonRecord):
    """report["recommended"]: the variant to serve (None: why not) against its runner-up, and the whole ranking."""

    variant: str | None = None
    dir: str | None = None
    p50_ms: float | None = None
    agreement: float | None = None
    bar: float | None = None
    p50_ci: list[float] | None = None
    stable: bool | None = None
    runner_up: str | None = None
    ratio: Ratio | None = None
    ratio_text: str | None = None
    tied: bool | None = None
    tied_with: list[str] | None = None
    tie_break: str | None = None
    shape: str | None = None
    why: str | None = None
    cpu: str | None = None
    reference: str | None = None
    ranking: list[Ranked] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.variant is None:
            return {k: out[k] for k in ("variant", "why", "shape", "cpu", "ranking")}
        return {k: x for k, x in out.items() if self.runner_up is not None or k not in VERSUS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recommendation:
        ratio = Ratio.from_json(data["ratio"]) if data.get("ratio") else None
        ranking = [Ranked.from_json(r) for r in data.get("ranking") or []]
        return super().from_json({**data, "ratio": ratio, "ranking": ranking})


def recommendation(report: dict[str, Any]) -> Recommendation:
    """The report's recommendation, typed (empty where the report has none)."""
    return Recommendation.from_json(report.get("recommended") or {})


def shown(v: dict[str, Any], report: dict[str, Any]) -> str:
    """A variant's name as every table shows it: marked ' (cpu)' when it ran on another device than the run's
    (an ONNX or OpenVINO variant measured on the CPU of a CUDA run)."""
    return v["name"] + mark(v.get("device"), (report.get("config") or {}).get("device"))


def fixed_shape(v: dict[str, Any], b: int, s: int) -> dict[str, Any] | None:
    """The variant's fixed-shape latency record at batch b, seq s (None when not measured)."""
    for rec in v.get("fixed") or []:
        if rec.get("batch") == b and rec.get("seq") == s and "p50" in rec:
            return rec
    return None


def peak_memory(v: dict[str, Any]) -> tuple[float | None, str]:
    """(MiB, what it is): CUDA max allocated on GPU, else the child's peak RSS."""
    mem = v.get("memory") or {}
    if mem.get("cuda"):
        if mem["cuda"].get("max_allocated_mb"):
            return mem["cuda"]["max_allocated_mb"], "CUDA max allocated"
        return mem["cuda"].get("device_used_mb"), "CUDA device used"
    return mem.get("peak_rss_mb"), "peak RSS"


def agreement_lower_bound(v: dict[str, Any]) -> float | None:
    """The release gate's 95% lower bound on agreement where it ran, else Wilson's over the texts the bench scored
    (single-label: agreement is then a share of texts)."""
    g, acc, agr = v.get("gate") or {}, v.get("accuracy") or {}, v.get("agreement")
    if g.get("agreement_lower_bound") is not None:
        return g["agreement_lower_bound"]
    n = acc.get("n") if acc.get("problem_type", SINGLE) == SINGLE else None
    return wilson(round(agr * n), n)[0] if agr is not None and n else None


def load_report(path: str | Path) -> tuple[dict[str, Any], Path]:
    """Read a bench report.json (or DIR/report.json): (report, its directory); a clear error otherwise."""
    p = Path(path)
    if p.is_dir():
        p = p / "report.json"
    if not p.is_file():
        raise QserveError(f"{p} does not exist; pass a report.json or the directory `qserve bench` wrote")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise QserveError(f"{p} is not valid JSON ({e}); re-run `qserve bench` or `qserve pipeline`") from None
    if not isinstance(data, dict) or not str(data.get("format", "")).startswith("qserve-bench/"):
        raise QserveError(
            f"{p} is not a qserve bench report (format {data.get('format') if isinstance(data, dict) else None!r})"
        )
    return data, p.parent


def real_text_b1(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The variant's batch-1 latency over real test texts (each at its own length), or None if not measured."""
    return next((r for r in entry.get("real_text") or [] if r.get("batch") == 1 and "p50" in r), None)


@dataclass
class Row:
    """One variant's summary row; None where not measured."""

    variant: str
    shown: str
    """Its name as every table shows it (marked where it ran on another device than the run's)."""
    device: str | None
    status: str
    b1_ms: float | None
    """The p50 the recommendation ranks by (b1 on real texts, else the headline shape), and its p99."""
    b1_p99_ms: float | None
    size_mb: float | None
    load_s: float | None
    p50_ms: float | None
    """At the headline fixed shape, and its p99."""
    p99_ms: float | None
    throughput: float | None
    peak_mem_mib: float | None
    accuracy: float | None
    agreement: float | None
    agreement_lo: float | None
    eval_n: int | None
    speedup: float | None
    floor_ms: float | None
    p50_over_floor: float | None
    invariance_max_abs_dprob: float | None
    invariance_flips: int | None
    verdict: str
    why: str | None
    meets_bar: bool | None
    """Whether the recommendation could choose it (None: not ranked)."""


def summary_rows(report: dict[str, Any]) -> list[Row]:
    """One row per variant, in the report's order (verdict and why: qserve.bench.recommend's)."""
    b, s = report["headline"]["batch"], report["headline"]["seq"]
    bmax = max(report["config"]["batch_sizes"])
    ranking = {r.variant: r for r in recommendation(report).ranking}
    rows = []
    for v in report["variants"]:
        st, big, r = fixed_shape(v, b, s), fixed_shape(v, bmax, s), ranking.get(v["name"])
        acc, fl, inv = v.get("accuracy") or {}, v.get("floor") or {}, v.get("invariance") or {}
        failed = f"its bench failed: {v.get('failure') or v.get('error') or 'no result'}"
        real = r is not None and r.real_b1_p50_ms is not None and r.p50_ms == r.real_b1_p50_ms
        rows.append(
            Row(
                variant=v["name"],
                shown=shown(v, report),
                device=v.get("device"),
                status=v["status"],
                b1_ms=r.p50_ms if r else None,
                b1_p99_ms=(real_text_b1(v) or {}).get("p99") if real else st["p99"] if st and r else None,
                size_mb=v["disk_bytes"] / 1e6 if v.get("disk_bytes") is not None else None,
                load_s=v.get("load_s"),
                p50_ms=st["p50"] if st else None,
                p99_ms=st["p99"] if st else None,
                throughput=big["throughput"] if big else None,
                peak_mem_mib=peak_memory(v)[0],
                accuracy=acc.get("accuracy"),
                agreement=v.get("agreement"),
                agreement_lo=None if v["name"] == report.get("agreement_reference") else agreement_lower_bound(v),
                eval_n=acc.get("n"),
                speedup=v.get("speedup_vs_torch_fp32"),
                floor_ms=fl.get("floor_ms"),
                p50_over_floor=fl.get("p50_over_floor"),
                invariance_max_abs_dprob=inv.get("max_abs_dprob"),
                invariance_flips=inv.get("flips"),
                verdict=(r.verdict if r else None) or ("not a candidate" if v["status"] != "ok" else "–"),
                why=(r.verdict_why if r else None) or (failed if v["status"] != "ok" else None),
                meets_bar=r.meets_bar if r else None,
            )
        )
    return rows
