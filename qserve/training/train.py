"""Fine-tune a text classifier with Lightning Fabric; precision is a parameter.

    qserve train --max-samples 4000 --epochs 1          # embedded MiniLM-DistilBERT on embedded IMDb
    qserve train --model distilbert-base-uncased --dataset imdb --precision 16-mixed --devices 2
    qserve train --compare --max-samples 2000           # one run per precision -> precision_study.md

Writes atomically an HF checkpoint (fp32 safetensors whatever the precision), `qserve_model.json` (what
exporters and bench read) and `train_metrics.json` (the final weights' test metrics); resumable: resume.py.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import psutil
from tqdm.auto import tqdm

from qserve import QserveError
from qserve.configflags import add_flags, build, field_docs
from qserve.data.datasets import load_dataset
from qserve.devices import resolve_device
from qserve.modeling import load_for_training, skip_unused_imports
from qserve.problemtypes import from_flag, headline, loss
from qserve.training import autotune, resume
from qserve.training import outputs as trainout
from qserve.training.autotune import RunChoices
from qserve.training.batches import TokenTable, batch_inputs, encode_split, evaluate
from qserve.training.config import (
    MAX_GRAD_NORM,
    CompareOptions,
    TrainConfig,
    run_dir,
    split_seed,
    train_policy,
    validate,
)
from qserve.training.precision import AUTO, build_optimizer, check_precision, choose_precision, optimizer_state_bytes

log = logging.getLogger(__name__)
BUDGET_STEPS = 4
"""Optimizer steps timed before a time budget plans the rest (the first, warm-up, is left out of the median)."""


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Fine-tune per `cfg`, write the checkpoint to cfg.out (or the default), return the metrics (rank 0; others None).

    An unfinished run with the same config resumes; a finished one is returned as it is, never retrained."""
    t0 = time.perf_counter()
    validate(cfg)
    device = resolve_device(cfg.device)
    measured = autotune.probes(cfg, device)
    # on a single GPU a probe of real steps picks `auto` (after the data and the run dir); elsewhere decided now
    choice = None if measured and cfg.precision == AUTO else choose_precision(cfg.precision, device)
    if choice is not None:
        check_precision(choice.precision, device)
        if cfg.precision == AUTO:
            print(choice.line, flush=True)
    data = load_dataset(
        cfg.dataset,
        max_samples=cfg.max_samples,
        seed=split_seed(cfg),
        max_eval_samples=cfg.max_eval_samples,
        problem_type=from_flag(cfg.problem_type),
    )
    out = Path(cfg.out) if cfg.out else run_dir(cfg.model, cfg.dataset) / "checkpoint"
    # before minutes of training, not after
    todo = resume.plan(out, asdict(cfg), asdict(TrainConfig()), cfg.resume, cfg.force)
    if todo.action == "finished":
        print(f"{out} already holds this finished run; not retraining it (--force trains it again)", flush=True)
        return todo.finished_metrics or {}
    if todo.action == "resume" and todo.decided:  # a resumed run trains on with what it started with
        choices = RunChoices.from_json(todo.decided)
    else:
        # a run started before choices were recorded resumes as it was decided then: by the device, unmeasured
        measured = measured and todo.action != "resume"
        probe = (
            autotune.probe_cuda(
                lambda: load_for_training(cfg.model, data.labels)[0],
                device,
                cfg.max_length,
                data.problem_type,
                len(data.labels),
                cfg.lr,
                cfg.bf16_update,
            )
            if measured
            else None
        )
        choices = autotune.decide(cfg, device, choice, len(data.train), probe)
        if measured:
            for line in choices.lines():
                print(line, flush=True)
    if choice is None:
        check_precision(choices.precision.precision, device)
    from lightning_fabric import Fabric

    devices: int | list[int]
    accelerator, devices = ("cpu", cfg.devices) if device == "cpu" else ("cuda", cfg.devices)
    if device.startswith("cuda:"):
        devices = [int(device.split(":", 1)[1])]
    fabric = Fabric(
        accelerator=accelerator, devices=devices, strategy=cfg.strategy, precision=choices.precision.precision
    )
    # launch() starts the DDP processes when devices > 1; every rank runs _fit, rank 0 writes.
    return fabric.launch(_fit, cfg, data, todo, device, t0, choices)


