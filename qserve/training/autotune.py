"""What `auto` decides for one fine-tune: the precision, the batch size (the learning rate scaled with it) and TF32.

    python -m pytest tests/unit/test_autotune.py -q

On a CPU nothing is measured (precision.choose_precision, BASE_BATCH). On CUDA `probe_cuda` times full fine-tune
steps of each candidate precision on a ladder of batch sizes and `pick` takes the fastest within the rules of
docs/training.md, "Choosing the batch size on a GPU". Explicit flags are obeyed; a resumed run reuses the decision.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from qserve import QserveError
from qserve.devices import Capabilities, capabilities
from qserve.problemtypes import MULTI, REGRESSION, loss
from qserve.training.config import MAX_GRAD_NORM, TrainConfig
from qserve.training.precision import AUTO, PrecisionChoice, build_optimizer, choose_precision

log = logging.getLogger(__name__)

BASE_BATCH = 16
"""The batch size the recipes' learning rates were set at (the CPU recipe: --lr 1e-4 at 16), and what an automatic
batch size is wherever nothing is measured (a CPU, several devices)."""
MAX_BATCH = 256
"""The top of the ladder: at most 16x the base batch (the learning rate at most 4x --lr)."""
MIN_STEPS = 200
"""No automatic batch leaves the run fewer optimizer steps than this (a heuristic floor: the warm-up keeps
--warmup-ratio of at least this many, and the schedule enough steps to decay over)."""
BATCH_GAIN = 1.10
"""A doubling of the batch is taken only when it measures at least this many times the samples/s."""
MEMORY_SHARE = 0.8
"""A batch is allowed when its probed peak (reserved) memory is at most this share of the GPU memory this process
could use when the probe started: headroom for fragmentation and evaluation."""
PROBE_ROUNDS = 2
"""Rounds per batch size; in each, every candidate times PROBE_STEPS steps in turn (alternating, so drift hits
both alike); a candidate's step time is the median of its rounds."""
PROBE_STEPS = 3
PROBE_BUDGET_S = 10.0
"""The probe stops climbing the ladder once it has run this long (it normally finishes in a few seconds)."""
TF32_CAPABILITY = (8, 0)
"""TF32 tensor cores: Ampere (sm_80) and newer."""


@dataclass(frozen=True)
class Candidate:
    """One way the probe may train: a precision and the fp32 matmul precision it runs at (None: torch's default)."""

    precision: str
    matmul: str | None = None

    @property
    def label(self) -> str:
        if self.matmul is None:
            return self.precision
        return f"{self.precision}+tf32" if self.matmul == "high" else f"{self.precision} (matmul {self.matmul})"


class ProbeOOM(Exception):
    """A candidate's step did not fit: out of memory, or a peak over MEMORY_SHARE of the GPU's memory."""


class StepMeasurer(Protocol):
    """What the ladder needs of a measurement: a first step at a batch size (its peak memory), then timed steps."""

    def warm(self, cand: Candidate, batch: int) -> int | None: ...

    def time(self, cand: Candidate, batch: int, steps: int) -> float: ...


