"""Resumable training: the checkpoint `qserve train` writes while it trains, and what a re-run does with it.

    python -m pytest tests/integration/test_resume.py -q

`train_started.json` (the config and what `auto` decided) and `resume.ckpt` (every --checkpoint-every steps,
written to a .partial, fsynced and renamed) sit in the out dir until the run finishes; re-running the same command
resumes (docs/training.md). Test hook QSERVE_TEST_CHECKPOINT_KILL=after:N | torn:N SIGKILLs the run at its N-th
checkpoint, after it is in place or half written.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qserve import QserveError
from qserve.files import refuse_existing, write_json_atomic

log = logging.getLogger(__name__)

CHECKPOINT = "resume.ckpt"
STARTED = "train_started.json"
FINISHED = "train_metrics.json"
PARTIAL_SUFFIX = ".partial"
KILL_ENV = "QSERVE_TEST_CHECKPOINT_KILL"
DECIDED = "auto_decided"
"""The key of train_started.json beside the config fields: the choices the run started with (not a field)."""
DEFAULT_INTERVAL_S = 300.0  # --checkpoint-every unset: about one checkpoint per 5 minutes of training
# Fields that say where or how a run is driven, not what it trains: a resume may change them.
RUN_CONTROL = frozenset({"out", "force", "resume", "checkpoint_every"})


@dataclass
class Plan:
    """What train() does with its out dir: start fresh, resume from the checkpoint, or nothing (finished)."""

    action: str  # "fresh" | "resume" | "finished"
    out: Path
    finished_metrics: dict[str, Any] | None = None
    decided: dict[str, Any] | None = None
    """For a resume: the choices the run started with (autotune.RunChoices.to_json), None if it recorded none."""


@dataclass
class Progress:
    """Everything the loop accumulates; saved in the checkpoint so a resumed run reports the whole run."""

    step: int = 0
    epoch: int = 0
    batch: int = 0  # the next batch index in this epoch's order
    seen: int = 0
    train_time: float = 0.0
    wall_before: float = 0.0  # wall seconds of the processes before this one
    rss_peak: int = 0
    last_loss: float = float("nan")
    run_loss: float = 0.0
    run_n: int = 0
    step_times: list[float] = field(default_factory=list)
    opt_times: list[float] = field(default_factory=list)
    epoch_val: list[Any] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)
    saved: int = 0  # checkpoints written so far, this one included
    checkpoints: list[float] = field(default_factory=list)  # seconds each checkpoint write took
    planned_steps: int = 0  # the steps a time budget allows (0: no budget, or not planned yet)
    tokens: int = 0  # real (unpadded) tokens trained on
    padded_tokens: int = 0  # tokens the batches held, padding included (what the model computed)


def _jsonable(cfg: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(cfg, default=str))


def config_diff(want: dict[str, Any], have: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """Names of the training fields whose values differ (run-control fields ignored; a field missing from
    `have`, recorded before it existed, counts as its default)."""
    want, have, defaults = _jsonable(want), _jsonable(have), _jsonable(defaults)
    names = (set(want) | set(have)) - RUN_CONTROL
    return sorted(n for n in names if want.get(n, defaults.get(n)) != have.get(n, defaults.get(n)))


def describe_diff(names: list[str], want: dict[str, Any], have: dict[str, Any], defaults: dict[str, Any]) -> str:
    want, have, defaults = _jsonable(want), _jsonable(have), _jsonable(defaults)
    return ", ".join(
        f"--{n.replace('_', '-')} {have.get(n, defaults.get(n))!r} recorded, {want.get(n, defaults.get(n))!r} now"
        for n in names
    )


def plan(out: Path, cfg: dict[str, Any], defaults: dict[str, Any], resume: bool | None, force: bool) -> Plan:
    """Decide from what `out` holds (before anything heavy loads); errors name the flags that choose."""
    out = Path(out)
    started, finished, ckpt = out / STARTED, out / FINISHED, out / CHECKPOINT
    if finished.is_file() and not started.is_file():  # a finished run
        if force:
            return Plan("fresh", out)
        have = json.loads(finished.read_text(encoding="utf-8"))
        diff = config_diff(cfg, have.get("config") or {}, defaults)
        if diff:
            raise QserveError(
                f"{out} holds a finished run trained with another config "
                f"({describe_diff(diff, cfg, have.get('config') or {}, defaults)}); "
                "pass --force to train it again, or choose another --out"
            )
        if resume:
            raise QserveError(
                f"--resume: {out} holds a finished run, nothing to resume (it is never retrained; "
                "--force trains it again)"
            )
        return Plan("finished", out, finished_metrics=have)
    if started.is_file():  # an unfinished run of ours
        if force:
            return Plan("fresh", out)
        have = json.loads(started.read_text(encoding="utf-8"))
        decided = have.pop(DECIDED, None)
        diff = config_diff(cfg, have, defaults)
        if diff:
            raise QserveError(
                f"{out} holds an unfinished run started with another config "
                f"({describe_diff(diff, cfg, have, defaults)}); run the same command to resume it, "
                "or pass --force to start over with this config"
            )
        if resume is False or not ckpt.is_file():
            if resume:
                raise QserveError(
                    f"--resume: {out} holds an unfinished run with no checkpoint yet; "
                    "leave --resume out (or pass --no-resume) to start it over"
                )
            return Plan("fresh", out)
        return Plan("resume", out, decided=decided)
    if resume:
        raise QserveError(
            f"--resume: {out} holds no unfinished run to resume; allowed: --no-resume, or leave "
            "--resume out to start a new run"
        )
    refuse_existing(out, force)  # someone else's files: never overwritten silently
    return Plan("fresh", out)


def record_start(out: Path, cfg: dict[str, Any], decided: dict[str, Any] | None = None) -> None:
    """Claim `out` for this run (rank 0): the config it was started with and, under DECIDED, what `auto` decided
    (a probe's measured choice is not measured again on resume); a stale checkpoint goes."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in (out / CHECKPOINT, out / (CHECKPOINT + PARTIAL_SUFFIX)):
        stale.unlink(missing_ok=True)
    write_json_atomic(out / STARTED, _jsonable({**cfg, **({DECIDED: decided} if decided is not None else {})}))


def auto_interval(step_times: list[float], interval_s: float = DEFAULT_INTERVAL_S) -> int | None:
    """Steps per ~interval_s of training, from the median step time (None until 3 steps are timed)."""
    if len(step_times) < 3:
        return None
    return max(1, round(interval_s / max(1e-9, statistics.median(step_times[1:]))))


def _kill_hook(n: int) -> tuple[str | None, int]:
    kind, _, at = os.environ.get(KILL_ENV, "").partition(":")
    return (kind, int(at)) if kind in ("after", "torn") and at.isdigit() and int(at) == n else (None, 0)


def save(fabric, out: Path, state: dict[str, Any], n: int) -> None:
    """Write the n-th checkpoint atomically (temp file, fsync, rename); every rank calls it, rank 0 alone writes."""
    ckpt, tmp = out / CHECKPOINT, out / (CHECKPOINT + PARTIAL_SUFFIX)
    fabric.save(tmp, state)
    kind, _ = _kill_hook(n)
    if fabric.is_global_zero:
        if kind == "torn":  # the test hook: die with the temp file half written
            size = tmp.stat().st_size
            os.truncate(tmp, size // 2)
            os.kill(os.getpid(), signal.SIGKILL)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, ckpt)
        dir_fd = os.open(out, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # and the rename itself survives a power cut
        finally:
            os.close(dir_fd)
    fabric.barrier()
    if kind == "after":
        os.kill(os.getpid(), signal.SIGKILL)


def load(fabric, out: Path, state: dict[str, Any]) -> dict[str, Any]:
    """Restore `state`'s objects in place; return the rest (progress, RNG, order). weights_only=False: our own file."""
    (out / (CHECKPOINT + PARTIAL_SUFFIX)).unlink(missing_ok=True)  # a torn write from a kill: never read
    return fabric.load(out / CHECKPOINT, state, weights_only=False)


def summary(prog: Progress) -> dict[str, Any]:
    """What train_metrics.json records of checkpointing: how many, their median write time, and the steps
    a killed run was resumed at (only for a resumed run)."""
    out: dict[str, Any] = {
        "checkpoints_written": prog.saved,
        "checkpoint_write_median_s": (round(statistics.median(prog.checkpoints), 4) if prog.checkpoints else None),
    }
    if prog.resumed_at:
        out["resumed_at_steps"] = list(prog.resumed_at)
    return out


def rng_states() -> dict[str, Any]:
    from lightning_fabric.utilities.seed import _collect_rng_states

    return _collect_rng_states(include_cuda=True)


def set_rng_states(states: dict[str, Any]) -> None:
    from lightning_fabric.utilities.seed import _set_rng_states

    _set_rng_states(states)
