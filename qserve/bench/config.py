"""BenchConfig: every knob of a benchmark run, as one JSON-serialisable dataclass (and `qserve bench`'s flags).

    python -c "from qserve.bench.config import BenchConfig; print(BenchConfig(batch_sizes=[1, 8]))"

Written into report.json, so a report always says exactly how it was measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.configflags import flag
from qserve.longtext import parse_list
from qserve.runtime.buckets import parse

DEFAULT_BATCH_SIZES = (1, 8, 32)
ISOLATION = ("auto", "process", "shared")
DEFAULT_SEQ_LENS = (32, 128, 256)
# The headline shape the summary table quotes (latency columns, speed-up, floor).
HEADLINE_BATCH = 1
HEADLINE_SEQ = 128


@dataclass
class BenchConfig:
    """How to benchmark a set of variants. Each field is a `qserve bench` flag; its docstring is the help."""

    batch_sizes: list[int] = field(default_factory=lambda: list(DEFAULT_BATCH_SIZES))
    """Comma-separated batch sizes for fixed-shape latency."""
    seq_lens: list[int] = field(default_factory=lambda: list(DEFAULT_SEQ_LENS))
    """Comma-separated sequence lengths in tokens for fixed-shape latency."""
    threads: int | None = field(default=None, metadata=flag(default_text="physical cores"))
    """Intra-op threads for torch and ONNX Runtime."""
    device: str = "auto"
    """auto (each variant on the GPU where it runs there, else on the CPU, marked so in the report), cpu, cuda or
    cuda:N (every variant there: one that cannot run there fails, saying why)."""
    out: Path | None = field(
        default=None,
        metadata=flag(default_text="benchmarks/reports/<model>-<device>-t<threads>, or benchmarks/reports/<--name>"),
    )
    """Report directory."""
    accuracy: bool = True
    """Measure accuracy and agreement on the held-out test split when the variant names its dataset."""
    dataset: str | None = field(default=None, metadata=flag(default_text="the variant's qserve_model.json"))
    """Dataset for accuracy."""
    seed: int | None = field(default=None, metadata=flag(default_text="the variant's, else 42"))
    """Split seed for the test split."""
    max_eval_samples: int | None = field(
        default=None, metadata=flag(default_text="the variant's, else the whole test split")
    )
    """Cap on test texts for accuracy."""
    race: float = 1.3
    """Racing: after a screen round over every variant, those within this factor of the fastest candidate's b1 there
    (with the three fastest candidates and the reference) get the other rounds and the full evaluation; the others
    are measured in that round only, marked raced out, and decide nothing; 0 runs every variant to the end."""
    real_text_samples: int = 128
    """Test texts used for real-text latency (dynamic padding); 0 skips it."""
    long_text: list[str] | None = field(
        default=None, metadata=flag(metavar="POLICIES", default_text="each variant's own policy only")
    )
    """Comma-separated long-text policies to compare on the test split, e.g. head,head-tail,windows (each of
    head, tail, head-tail[:H], windows[:W[:S[:mean|max]]]): accuracy, agreement and texts/s per policy; head is
    always included."""
    invariance_samples: int = 96
    """Test texts of varied length scored alone and in mixed batches of 8 and 32 (batch invariance); 0 skips it."""
    time_budget_s: float = field(default=3.0, metadata=flag(option="--time-budget"))
    """Seconds of timed iterations per shape over all rounds (each round a --rounds share of it); a shape stops at
    max_iters or when the budget is spent."""
    rounds: int = 5
    """Interleaved rounds: every variant is loaded once in its own process, then measured in turn (A B C ... A B C
    ...) this many times, each round a share of --time-budget; a latency is the median over rounds, with its
    interval (docs/bench.md, "Rounds")."""
    stability: float = 0.10
    """Tolerance of a latency's interval over rounds (its width over its p50): a variant whose ranked numbers
    (real-text b1, the headline shape) are wider gets more rounds; what stays wider is marked unstable."""
    stability_budget_s: float = field(default=60.0, metadata=flag(option="--stability-budget"))
    """Seconds at most spent on extra rounds for unstable variants (at most 3x --rounds in all)."""
    warmup: int = 3
    """Warm-up calls per shape before timing (stops early once half the time budget is spent)."""
    min_iters: int = 3
    """Timed calls per shape even when the budget is spent, so slow variants still get a p50."""
    max_iters: int = 500
    """Upper bound on timed calls per shape."""
    floor: bool = True
    """Measure peak GEMM FLOP/s (fp32, bf16, int8) in a child to state the compute floor (without it the
    floor is not stated)."""
    floor_budget_s: float = field(default=1.0, metadata=flag(option="--floor-budget"))
    """Seconds per GEMM shape when measuring the peak."""
    child_timeout_s: float = field(default=3600.0, metadata=flag(option="--child-timeout"))
    """A variant's child is killed (and reported failed) after this many seconds."""
    isolation: str = field(default="auto", metadata=flag(choices=ISOLATION))
    """auto: each CPU variant in a process of its own (its peak RSS is its own), the CUDA variants one after another
    in one shared worker (imports and CUDA's start-up paid once; CUDA peak memory reset per variant); process: every
    variant in its own process; shared: every variant in the shared worker. A crash fails its variant only."""
    name: str | None = None
    """Run name for the default --out (benchmarks/reports/<name>)."""
    force: bool = False
    """Replace an existing non-empty report directory."""
    allow_extra_files: bool = False
    """Load variants whose directory holds files the manifest does not list (refused by default)."""
    length_buckets: str = "auto"
    """Token lengths a fixed-shape variant (ov-int8) pads each text to, as `qserve serve --length-buckets`: auto,
    off (max_length) or e.g. 32,64,128. The bench runs variants exactly as the server does with the same value."""

    def validate(self) -> "BenchConfig":
        for name, values in (("--batch-sizes", self.batch_sizes), ("--seq-lens", self.seq_lens)):
            if not values or any((not isinstance(v, int)) or v < 1 for v in values):
                raise QserveError(f"{name} must be a comma-separated list of positive integers (got {values!r})")
        if any(s < 2 for s in self.seq_lens):
            raise QserveError(f"--seq-lens values must be >= 2 (room for [CLS] and [SEP]); got {self.seq_lens}")
        if self.threads is not None and self.threads < 1:
            raise QserveError(f"--threads must be a positive integer (got {self.threads})")
        if self.device not in ("cpu", "cuda", "auto") and not self.device.startswith("cuda:"):
            raise QserveError(f"--device must be one of cpu, cuda, auto or cuda:N (got {self.device!r})")
        if self.time_budget_s <= 0:
            raise QserveError(f"--time-budget must be > 0 seconds (got {self.time_budget_s})")
        if self.warmup < 0 or self.min_iters < 1 or self.max_iters < self.min_iters:
            raise QserveError(
                f"need --warmup >= 0 and 1 <= --min-iters <= --max-iters "
                f"(got {self.warmup}, {self.min_iters}, {self.max_iters})"
            )
        if self.rounds < 1:
            raise QserveError(f"--rounds must be an integer >= 1 (got {self.rounds})")
        if not 0 < self.stability:
            raise QserveError(f"--stability must be a fraction > 0, e.g. 0.10 (got {self.stability})")
        if self.stability_budget_s < 0:
            raise QserveError(f"--stability-budget must be >= 0 seconds (got {self.stability_budget_s})")
        if self.max_eval_samples is not None and self.max_eval_samples < 1:
            raise QserveError(f"--max-eval-samples must be >= 1 (got {self.max_eval_samples})")
        if self.race != 0 and self.race < 1:
            raise QserveError(f"--race must be 0 (off) or a factor >= 1, e.g. 1.3 (got {self.race})")
        if self.invariance_samples < 0:
            raise QserveError(f"--invariance-samples must be >= 0 (got {self.invariance_samples})")

        parse(self.length_buckets)
        if self.real_text_samples < 0:
            raise QserveError(f"--real-text-samples must be >= 0 (got {self.real_text_samples})")
        if self.long_text is not None:
            self.long_text = parse_list(",".join(self.long_text), "--long-text")
        self.batch_sizes = sorted(set(self.batch_sizes))
        self.seq_lens = sorted(set(self.seq_lens))
        return self

    def headline(self) -> tuple[int, int]:
        """(batch, seq) quoted in the summary: b1/s128 when measured, else the nearest measured."""
        b = HEADLINE_BATCH if HEADLINE_BATCH in self.batch_sizes else min(self.batch_sizes)
        s = HEADLINE_SEQ if HEADLINE_SEQ in self.seq_lens else min(self.seq_lens, key=lambda x: abs(x - HEADLINE_SEQ))
        return b, s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["out"] = str(self.out) if self.out is not None else None
        return d

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "BenchConfig":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        if kw.get("out") is not None:
            kw["out"] = Path(kw["out"])
        return cls(**kw)


def parse_int_list(text: str, flag: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]; anything else is an error naming the flag."""
    try:
        values = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise QserveError(
            f"{flag} must be a comma-separated list of positive integers, e.g. 1,8,32 (got {text!r})"
        ) from None
    if not values or any(v < 1 for v in values):
        raise QserveError(f"{flag} must be a comma-separated list of positive integers, e.g. 1,8,32 (got {text!r})")
    return values