@dataclass(frozen=True)
class RunChoices:
    """What one run trains with, whether asked for or decided here, and why: recorded in train_metrics.json."""

    precision: PrecisionChoice
    batch_size: int
    batch_asked: int | None
    lr: float
    lr_asked: float
    matmul_precision: str | None
    batch_reason: str
    probe: dict[str, Any] | None = None

    @property
    def lr_rule(self) -> str:
        if self.batch_asked is not None:
            return "--lr as given (the batch size was given)"
        return f"--lr {self.lr_asked:g} x sqrt({self.batch_size}/{BASE_BATCH}) = {self.lr:.4g}"

    def batch_json(self) -> dict[str, Any]:
        """train_metrics.json `batch_choice`."""
        return {
            "batch_size": self.batch_size,
            "asked": AUTO if self.batch_asked is None else self.batch_asked,
            "reason": self.batch_reason,
            "lr": self.lr,
            "lr_asked": self.lr_asked,
            "lr_rule": self.lr_rule,
            "matmul_precision": self.matmul_precision,
        }

    def to_json(self) -> dict[str, Any]:
        """What a resumed run reads back (resume.record_start keeps it beside the config)."""
        return {
            "precision_choice": self.precision.to_json(),
            "batch_choice": self.batch_json(),
            "cuda_probe": self.probe,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunChoices:
        b = d["batch_choice"]
        return cls(
            PrecisionChoice(**d["precision_choice"]),
            int(b["batch_size"]),
            None if b["asked"] == AUTO else int(b["asked"]),
            float(b["lr"]),
            float(b["lr_asked"]),
            b.get("matmul_precision"),
            b["reason"],
            d.get("cuda_probe"),
        )

    def lines(self) -> list[str]:
        """What `qserve train` prints of the decision: the precision's line where it was `auto`, and where a probe
        ran the batch size, matmul precision and the probe's table."""
        out = [self.precision.line] if self.precision.asked == AUTO else []
        if self.batch_asked is None and self.probe is not None:
            out.append(f"batch size: {self.batch_size}, lr {self.lr:.4g} ({self.batch_reason}; {self.lr_rule})")
        if self.matmul_precision and self.probe is not None:
            tf32 = " (TF32)" if self.matmul_precision == "high" else ""
            out.append(f"fp32 matmul precision: {self.matmul_precision}{tf32}")
        if self.probe:
            out += ["probe: " + line for line in probe_table(self.probe)]
        return out


def candidates(asked: str, matmul: str | None, caps: Capabilities) -> list[Candidate]:
    """The precisions the probe compares: the one asked for, or for `auto` this GPU's mixed one and 32-true (TF32)."""
    if asked != AUTO:
        return [Candidate(asked, matmul)]
    mixed = "bf16-mixed" if caps.cuda_bf16 else "16-mixed"
    tf32 = caps.cuda_capability is not None and tuple(caps.cuda_capability) >= TF32_CAPABILITY
    return [Candidate(mixed, matmul), Candidate("32-true", matmul or ("high" if tf32 else None))]


def optimizer_steps(n_train: int, batch: int, epochs: int, grad_accum: int) -> int:
    """Optimizer steps of a run (as the loop counts them: a last short batch is a step)."""
    return -(-(-(-n_train // batch)) // grad_accum) * epochs


def batch_ladder(n_train: int, epochs: int, grad_accum: int) -> list[int]:
    """BASE_BATCH doubling up to MAX_BATCH, while the run keeps at least MIN_STEPS optimizer steps."""
    ladder = [BASE_BATCH]
    while ladder[-1] * 2 <= MAX_BATCH and optimizer_steps(n_train, ladder[-1] * 2, epochs, grad_accum) >= MIN_STEPS:
        ladder.append(ladder[-1] * 2)
    return ladder


def scale_lr(lr: float, batch: int) -> float:
    """The square-root rule: Adam's update scale is set by the gradient noise, whose std falls as 1/sqrt(batch),
    so the learning rate grows by sqrt (Malladi et al., NeurIPS 2022; linear scaling is SGD's rule)."""
    return lr * math.sqrt(batch / BASE_BATCH)


def run_ladder(
    measure: StepMeasurer,
    cands: list[Candidate],
    ladder: list[int],
    budget_s: float = PROBE_BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
) -> list[dict[str, Any]]:
    """One row per (batch, candidate) tried (step_s, samples_per_s, peak_memory_bytes, or `failed`), climbing while a
    doubling still pays (BATCH_GAIN), a candidate still fits and the budget lasts."""
    rows: list[dict[str, Any]] = []
    alive, best_before, t0 = list(cands), 0.0, clock()
    for batch in ladder:
        times: dict[Candidate, list[float]] = {}
        peaks: dict[Candidate, int | None] = {}
        for c in list(alive):
            try:
                peaks[c] = measure.warm(c, batch)
                times[c] = []
            except ProbeOOM as e:
                rows.append({"batch": batch, "candidate": c.label, "failed": str(e)})
                alive.remove(c)
        for _ in range(PROBE_ROUNDS):
            for c in list(times):
                try:
                    times[c].append(measure.time(c, batch, PROBE_STEPS))
                except ProbeOOM as e:
                    rows.append({"batch": batch, "candidate": c.label, "failed": str(e)})
                    alive.remove(c)
                    del times[c]
        best = 0.0
        for c, ts in times.items():
            step = statistics.median(ts)
            rows.append(
                {
                    "batch": batch,
                    "candidate": c.label,
                    "step_s": round(step, 6),
                    "samples_per_s": round(batch / step, 1),
                    "peak_memory_bytes": peaks[c],
                }
            )
            best = max(best, batch / step)
        if not times or best < BATCH_GAIN * best_before or clock() - t0 > budget_s:
            break
        best_before = best
    return rows


def pick(rows: list[dict[str, Any]], ladder: list[int]) -> tuple[dict[str, Any], str] | None:
    """The (batch, candidate) row to train with and why: the batch reached by doublings worth BATCH_GAIN, its fastest
    candidate; None when nothing fitted the base batch."""
    best: dict[int, dict[str, Any]] = {}
    for r in rows:
        if "step_s" in r and (r["batch"] not in best or r["samples_per_s"] > best[r["batch"]]["samples_per_s"]):
            best[r["batch"]] = r
    tried = [b for b in ladder if b in best]
    if not tried:
        return None
    chosen = tried[0]
    for b in ladder[ladder.index(chosen) + 1 :]:
        if b in best and best[b]["samples_per_s"] >= BATCH_GAIN * best[chosen]["samples_per_s"]:
            chosen = b
            continue
        failed = [r for r in rows if r["batch"] == b and "failed" in r]
        if b in best:
            gain = best[b]["samples_per_s"] / best[chosen]["samples_per_s"]
            why = f"batch {b} measured {gain:.2f}x its samples/s, under the {BATCH_GAIN:.2f}x a doubling must buy"
        elif failed:
            why = f"batch {b} did not fit ({failed[0]['failed']})"
        else:
            why = f"batch {b} was not reached (the probe stopped climbing: its time budget)"
        return best[chosen], why
    top = ladder[-1]
    why = (
        f"the top of the ladder ({MAX_BATCH})"
        if top == MAX_BATCH
        else f"the largest batch that leaves the run at least {MIN_STEPS} optimizer steps"
    )
    return best[chosen], why


def probe_table(probe: dict[str, Any]) -> list[str]:
    """The probe's rows as short lines, a heading and one per batch: `batch B: CANDIDATE STEP ms (SAMPLES/s, PEAK
    GB); ...` (a candidate that did not fit says why)."""
    by: dict[int, list[str]] = {}
    rows = probe.get("rows") or []
    for r in rows:
        if "failed" in r:
            cell = f"{r['candidate']} failed ({r['failed']})"
        else:
            mem = f", {r['peak_memory_bytes'] / 1e9:.1f} GB" if r.get("peak_memory_bytes") else ""
            cell = f"{r['candidate']} {r['step_s'] * 1e3:.1f} ms ({r['samples_per_s']:,.0f}/s{mem})"
        by.setdefault(r["batch"], []).append(cell)
    head = (
        f"{len(rows)} rows at {probe.get('max_length')} tokens in {probe.get('wall_s', 0):.1f} s "
        f"(median of {PROBE_ROUNDS} rounds of {PROBE_STEPS} steps, after one warm-up step)"
    )
    return [head] + [f"batch {b}: " + "; ".join(cells) for b, cells in by.items()]


def probes(cfg: TrainConfig, device: str) -> bool:
    """Whether this run's `auto` values are measured: one CUDA device, and the precision or the batch size auto."""
    return device.startswith("cuda") and cfg.devices == 1 and (cfg.precision == AUTO or cfg.batch_size is None)


GIVEN = "given (--batch-size, or the pipeline's recipe for this device)"


def _unmeasured(cfg: TrainConfig, choice: PrecisionChoice, why: str, record: dict | None = None) -> RunChoices:
    """The batch size given, else BASE_BATCH with --lr scaled to it; the matmul precision as given."""
    batch = cfg.batch_size or BASE_BATCH
    lr = cfg.lr if cfg.batch_size else scale_lr(cfg.lr, batch)
    return RunChoices(choice, batch, cfg.batch_size, lr, cfg.lr, cfg.matmul_precision, why, record)


def decide(
    cfg: TrainConfig,
    device: str,
    choice: PrecisionChoice | None,
    n_train: int,
    probe: Callable[[list[Candidate], list[int]], dict[str, Any]] | None = None,
    caps: Capabilities | None = None,
) -> RunChoices:
    """The run's precision, batch size, learning rate and matmul precision.

    `choice`: the precision choose_precision already chose, or None for the probe to choose; `probe(candidates,
    ladder)` returns {"rows": run_ladder's rows, ...} and is called only where `probes` says so."""
    if probe is None or not probes(cfg, device):
        many = f", {cfg.devices} devices" if cfg.devices > 1 else ""
        base = f"the base batch: measured only on a single CUDA device (here {device}{many})"
        return _unmeasured(
            cfg, choice or choose_precision(cfg.precision, device, caps), GIVEN if cfg.batch_size else base
        )
    caps = caps or capabilities(with_cuda=True)
    cands = candidates(choice.precision if choice else AUTO, cfg.matmul_precision, caps)
    ladder = [cfg.batch_size] if cfg.batch_size else batch_ladder(n_train, cfg.epochs, cfg.grad_accum)
    record = probe(cands, ladder)
    picked = pick(record["rows"], ladder)
    if picked is None:  # not even the base batch fitted: train as before the probe, and say why
        fallback = choice or choose_precision(AUTO, device, caps)
        note = "" if choice else " (the probe fitted no candidate)"
        fallback = PrecisionChoice(fallback.precision, fallback.asked, fallback.reason + note)
        why = "the probe fitted no candidate at any batch size: the base batch, as asked or by default"
        return _unmeasured(cfg, fallback, why, record)
    row, why = picked
    cand = next(c for c in cands if c.label == row["candidate"])
    if choice is None:
        sm = f"sm_{caps.cuda_capability[0]}{caps.cuda_capability[1]}" if caps.cuda_capability else "?"
        others = [r for r in record["rows"] if r["batch"] == row["batch"] and "step_s" in r and r is not row]
        vs = "; ".join(f"{r['candidate']} {r['samples_per_s']:,.0f}" for r in others) or "no other candidate fitted"
        choice = PrecisionChoice(
            cand.precision,
            AUTO,
            f"measured fastest on this GPU ({caps.cuda_name}, {sm}): "
            f"{cand.label} {row['samples_per_s']:,.0f} samples/s at batch {row['batch']}, "
            f"against {vs}",
        )
    if cfg.batch_size:
        return RunChoices(choice, cfg.batch_size, cfg.batch_size, cfg.lr, cfg.lr, cand.matmul, GIVEN, record)
    reason = (
        f"measured: {row['samples_per_s']:,.0f} samples/s at batch {row['batch']} ({row['candidate']}); "
        f"larger not taken: {why}"
    )
    return RunChoices(choice, row["batch"], None, scale_lr(cfg.lr, row["batch"]), cfg.lr, cand.matmul, reason, record)


# -- the measurement on a GPU ----------------------------------------------------------------------------------


class StepTimer:
    """Full fine-tune steps of a private copy of the model on `device`, timed as the loop runs them; only CUDA reports
    peak memory and can run out of it."""

    def __init__(
        self,
        model,
        device: str,
        max_length: int,
        problem: str,
        num_labels: int,
        lr: float,
        cands: list[Candidate],
        bf16_update: str = "compensated",
    ):
        import torch

        self.torch, self.device, self.max_length = torch, torch.device(device), max_length
        self.problem, self.num_labels, self.cuda = problem, num_labels, self.device.type == "cuda"
        self.matmul_before = torch.get_float32_matmul_precision()
        check_positions(model, max_length)
        self.budget: int | None = None
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            self.budget = int(MEMORY_SHARE * (free + torch.cuda.memory_reserved(self.device)))
        # bf16-true trains bf16 weights: a candidate only when asked explicitly, alone
        dtype = torch.bfloat16 if any(c.precision == "bf16-true" for c in cands) else torch.float32
        self.model = model.to(device=self.device, dtype=dtype).train()
        params = [p for p in self.model.parameters() if p.requires_grad]
        precision = "bf16-true" if dtype == torch.bfloat16 else "32-true"
        self.optimizer = build_optimizer(
            [{"params": params, "weight_decay": 0.01}], precision, bf16_update, lr, fused=self.cuda
        )
        self.params = params
        self.scaler = torch.amp.GradScaler("cuda") if any(c.precision == "16-mixed" for c in cands) else None
        self.vocab = int(getattr(self.model.config, "vocab_size", 1000))
        self.inputs: dict[int, dict[str, Any]] = {}

    def _batch(self, batch: int) -> dict[str, Any]:
        """A full-width batch (every row max_length tokens): its memory bounds every batch of the run."""
        if batch not in self.inputs:
            torch = self.torch
            self.inputs.clear()  # one batch size at a time on the GPU
            gen = torch.Generator().manual_seed(batch)
            ids = torch.randint(min(1000, self.vocab - 1), self.vocab, (batch, self.max_length), generator=gen)
            if self.problem == MULTI:
                labels = torch.randint(0, 2, (batch, self.num_labels), generator=gen).float()
            elif self.problem == REGRESSION:
                labels = torch.rand(batch, 1, generator=gen)
            else:
                labels = torch.randint(0, self.num_labels, (batch,), generator=gen)
            self.inputs[batch] = {
                "input_ids": ids.to(self.device),
                "labels": labels.to(self.device),
                "attention_mask": torch.ones_like(ids).to(self.device),
            }
        return self.inputs[batch]

    def _step(self, cand: Candidate, batch: int) -> None:
        torch = self.torch
        b = self._batch(batch)
        dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(cand.precision)
        # autocast as Fabric's mixed precisions run it; none for the true precisions
        with torch.autocast(self.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
            logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        out = loss(logits, b["labels"], self.problem)
        if cand.precision == "16-mixed" and self.scaler is not None:
            self.scaler.scale(out).backward()
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            out.backward()
            torch.nn.utils.clip_grad_norm_(self.params, MAX_GRAD_NORM)
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def _run(self, cand: Candidate, batch: int, steps: int) -> None:
        """`steps` steps of cand at batch, an out-of-memory error turned into ProbeOOM once its frames are gone."""
        torch = self.torch
        torch.set_float32_matmul_precision(cand.matmul or self.matmul_before)
        failed = None
        try:
            for _ in range(steps):
                self._step(cand, batch)
            self._sync()
        except torch.cuda.OutOfMemoryError as e:  # the same class as torch.OutOfMemoryError
            failed = str(e).splitlines()[0][:120]
        if failed is not None:
            self.optimizer.zero_grad(set_to_none=True)
            self.inputs.clear()
            if self.scaler is not None:  # a step cut short leaves it mid-unscale
                self.scaler = torch.amp.GradScaler("cuda")
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()
            raise ProbeOOM(f"out of memory: {failed}")

    def warm(self, cand: Candidate, batch: int) -> int | None:
        """One untimed step (kernel selection, allocations, the optimizer's state); its peak reserved memory."""
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)
        self._run(cand, batch, 1)
        if not self.cuda:
            return None
        peak = int(self.torch.cuda.max_memory_reserved(self.device))
        if self.budget is not None and peak > self.budget:
            could = self.budget / MEMORY_SHARE / 1e9
            raise ProbeOOM(
                f"peak {peak / 1e9:.1f} GB over {MEMORY_SHARE:.0%} of the {could:.1f} GB this process could use"
            )
        return peak

    def time(self, cand: Candidate, batch: int, steps: int) -> float:
        """Seconds per step over `steps` steps queued back to back, as the loop queues them."""
        self._sync()
        self.torch.set_float32_matmul_precision(cand.matmul or self.matmul_before)
        t = time.perf_counter()
        self._run(cand, batch, steps)
        return (time.perf_counter() - t) / steps

    def close(self) -> None:
        """Free the copy, its optimizer and inputs; torch's matmul precision as it was."""
        torch = self.torch
        torch.set_float32_matmul_precision(self.matmul_before)
        self.inputs.clear()
        del self.model, self.optimizer, self.params
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)


def probe_cuda(
    load_model: Callable[[], Any],
    device: str,
    max_length: int,
    problem: str,
    num_labels: int,
    lr: float,
    bf16_update: str = "compensated",
) -> Callable[[list[Candidate], list[int]], dict[str, Any]]:
    """The probe `decide` calls on CUDA: a fresh copy of the model timed up the ladder per candidate, then freed."""

    def probe(cands: list[Candidate], ladder: list[int]) -> dict[str, Any]:
        import torch

        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=[]):  # the model's head init draws; the run seeds its own afterwards
            timer = StepTimer(load_model(), device, max_length, problem, num_labels, lr, cands, bf16_update)
            try:
                rows = run_ladder(timer, cands, ladder)
            finally:
                budget = timer.budget
                timer.close()
        return {
            "rows": rows,
            "max_length": max_length,
            "ladder": ladder,
            "candidates": [c.label for c in cands],
            "memory_budget_bytes": budget,
            "wall_s": round(time.perf_counter() - t0, 2),
            "rules": {
                "batch_gain": BATCH_GAIN,
                "min_steps": MIN_STEPS,
                "max_batch": MAX_BATCH,
                "memory_share": MEMORY_SHARE,
                "rounds": PROBE_ROUNDS,
                "steps": PROBE_STEPS,
            },
        }

    return probe


def check_positions(model, max_length: int) -> None:
    """--max-length within the model's position table (an index past it would fail deep in a kernel)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and max_length > limit:
        raise QserveError(f"--max-length {max_length} exceeds the model's {limit} positions")
