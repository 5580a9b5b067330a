"""What one fine-tune is: its config (every `qserve train` flag), its checks, and the seeds and policy it derives.

    python -c "import argparse; from qserve.configflags import add_flags; \\
from qserve.training.config import TrainConfig; p = argparse.ArgumentParser(); add_flags(p, TrainConfig); \\
p.print_help()"

The loop (train.py), the study (study.py), the pipeline and resume read a run through these; flags come from
the fields (configflags.add_flags), so the CLI and the config cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qserve import QserveError, longtext
from qserve.configflags import flag
from qserve.longtext import TRAIN_DEFAULT
from qserve.modeling import model_name_for
from qserve.problemtypes import SHORT, from_flag
from qserve.training.precision import AUTO, BF16_UPDATES, MATMUL_PRECISIONS, PRECISION_CHOICES


def run_dir(model: str, dataset: str) -> Path:
    """models/<model>-<dataset>: the run dir `qserve pipeline` fills and whose checkpoint/ `qserve train` writes by
    default (the embedded default: models/minilm-l6-distilbert-imdb)."""
    data = {"default": "imdb", "imdb-embedded": "imdb"}.get(dataset, Path(dataset).stem or dataset)
    return Path("models") / f"{model_name_for(model)}-{data}".replace("/", "-")


MAX_GRAD_NORM = 1.0  # the usual fine-tuning clip; keeps the first high-lr steps from diverging
# transformers 5 writes tokenizer.json + tokenizer_config.json only; 4.x checkpoints also hold vocab.txt and more
FILES_WRITTEN = tuple(
    "config.json model.safetensors tokenizer.json tokenizer_config.json qserve_model.json train_metrics.json".split()
)


@dataclass
class TrainConfig:
    """One fine-tuning run. Each field is a `qserve train` flag; its docstring is the help."""

    model: str = "default"
    """`default` (embedded MiniLM in DistilBERT layout), a local checkpoint directory, or a hub id."""
    dataset: str = "default"
    """`default`/`imdb-embedded`, `rotten-tomatoes`, a local .csv/.jsonl/.json (text,label; a text_pair column
    trains a pair model) or a hub id."""
    problem_type: str | None = field(default=None, metadata=flag(choices=tuple(SHORT), default_text="inferred"))
    """single (softmax, cross-entropy), multi (multi-label: sigmoid per label, BCE) or regression (one value,
    MSE). Default: from the data file: a list of labels per row -> multi, a non-integer number -> regression."""
    precision: str = field(
        default=AUTO,
        metadata=flag(
            choices=PRECISION_CHOICES, repeat=True, default_text="auto; with --compare, all the device supports"
        ),
    )
    """Training precision: auto (what this device runs fast, measured and said: on one GPU a probe of real steps
    picks bf16-mixed (16-mixed without bf16) or 32-true with TF32; on CPUs bf16-mixed with AMX or avx512_bf16,
    else 32-true), 32-true, 16-mixed (CUDA only), bf16-mixed or bf16-true. With --compare, give it several times
    to choose the precisions compared."""
    epochs: int = 1
    """Passes over the training set."""
    batch_size: int | None = field(
        default=None, metadata=flag(default_text="16; on one CUDA device the probe's choice, up to 256")
    )
    """Examples per forward pass (per device). Unset on a single CUDA device, a short probe of real steps picks
    the batch (and precision) that trains fastest within memory and the run's step count, and --lr is scaled with
    it (qserve/training/autotune.py)."""
    lr: float = 1e-4
    """Peak AdamW learning rate (after linear warm-up, then linear decay to 0). With --batch-size unset it is the
    rate at batch 16, scaled by sqrt(batch / 16) for the batch chosen (unchanged at 16)."""
    weight_decay: float = 0.01
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    warmup_ratio: float = 0.1
    """Fraction of optimizer steps spent warming the learning rate up from 0."""
    grad_accum: int = 1
    """Forward passes per optimizer step (effective batch = batch_size * grad_accum * devices)."""
    max_length: int = 128
    """Truncate texts to this many tokens (also recorded for export, bench and serve)."""
    long_text: str = field(default=TRAIN_DEFAULT, metadata=flag(metavar="POLICY"))
    """What training, validation and test read of a text longer than max_length: head, tail or head-tail[:H]
    (H tokens from the start, the rest from the end); recorded for export, bench and serve."""
    max_samples: int | None = None
    """Train on a seeded, stratified subset of this many examples (val/test unaffected; 0 on the CLI = all)."""
    train_budget: float | None = field(default=None, metadata=flag(metavar="MINUTES"))
    """Train for at most this many minutes of optimizer steps: after the first steps, the run is cut to the steps
    that fit at their median time, the learning-rate schedule re-planned to end there, and train_metrics.json
    records what was trained on (default: none; `qserve pipeline` sets one)."""
    max_eval_samples: int | None = 2000
    """Cap val and test at this many examples each (seeded, stratified; 0 on the CLI = no cap); bench reuses it."""
    bf16_update: str = field(
        default="compensated",
        metadata=flag(
            choices=BF16_UPDATES, repeat=True, default_text="compensated; with --compare, compensated and plain"
        ),
    )
    """bf16-true only: compensated (torch-optimi AdamW, Kahan summation into a bf16 buffer) or plain (torch
    AdamW on bf16 weights: updates below half a bf16 ulp round away). With --compare, give it several times
    to run bf16-true once per value."""
    seed: int = 42
    """Seed for the split, subsampling, head init, shuffling and dropout."""
    data_seed: int | None = field(default=None, metadata=flag(default_text="--seed"))
    """Seed for the split and subsampling only (None: seed); lets two seeds train on the same data."""
    out: str | None = field(
        default=None,
        metadata=flag(
            default_text="models/<model_name>-<dataset>/checkpoint (the run dir `qserve pipeline` writes); with "
            "--compare, benchmarks/reports/precision"
        ),
    )
    """Output directory (with --compare: the report directory)."""
    device: str = "auto"
    """auto (CUDA when available), cpu, cuda or cuda:N."""
    devices: int = 1
    """Processes/GPUs for data-parallel training (Fabric DDP when > 1)."""
    strategy: str = "auto"
    """Fabric strategy: auto, ddp, ddp_spawn, fsdp, ..."""
    matmul_precision: str | None = field(default=None, metadata=flag(choices=MATMUL_PRECISIONS))
    """torch.set_float32_matmul_precision: highest, high (TF32 on Ampere+) or medium. Unset: torch's default
    (highest), except where --precision auto measures 32-true with TF32 fastest on a GPU and trains so."""
    force: bool = False
    """Replace an existing output directory (and start an unfinished run over, whatever its config)."""
    checkpoint_every: int | None = field(default=None, metadata=flag(default_text="about every 5 min of training"))
    """Write a resumable checkpoint into --out every this many optimizer steps, atomically, keeping only the
    latest (default: the steps of about 5 minutes, from the first steps' median time; 0: never)."""
    resume: bool | None = field(default=None, metadata=flag(default_text="resume an unfinished run in --out"))
    """--resume: continue the unfinished run in --out (an error if there is none); --no-resume: start it over.
    Default: resume when --out holds an unfinished run with this config."""
    num_workers: int = 0
    """DataLoader worker processes (tokenization is done up front, so 0 is usually right)."""


@dataclass
class CompareOptions:
    """`qserve train --compare`: the precision study's own flags (the study itself is qserve/training/study.py)."""

    compare: bool = False
    """Run the same fine-tune once per precision, each in its own process, and write precision_study.json/.md
    (time, step time, optimizer state, peak memory, accuracy)."""
    noise_precision: str | None = field(
        default=None,
        metadata=flag(
            choices=(*PRECISION_CHOICES, "none"), default_text="what auto chooses here, else the first studied"
        ),
    )
    """With --compare: the precision run a second time with --seed + 1 on the same data, to measure
    run-to-run noise (none: skip)."""
    step_rounds: int = 3
    """With --compare: after the full runs, time each run's step again in this many rounds of short children
    taking turns, so machine drift hits every precision alike; 0 skips."""
    step_samples: int = 768
    """With --step-rounds: training examples per short child (768 = 48 steps of 16)."""


def validate(cfg: TrainConfig) -> None:
    """Reject bad values before anything heavy loads; messages name the flag and what is allowed."""
    if cfg.precision not in PRECISION_CHOICES:
        raise QserveError(f"--precision must be one of {', '.join(PRECISION_CHOICES)} (got {cfg.precision!r})")
    if cfg.train_budget is not None and not (
        isinstance(cfg.train_budget, (int, float)) and not isinstance(cfg.train_budget, bool) and cfg.train_budget > 0
    ):
        raise QserveError(f"--train-budget must be a number of minutes > 0 (got {cfg.train_budget!r})")
    if cfg.bf16_update not in BF16_UPDATES:
        raise QserveError(f"--bf16-update must be one of {', '.join(BF16_UPDATES)} (got {cfg.bf16_update!r})")
    if cfg.matmul_precision is not None and cfg.matmul_precision not in MATMUL_PRECISIONS:
        raise QserveError(
            f"--matmul-precision must be one of {', '.join(MATMUL_PRECISIONS)} (got {cfg.matmul_precision!r})"
        )
    for name, low in (
        ("epochs", 1),
        ("batch_size", 1),
        ("grad_accum", 1),
        ("max_length", 8),
        ("devices", 1),
        ("num_workers", 0),
        ("checkpoint_every", 0),
    ):
        v = getattr(cfg, name)
        if v is None and name in ("checkpoint_every", "batch_size"):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise QserveError(f"--{name.replace('_', '-')} must be an integer >= {low} (got {v!r})")
    if not cfg.lr > 0:
        raise QserveError(f"--lr must be > 0 (got {cfg.lr!r})")
    if not 0 <= cfg.warmup_ratio < 1:
        raise QserveError(f"--warmup-ratio must be in [0, 1) (got {cfg.warmup_ratio!r})")
    if cfg.weight_decay < 0:
        raise QserveError(f"--weight-decay must be >= 0 (got {cfg.weight_decay!r})")
    train_policy(cfg)
    from_flag(cfg.problem_type)


def train_policy(cfg: TrainConfig) -> str:
    """cfg.long_text written out in full for cfg.max_length; windows is refused (an inference policy)."""
    policy = longtext.resolve(cfg.long_text, cfg.max_length, "--long-text")
    if not policy.trainable:
        raise QserveError(
            f"--long-text {cfg.long_text}: windows is an inference policy (export or serve it with "
            f"--long-text); training uses one of {', '.join(longtext.TRAINING_KINDS)}"
        )
    return str(policy)


def split_seed(cfg: TrainConfig) -> int:
    """The seed of the data split and subsample (what bench and export rebuild the test split from)."""
    return cfg.seed if cfg.data_seed is None else cfg.data_seed