def budget_steps(budget_min: float, done: int, train_time: float, step_times: list[float], total: int) -> int:
    """Optimizer steps that fit `budget_min` minutes of training: those done plus what the rest of the budget
    buys at the median step time so far (the first step, which pays one-off warm-up, left out); at most `total`."""
    median = statistics.median(step_times[1:] or step_times)
    left = budget_min * 60 - train_time
    return max(done, min(total, done + int(left / max(median, 1e-9))))


class StepClock:
    """The loop's step and optimizer-step times, without a host sync per step: host clock on a CPU; on CUDA stream
    events read back in batches (`flush`), so the host keeps queueing ahead and each step's time is its wall time."""

    FLUSH_STEPS = 256

    def __init__(self, cuda: bool, prog: resume.Progress):
        self.cuda, self.prog = cuda, prog
        self.pending: list[tuple[Any, Any, Any, Any]] = []

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, start: Any, opt_start: Any, opt_end: Any, end: Any) -> None:
        if not self.cuda:
            self.prog.step_times.append(end - start)
            self.prog.opt_times.append(opt_end - opt_start)
            return
        self.pending.append((start, opt_start, opt_end, end))
        if len(self.pending) >= self.FLUSH_STEPS:
            self.flush()

    def flush(self) -> None:
        """Every pending step's times into the progress (waits for the last of them on the GPU)."""
        if not self.pending:
            return
        self.pending[-1][3].synchronize()
        for start, opt_start, opt_end, end in self.pending:
            self.prog.step_times.append(start.elapsed_time(end) / 1e3)  # ms
            self.prog.opt_times.append(opt_start.elapsed_time(opt_end) / 1e3)
        self.pending.clear()


