"""Fine-tune a text classifier with Lightning Fabric; precision is a parameter.

    qserve train --max-samples 4000 --epochs 1          # embedded MiniLM-DistilBERT on embedded IMDb
    qserve train --model distilbert-base-uncased --dataset imdb --precision 16-mixed --devices 2
    qserve train --compare --max-samples 2000           # one run per precision -> precision_study.md

Writes, atomically (staged temp dir renamed into place; an --out holding anything but this run needs --force;
while training, a resumable checkpoint every --checkpoint-every steps: qserve/training/resume.py):
an HF checkpoint (config.json with id2label/label2id, model.safetensors in fp32 whatever the
training precision, tokenizer files), `qserve_model.json` (what exporters and bench read:
model_name, max_length, long_text, dataset, seed, max_eval_samples, labels, problem_type, and inputs
["text", "text_pair"] for a model trained on a dataset with a text_pair column) and `train_metrics.json`.
The test metrics are those of the final weights (no checkpoint selection on val): accuracy (single-label),
exact-match and per-label accuracy (multi-label), MAE and RMSE (regression).
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
from qserve.problemtypes import from_flag, headline, loss
from qserve.training.batches import PadCollate, batch_inputs, encode_split, evaluate
from qserve.training.config import MAX_GRAD_NORM, CompareOptions, TrainConfig, split_seed, train_policy, validate
from qserve.training.precision import PrecisionChoice, build_optimizer, check_precision, choose_precision, \
    optimizer_state_bytes
from qserve.data.datasets import load_dataset
from qserve.devices import resolve_device
from qserve.modeling import load_for_training, model_name_for, skip_unused_imports
from qserve.training import outputs as trainout, resume

log = logging.getLogger(__name__)
BUDGET_STEPS = 4
"""Optimizer steps timed before a time budget plans the rest (the first, warm-up, is left out of the median)."""

def train(cfg: TrainConfig) -> dict[str, Any]:
    """Fine-tune per `cfg`, write the checkpoint to cfg.out (or the default), return the metrics.

    An out dir holding an unfinished run with the same config resumes it (qserve.training.resume); one holding
    a finished run with the same config is returned as it is, never retrained.
    With several DDP processes every rank trains; rank 0 writes and gets the metrics, the others None.
    """
    t0 = time.perf_counter()
    validate(cfg)
    device = resolve_device(cfg.device)
    choice = choose_precision(cfg.precision, device)
    check_precision(choice.precision, device)
    if cfg.precision == "auto":
        print(choice.line, flush=True)
    data = load_dataset(cfg.dataset, max_samples=cfg.max_samples, seed=split_seed(cfg),
                        max_eval_samples=cfg.max_eval_samples, problem_type=from_flag(cfg.problem_type))
    base_name = model_name_for(cfg.model)
    out = Path(cfg.out) if cfg.out else Path("models") / f"{base_name}-{data.info['short_name']}-{choice.precision}"
    # before minutes of training, not after
    todo = resume.plan(out, asdict(cfg), asdict(TrainConfig()), cfg.resume, cfg.force)
    if todo.action == "finished":
        print(f"{out} already holds this finished run; not retraining it (--force trains it again)", flush=True)
        return todo.finished_metrics or {}
    from lightning_fabric import Fabric

    devices: int | list[int]
    accelerator, devices = ("cpu", cfg.devices) if device == "cpu" else ("cuda", cfg.devices)
    if device.startswith("cuda:"):
        devices = [int(device.split(":", 1)[1])]
    fabric = Fabric(accelerator=accelerator, devices=devices, strategy=cfg.strategy, precision=choice.precision)
    # launch() starts the DDP processes when devices > 1; every rank runs _fit, rank 0 writes.
    return fabric.launch(_fit, cfg, data, todo, device, t0, choice)


def budget_steps(budget_min: float, done: int, train_time: float, step_times: list[float], total: int) -> int:
    """Optimizer steps that fit `budget_min` minutes of training: those done plus what the rest of the budget
    buys at the median step time so far (the first step, which pays one-off warm-up, left out); at most `total`."""
    median = statistics.median(step_times[1:] or step_times)
    left = budget_min * 60 - train_time
    return max(done, min(total, done + int(left / max(median, 1e-9))))


def _fit(fabric, cfg: TrainConfig, data, todo, device: str, t0: float,
         choice: PrecisionChoice) -> dict[str, Any] | None:
    import torch

    out = todo.out
    fabric.seed_everything(cfg.seed, verbose=False)
    if cfg.matmul_precision:
        torch.set_float32_matmul_precision(cfg.matmul_precision)
    model, tok, base_name = load_for_training(cfg.model, data.labels)
    model.config.problem_type = problem = data.problem_type  # saved in config.json: how the logits are read
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit and cfg.max_length > limit:
        raise QserveError(f"--max-length {cfg.max_length} exceeds the model's {limit} positions")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    policy = train_policy(cfg)
    train_ex, val_ex, test_ex = (encode_split(tok, s, cfg.max_length, policy, problem, len(data.labels))
                                 for s in (data.train, data.val, data.test))
    # The shuffling generator: its state at an epoch's start fixes that epoch's order (checkpointed).
    gen = torch.Generator().manual_seed(cfg.seed)
    loader = torch.utils.data.DataLoader(train_ex, batch_size=cfg.batch_size, shuffle=True,
                                         collate_fn=PadCollate(pad_id), num_workers=cfg.num_workers, generator=gen)
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight")
    groups = [{"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
               "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0}]
    optimizer = build_optimizer(groups, choice.precision, cfg.bf16_update, cfg.lr)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(loader)
    steps_per_epoch = -(-len(loader) // cfg.grad_accum)
    full = steps_per_epoch * cfg.epochs
    # The schedule reads the planned length at each step: a time budget (cfg.train_budget) shortens it after
    # the first steps, and warm-up and decay are re-planned to end where training will stop.
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
            print(f"resuming at step {prog.step} of {plan['total']} (epoch {prog.epoch + 1}/{cfg.epochs}, batch "
                  f"{prog.batch}/{len(loader)}) from {out / resume.CHECKPOINT}", flush=True)
    elif fabric.is_global_zero:
        resume.record_start(out, asdict(cfg))
    fabric.barrier()
    every = cfg.checkpoint_every if cfg.checkpoint_every is not None else resume.auto_interval(prog.step_times)

    def checkpoint(epoch_state, t_epoch: float) -> None:
        t = time.perf_counter()
        prog.saved += 1  # counted in its own snapshot, so a resumed run goes on counting from it
        wall = prog.wall_before + t - t0
        snap = {**asdict(prog), "train_time": prog.train_time + t - t_epoch, "wall_before": wall}
        resume.save(fabric, out, {**objects, "progress": snap, "epoch_generator": epoch_state,
                                  "rng": resume.rng_states(), "config": asdict(cfg)}, prog.saved)
        prog.checkpoints.append(round(time.perf_counter() - t, 4))

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    proc = psutil.Process()
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
        epoch_gen = rng = None
        bar = tqdm(it, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not fabric.is_global_zero, initial=skip,
                   total=len(loader), mininterval=0.5 if sys.stderr.isatty() else 10, dynamic_ncols=True)
        t_epoch = t_step = time.perf_counter()
        for i, batch in enumerate(bar, start=skip):
            accumulating = (i + 1) % cfg.grad_accum != 0 and i + 1 != len(loader)
            with fabric.no_backward_sync(model, enabled=accumulating):
                logits = model(**batch_inputs(batch)).logits
                step_loss = loss(logits, batch["labels"], problem)
                fabric.backward(step_loss / cfg.grad_accum)
            prog.seen += len(batch["labels"]) * fabric.world_size
            prog.run_loss, prog.run_n = prog.run_loss + float(step_loss.detach()), prog.run_n + 1
            if accumulating:
                continue
            # error_if_nonfinite=False: 16-mixed's first steps overflow by design; the scaler skips them.
            fabric.clip_gradients(model, optimizer, max_norm=MAX_GRAD_NORM, error_if_nonfinite=False)
            t_opt = time.perf_counter()
            optimizer.step()
            if cuda:
                torch.cuda.synchronize()  # else this times the kernel launches only
            prog.opt_times.append(time.perf_counter() - t_opt)
            optimizer.zero_grad(set_to_none=True)
            sched.step()
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            prog.step_times.append(now - t_step)
            if not cuda:
                prog.rss_peak = max(prog.rss_peak, proc.memory_info().rss)
            prog.last_loss = prog.run_loss / prog.run_n
            prog.step, prog.epoch, prog.batch = prog.step + 1, epoch, i + 1
            bar.set_postfix(loss=f"{prog.last_loss:.4f}",
                            samples_s=f"{prog.seen / (prog.train_time + now - t_epoch):.1f}", refresh=False)
            if every is None:
                every = resume.auto_interval(prog.step_times)
            if cfg.train_budget and not prog.planned_steps and len(prog.step_times) >= BUDGET_STEPS:
                prog.planned_steps = plan["total"] = budget_steps(
                    cfg.train_budget, prog.step, prog.train_time + now - t_epoch, prog.step_times, full)
                if prog.planned_steps < full and fabric.is_global_zero:
                    print(f"\ntime budget {cfg.train_budget:g} min: training {prog.planned_steps} of {full} steps "
                          f"at {statistics.median(prog.step_times[1:]):.2f} s a step", flush=True)
            if every and prog.step % every == 0 and prog.step < plan["total"]:
                checkpoint(epoch_state, t_epoch)
            if prog.planned_steps and prog.step >= prog.planned_steps:
                break
            t_step = time.perf_counter()  # a checkpoint's write is not the next step's time
        bar.close()
        prog.train_time += time.perf_counter() - t_epoch
        prog.epoch, prog.batch = epoch + 1, 0
        val = evaluate(fabric, model, val_ex, cfg.batch_size * 2, pad_id, problem)
        prog.epoch_val.append(val.get("accuracy", val.get("mae")))
        if fabric.is_global_zero:
            log.info("epoch %d/%d: train loss %.4f, val %s (%d examples)", epoch + 1, cfg.epochs,
                     prog.last_loss, headline(val), val["n"])
    test = evaluate(fabric, model, test_ex, cfg.batch_size * 2, pad_id, problem)
    if not cuda:
        prog.rss_peak = max(prog.rss_peak, proc.memory_info().rss)
    opt_cls = type(getattr(optimizer, "optimizer", optimizer))  # Fabric wraps the optimizer
    opt_times = prog.opt_times
    opt = {"optimizer": f"{opt_cls.__module__.split('.')[0]}.{opt_cls.__name__}",
           "optimizer_state_bytes": optimizer_state_bytes(optimizer),
           "optimizer_step_median_s": round(statistics.median(opt_times[1:] or opt_times), 6) if opt_times else None,
           **resume.summary(prog), "precision": choice.precision, "precision_choice": choice.to_json()}
    if cfg.train_budget:
        opt["time_budget"] = {"minutes": cfg.train_budget, "steps": prog.step, "of_steps": full,
                              "examples": prog.seen, "of_examples": len(train_ex) * cfg.epochs,
                              "cut": prog.step < full}
    metrics = trainout.metrics(fabric, cfg, data, device, base_name, t0 - prog.wall_before, prog.train_time,
                       prog.step_times, prog.seen, prog.epoch_val, val, test, prog.last_loss, prog.rss_peak, opt)
    if fabric.is_global_zero:
        trainout.write(out, cfg, model.module, tok, base_name, data, metrics, split_seed(cfg), policy)
        log.info("wrote %s: val %s, test %s, %.1f s training", out, headline(val), headline(test), prog.train_time)
    fabric.barrier()
    return metrics if fabric.is_global_zero else None


# -- CLI ---------------------------------------------------------------------------------

def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="fine-tune a classifier (Lightning Fabric)",
                              description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, TrainConfig, [f.name for f in fields(TrainConfig) if f.name != "resume"])
    # three states (unset = resume if there is a run to resume), which a plain bool flag cannot say
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                   help=field_docs(TrainConfig)["resume"].replace("%", "%%"))
    add_flags(p, CompareOptions)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    compare = bool(getattr(args, "compare", False))
    precisions = args.precision or [TrainConfig.precision]
    if len(precisions) > 1 and not compare:
        raise QserveError(f"--precision was given {len(precisions)} times; give it once, or add --compare "
                          "to compare several")
    updates = getattr(args, "bf16_update", None) or [TrainConfig.bf16_update]
    if len(updates) > 1 and not compare:
        raise QserveError(f"--bf16-update was given {len(updates)} times; give it once, or add --compare "
                          "to compare several")
    # 0 = no cap: the command line has no other way to say None
    caps = {name: None for name in ("max_samples", "max_eval_samples") if getattr(args, name, None) == 0}
    return build(TrainConfig, args, overrides={"precision": precisions[0], "bf16_update": updates[0], **caps},
                 error=QserveError)


def run(args) -> int:
    """`qserve train`: one fine-tune. (`--compare` is the precision study, qserve.training.study, which runs this
    module in children: the composition root, qserve.cli, sends it there, so train never imports study.)"""
    if getattr(args, "compare", False):
        raise QserveError("--compare runs the precision study: use `qserve train --compare ...` "
                          "(`python -m qserve.training.train` runs one fine-tune)")
    cfg = config_from_args(args)
    m = train(cfg)
    if m is None:  # a DDP worker rank: rank 0 reports
        return 0
    metric = "mae" if "test_mae" in m else "accuracy"
    print(f"trained {m['model_name']} ({m['precision']}, {m['device']}): val {metric} {m[f'val_{metric}']:.4f}, "
          f"test {metric} {m[f'test_{metric}']:.4f}, {m['train_time_s']:.1f} s training")
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
