"""`qserve gate`'s settings: one dataclass, each field a flag (its docstring the help), checked once.

    python -c "import argparse; from qserve.configflags import add_flags; from qserve.gate.config import GateConfig; \\
p = argparse.ArgumentParser(); add_flags(p, GateConfig); p.print_help()"
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qserve import QserveError, longtext
from qserve.configflags import flag
from qserve.variants import REFERENCES

SPLITS = ("test", "val", "train", "all")
CALIBRATION_SPLITS = ("val", "train", "test", "none")

AGREEMENT_BAR = {4: 0.95, 8: 0.98, 16: 0.98, 32: 0.98}
"""The bar on agreement's 95% LOWER bound, per bits: today's point-estimate bars (int8 >= 99%, 4-bit >= 97%;
qserve/bench/recommend.py) restated for a bound; docs/gate.md works out what that asks of a variant and a test set."""
ACCURACY_DROP = {4: 0.03, 8: 0.01, 16: 0.01, 32: 0.01}
"""The most accuracy (share of texts; regression: mean error in units of the label range) the variant may lose
against the reference, on the LOWER bound of the paired difference."""
MIN_CLASS_TEXTS = 30
"""A class (label) with fewer reference texts is reported, not judged: its interval is too wide to say anything."""


def agreement_bar(bits: int | None) -> float:
    return AGREEMENT_BAR.get(int(bits or 8), AGREEMENT_BAR[8])


def accuracy_drop(bits: int | None) -> float:
    return ACCURACY_DROP.get(int(bits or 8), ACCURACY_DROP[8])


@dataclass
class GateConfig:
    """What `qserve gate` is told besides the VARIANT dirs."""

    data: str | None = field(default=None, metadata=flag(default_text="the checkpoint's own dataset"))
    """Labelled data to gate on: any dataset `qserve train` reads (default, rotten-tomatoes, a local csv/jsonl/json
    file, a hub id), split as training splits it (seeded 80/10/10)."""
    split: str = field(default="test", metadata=flag(choices=SPLITS))
    """The split of --data the gate scores; `all` scores the whole file (then --calibrate-on must be none, or
    the calibration would see the gate's texts)."""
    calibrate_on: str = field(default="val", metadata=flag(choices=CALIBRATION_SPLITS))
    """The held-out split of --data the calibration (temperature, per-label thresholds) is fitted on; never the
    one the gate scores. none: no calibration."""
    max_samples: int | None = field(default=None, metadata=flag(default_text="the whole split"))
    """The first look scores at most this many texts of the split (seeded, stratified); an undecided verdict scores
    more of the split (--looks)."""
    looks: int = 4
    """Where an interval straddles a bar, score more of the split, doubling the texts, up to this many looks in all
    (planned before the first; each at the confidence the looks share: docs/gate.md); 1: one look."""
    time_budget: float | None = field(default=None, metadata=flag(metavar="SECONDS", default_text="none"))
    """Stop looking, undecided, where the next look would take a variant's gate past this many seconds."""
    max_calibration_samples: int | None = field(default=2000, metadata=flag())
    """Fit the calibration on at most this many held-out texts (seeded, stratified)."""
    max_eval_samples: int | None = field(default=None, metadata=flag(default_text="the checkpoint's own"))
    """Rebuild the splits with validation and test capped at this many texts each, as `qserve bench
    --max-eval-samples N` does: the gate then scores the very test texts that bench scored (the pipeline's gate)."""
    reference: str | None = field(
        default=None, metadata=flag(metavar="DIR", default_text=f"{', else '.join(REFERENCES)}, beside the variant")
    )
    """The fp32 variant of the same checkpoint every variant is compared with."""
    bar: float | None = field(default=None, metadata=flag(default_text="0.98 at 8/16/32 bits, 0.95 at 4"))
    """The bar agreement's lower bound must reach."""
    max_accuracy_drop: float | None = field(default=None, metadata=flag(default_text="0.01 at 8/16/32 bits, 0.03 at 4"))
    """The most accuracy the variant may lose against the reference, on the lower bound of the paired difference."""
    confidence: float = 0.95
    """The two-sided confidence of every interval."""
    seed: int | None = field(default=None, metadata=flag(default_text="the checkpoint's seed, else 42"))
    """The split's seed (the training seed rebuilds the training run's own test split)."""
    device: str = "auto"
    """Where the variants run: auto (the GPU where a variant runs on it, else the CPU), cpu, cuda or cuda:N (the
    verdict records each one's device)."""
    long_text: str | None = field(default=None, metadata=flag(default_text="the variant's own (its manifest's)"))
    """The long-text policy both models score the texts under (head, tail, head-tail[:H], windows[:W[:S[:AGG]]]);
    the verdict records it and holds for the variant served under that policy only."""
    threads: int | None = field(default=None, metadata=flag(default_text="the library's: all cores"))
    """Intra-op threads for torch / ONNX Runtime / OpenVINO."""
    out: str | None = field(default=None, metadata=flag(metavar="DIR", default_text="no report files"))
    """Write gate.md, gate.json and gate.png here (refused when the directory holds other files, unless --force)."""
    record: bool = True
    """Write the verdict and the calibration into each variant's manifest.json (--no-record: report only)."""
    force: bool = False
    """Replace an existing --out directory's report."""
    allow_extra_files: bool = False
    """Load variants whose directory holds files the manifest does not list."""

    def validate(self) -> GateConfig:
        if self.split == "all" and self.calibrate_on != "none":
            raise QserveError(
                "--split all scores every text of --data, so no held-out text is left to calibrate on; "
                "pass --calibrate-on none, or gate one split (--split test) and calibrate on another"
            )
        if self.split == self.calibrate_on:
            raise QserveError(
                f"--calibrate-on {self.calibrate_on} is the split the gate scores (--split "
                f"{self.split}); calibration must be fitted on data the gate did not score: choose "
                f"another of {', '.join(s for s in CALIBRATION_SPLITS if s != self.split)}"
            )
        for name, v in (
            ("max_samples", self.max_samples),
            ("max_calibration_samples", self.max_calibration_samples),
            ("max_eval_samples", self.max_eval_samples),
        ):
            if v is not None and v < 1:
                raise QserveError(f"--{name.replace('_', '-')} must be a positive integer or unset, got {v}")
        if self.looks < 1 or (self.time_budget is not None and self.time_budget <= 0):
            raise QserveError(f"--looks must be >= 1 and --time-budget > 0, got {self.looks} and {self.time_budget}")
        if self.bar is not None and not 0 < self.bar < 1:
            raise QserveError(f"--bar must be in (0, 1) (a share of agreeing texts), got {self.bar}")
        if self.max_accuracy_drop is not None and not 0 <= self.max_accuracy_drop < 1:
            raise QserveError(f"--max-accuracy-drop must be in [0, 1), got {self.max_accuracy_drop}")
        if self.long_text is not None:
            longtext.parse(self.long_text, "--long-text")
        if not 0.5 <= self.confidence < 1:
            raise QserveError(f"--confidence must be in [0.5, 1), got {self.confidence}")
        return self