def _fit(fabric, cfg: TrainConfig, data, todo, device: str, t0: float, choices: RunChoices) -> dict[str, Any] | None:
    import torch

    out, cuda = todo.out, device.startswith("cuda")
    fabric.seed_everything(cfg.seed, verbose=False)
    if choices.matmul_precision:
        torch.set_float32_matmul_precision(choices.matmul_precision)
    model, tok, base_name = load_for_training(cfg.model, data.labels)
    model.config.problem_type = problem = data.problem_type  # saved in config.json: how the logits are read
    autotune.check_positions(model, cfg.max_length)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    policy = train_policy(cfg)
    # tokenized once per run, kept as tensors: an epoch gathers rows instead of building tensors from lists
    train_tab, val_tab, test_tab = (
        TokenTable(encode_split(tok, s, cfg.max_length, policy, problem, len(data.labels)), pad_id)
        for s in (data.train, data.val, data.test)
    )
    batch_size = choices.batch_size
    # The shuffling generator: its state at an epoch's start fixes that epoch's order (checkpointed).
    gen = torch.Generator().manual_seed(cfg.seed)
    # pinned batches: Fabric's copy to the GPU is non_blocking, which only overlaps from page-locked memory
    loader = torch.utils.data.DataLoader(
        train_tab,
        batch_size=batch_size,
        shuffle=True,
        collate_fn=train_tab,
        num_workers=cfg.num_workers,
        generator=gen,
        pin_memory=cuda,
    )
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
            "weight_decay": cfg.weight_decay,
        },
        {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = build_optimizer(groups, choices.precision.precision, cfg.bf16_update, choices.lr, fused=cuda)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    steps_per_epoch = -(-len(loader) // cfg.grad_accum)
    full = steps_per_epoch * cfg.epochs
    # the planned length is read at each step: a time budget shortens it, and warm-up and decay end where training stops
    plan = {"total": full}

    def lr_factor(s: int) -> float:
        total = plan["total"]
        warmup = int(total * cfg.warmup_ratio)
        return (s + 1) / (warmup + 1) if s < warmup else max(0.0, (total - s) / max(1, total - warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    objects = {"model": model, "optimizer": optimizer, "scheduler": sched}
    scaler = getattr(fabric.strategy.precision, "scaler", None)  # 16-mixed's GradScaler
    if scaler is not None:
        objects["scaler"] = scaler
    prog, epoch_gen, rng = resume.Progress(), None, None
    if todo.action == "resume":
        rest = resume.load(fabric, out, objects)
        prog, epoch_gen, rng = resume.Progress(**rest["progress"]), rest["epoch_generator"], rest["rng"]
        prog.resumed_at.append(prog.step)
        if prog.planned_steps:
            plan["total"] = prog.planned_steps
        if fabric.is_global_zero:
            print(
                f"resuming at step {prog.step} of {plan['total']} (epoch {prog.epoch + 1}/{cfg.epochs}, batch "
                f"{prog.batch}/{len(loader)}) from {out / resume.CHECKPOINT}"
                + (
                    f", with the choices it started with: {choices.precision.precision}, batch {batch_size}, lr "
                    f"{choices.lr:.4g}"
                    if todo.decided
                    else ""
                ),
                flush=True,
            )
    elif fabric.is_global_zero:
        resume.record_start(out, asdict(cfg), choices.to_json())
    fabric.barrier()
    every = cfg.checkpoint_every if cfg.checkpoint_every is not None else resume.auto_interval(prog.step_times)
    clock = StepClock(cuda, prog)
    # the epoch's loss and real tokens, summed on the device in float64 and read back only where shown or saved
    sums: dict[str, Any] = {}

    def read_sums() -> None:
        if "loss" in sums:
            prog.run_loss, prog.tokens = float(sums["loss"]), int(sums["tokens"])
            prog.last_loss = prog.run_loss / max(1, prog.run_n)

    def checkpoint(epoch_state, t_epoch: float) -> None:
        t = time.perf_counter()
        clock.flush()
        read_sums()
        prog.saved += 1  # counted in its own snapshot, so a resumed run goes on counting from it
        wall = prog.wall_before + t - t0
        snap = {**asdict(prog), "train_time": prog.train_time + t - t_epoch, "wall_before": wall}
        resume.save(
            fabric,
            out,
            {
                **objects,
                "progress": snap,
                "epoch_generator": epoch_state,
                "rng": resume.rng_states(),
                "config": asdict(cfg),
            },
            prog.saved,
        )
        prog.checkpoints.append(round(time.perf_counter() - t, 4))

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    proc = psutil.Process()
    world = fabric.world_size
    for epoch in range(prog.epoch, cfg.epochs):
        if prog.planned_steps and prog.step >= prog.planned_steps:
            break  # the budget ran out in an earlier epoch
        model.train()
        resuming = epoch_gen is not None
        if resuming:
            gen.set_state(epoch_gen)  # replay this epoch's order exactly, then skip what was trained
        epoch_state = gen.get_state()
        if hasattr(loader, "_num_iter_calls"):
            loader._num_iter_calls = epoch  # Fabric sets a DistributedSampler's epoch from its count of iter() calls
        it = iter(loader)
        skip = prog.batch if resuming else 0
        for _ in range(skip):
            next(it)
        if resuming and rng is not None:
            resume.set_rng_states(rng)  # dropout draws continue where the killed run stopped
        else:
            prog.run_loss, prog.run_n = 0.0, 0
        sums.clear()
        epoch_gen = rng = None
        bar = tqdm(
            it,
            desc=f"epoch {epoch + 1}/{cfg.epochs}",
            disable=not fabric.is_global_zero,
            initial=skip,
            total=len(loader),
            mininterval=0.5 if sys.stderr.isatty() else 10,
            dynamic_ncols=True,
        )
        t_epoch = shown = time.perf_counter()
        t_step = clock.mark()
        for i, batch in enumerate(bar, start=skip):
            accumulating = (i + 1) % cfg.grad_accum != 0 and i + 1 != len(loader)
            with fabric.no_backward_sync(model, enabled=accumulating):
                logits = model(**batch_inputs(batch)).logits
                step_loss = loss(logits, batch["labels"], problem)
                fabric.backward(step_loss / cfg.grad_accum)
            prog.seen += len(batch["labels"]) * world
            prog.padded_tokens += batch["input_ids"].numel() * world
            if not sums:
                sums["loss"] = torch.tensor(prog.run_loss, dtype=torch.float64, device=step_loss.device)
                sums["tokens"] = torch.tensor(prog.tokens, dtype=torch.int64, device=step_loss.device)
            sums["loss"] += step_loss.detach().double()
            sums["tokens"] += batch["attention_mask"].sum() * world
            prog.run_n += 1
            if accumulating:
                continue
            # error_if_nonfinite=False: 16-mixed's first steps overflow by design; the scaler skips them.
            fabric.clip_gradients(model, optimizer, max_norm=MAX_GRAD_NORM, error_if_nonfinite=False)
            t_opt = clock.mark()
            optimizer.step()
            t_opt_end = clock.mark()
            optimizer.zero_grad(set_to_none=True)
            sched.step()
            clock.add(t_step, t_opt, t_opt_end, clock.mark())
            prog.step, prog.epoch, prog.batch = prog.step + 1, epoch, i + 1
            if prog.step <= BUDGET_STEPS:
                clock.flush()  # the first steps' times plan the budget and the checkpoint interval
            now = time.perf_counter()
            if not cuda:
                prog.rss_peak = max(prog.rss_peak, proc.memory_info().rss)
            if now - shown >= 1.0 or not cuda:
                read_sums()
                shown = now
                bar.set_postfix(
                    loss=f"{prog.last_loss:.4f}",
                    samples_s=f"{prog.seen / (prog.train_time + now - t_epoch):.1f}",
                    refresh=False,
                )
            if every is None:
                every = resume.auto_interval(prog.step_times)
            if cfg.train_budget and not prog.planned_steps and len(prog.step_times) >= BUDGET_STEPS:
                prog.planned_steps = plan["total"] = budget_steps(
                    cfg.train_budget, prog.step, prog.train_time + now - t_epoch, prog.step_times, full
                )
                if prog.planned_steps < full and fabric.is_global_zero:
                    print(
                        f"\ntime budget {cfg.train_budget:g} min: training {prog.planned_steps} of {full} steps "
                        f"at {statistics.median(prog.step_times[1:]):.2f} s a step",
                        flush=True,
                    )
            if every and prog.step % every == 0 and prog.step < plan["total"]:
                checkpoint(epoch_state, t_epoch)
            if prog.planned_steps and prog.step >= prog.planned_steps:
                break
            t_step = clock.mark()  # a checkpoint's write is not the next step's time
        bar.close()
        clock.flush()
        if cuda:
            torch.cuda.synchronize()  # the epoch's time ends when its last step has run, not when it was queued
        read_sums()
        prog.train_time += time.perf_counter() - t_epoch
        prog.epoch, prog.batch = epoch + 1, 0
        val = evaluate(fabric, model, val_tab, batch_size * 2, problem)
        prog.epoch_val.append(val.get("accuracy", val.get("mae")))
        if fabric.is_global_zero:
            msg = "epoch %d/%d: train loss %.4f, val %s (%d examples)"
            log.info(msg, epoch + 1, cfg.epochs, prog.last_loss, headline(val), val["n"])
    test = evaluate(fabric, model, test_tab, batch_size * 2, problem)
    if not cuda:
        prog.rss_peak = max(prog.rss_peak, proc.memory_info().rss)
    inner = getattr(optimizer, "optimizer", optimizer)  # Fabric wraps the optimizer
    opt_cls = type(inner)
    opt_times = prog.opt_times
    warmup = int(plan["total"] * cfg.warmup_ratio)
    opt = {
        "optimizer": f"{opt_cls.__module__.split('.')[0]}.{opt_cls.__name__}",
        "optimizer_fused": bool(inner.defaults.get("fused")),
        "optimizer_state_bytes": optimizer_state_bytes(optimizer),
        "optimizer_step_median_s": round(statistics.median(opt_times[1:] or opt_times), 6) if opt_times else None,
        **resume.summary(prog),
        "precision": choices.precision.precision,
        "precision_choice": choices.precision.to_json(),
        "batch_size": batch_size,
        "batch_choice": {**choices.batch_json(), "warmup_steps": warmup, "planned_steps": plan["total"]},
        **({"cuda_probe": choices.probe} if choices.probe else {}),
        "tokens": {"real": prog.tokens, "padded": prog.padded_tokens},
    }
    if cfg.train_budget:
        opt["time_budget"] = {
            "minutes": cfg.train_budget,
            "steps": prog.step,
            "of_steps": full,
            "examples": prog.seen,
            "of_examples": len(train_tab) * cfg.epochs,
            "cut": prog.step < full,
        }
    metrics = trainout.metrics(fabric, cfg, data, device, base_name, t0, prog, val, test, opt)
    if fabric.is_global_zero:
        trainout.write(out, cfg, model.module, tok, base_name, data, metrics, split_seed(cfg), policy)
        log.info("wrote %s: val %s, test %s, %.1f s training", out, headline(val), headline(test), prog.train_time)
    fabric.barrier()
    return metrics if fabric.is_global_zero else None


# -- CLI ---------------------------------------------------------------------------------


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="fine-tune a classifier (Lightning Fabric)",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(p, TrainConfig, [f.name for f in fields(TrainConfig) if f.name != "resume"])
    # three states (unset = resume if there is a run to resume), which a plain bool flag cannot say
    p.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=field_docs(TrainConfig)["resume"].replace("%", "%%"),
    )
    add_flags(p, CompareOptions)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    compare = bool(getattr(args, "compare", False))
    precisions = args.precision or [TrainConfig.precision]
    updates = getattr(args, "bf16_update", None) or [TrainConfig.bf16_update]
    for flag, given in (("--precision", precisions), ("--bf16-update", updates)):
        if len(given) > 1 and not compare:
            raise QserveError(f"{flag} was given {len(given)} times; give it once, or add --compare to compare several")
    # 0 = no cap: the command line has no other way to say None
    caps = {name: None for name in ("max_samples", "max_eval_samples") if getattr(args, name, None) == 0}
    return build(
        TrainConfig, args, overrides={"precision": precisions[0], "bf16_update": updates[0], **caps}, error=QserveError
    )


def run(args) -> int:
    """`qserve train`: one fine-tune (`--compare`, the precision study, is routed by qserve.cli to training.study)."""
    if getattr(args, "compare", False):
        raise QserveError(
            "--compare runs the precision study: use `qserve train --compare ...` "
            "(`python -m qserve.training.train` runs one fine-tune)"
        )
    cfg = config_from_args(args)
    m = train(cfg)
    if m is None:  # a DDP worker rank: rank 0 reports
        return 0
    metric = "mae" if "test_mae" in m else "accuracy"
    print(
        f"trained {m['model_name']} ({m['precision']}, {m['device']}): val {metric} {m[f'val_{metric}']:.4f}, "
        f"test {metric} {m[f'test_{metric}']:.4f}, {m['train_time_s']:.1f} s training"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m qserve.training.train ...`: the train command alone (what --compare runs per precision)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    skip_unused_imports()  # an entry point like `qserve train`: the study's children start as fast as it does
    parser = argparse.ArgumentParser(prog="qserve")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except QserveError as e:
        print(f"qserve train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
