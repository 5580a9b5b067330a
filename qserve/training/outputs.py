"""What a finished `qserve train` writes: train_metrics.json's content and the checkpoint directory.

    python -c "from qserve.training.outputs import pair_inputs; help(pair_inputs)"

train.py's loop hands its results here; the checkpoint is written through files.staged_dir (a temp dir
renamed into place), so a reader never sees half of one.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from qserve.artifact import MODEL_META, ModelMeta
from qserve.devices import cpu_info
from qserve.files import now_iso, staged_dir, write_json_atomic
from qserve.problemtypes import REGRESSION, value_range
from qserve.textpairs import PAIR
from qserve.training.precision import peak_memory
from qserve.training.resume import Progress
from qserve.variants import library_versions


def metrics(fabric, cfg, data, device, base_name, t0, prog: Progress, val, test, opt) -> dict[str, Any]:
    """train_metrics.json of a run that started at t0 in this process (its earlier processes' seconds in `prog`)."""
    train_time, step_times, seen = prog.train_time, prog.step_times, prog.seen
    hw: dict[str, Any] = {"cpu": cpu_info()}
    if device.startswith("cuda"):
        import torch

        hw["gpu"] = torch.cuda.get_device_name(fabric.device)
    timed = step_times[1:] if len(step_times) > 1 else step_times  # the first step pays one-off warm-up
    samples_per_s = seen / train_time if train_time else None
    tokens = opt.get("tokens") or {}
    # x max_length: an upper bound on the work; padded: what the model computed; real: the texts' own tokens
    rates = {
        "at_max_length": round(samples_per_s * cfg.max_length, 1) if samples_per_s else None,
        **{k: round(tokens[k] / train_time, 1) if train_time and k in tokens else None for k in ("padded", "real")},
    }
    return {
        "model_name": f"{base_name}-{data.info['short_name']}",
        "base_model": base_name,
        "dataset": data.name,
        "bf16_update": cfg.bf16_update if opt["precision"] == "bf16-true" else None,
        **opt,
        "device": device,
        "world_size": fabric.world_size,
        **hw,
        "wall_time_s": round(time.perf_counter() - t0 + prog.wall_before, 3),
        "train_time_s": round(train_time, 3),
        "optimizer_steps": len(step_times),
        "step_time_median_s": round(statistics.median(timed), 6) if timed else None,
        "samples_per_s": round(samples_per_s, 3) if samples_per_s else None,
        "tokens_per_s": rates,
        **peak_memory(device, prog.rss_peak),
        "train_loss_last_epoch": round(prog.last_loss, 6),
        "problem_type": data.problem_type,
        # val_/test_ accuracy (+ label_accuracy for multi-label), or mae and rmse (regression), and loss
        **{f"{part}_{k}": v for part, m in (("val", val), ("test", test)) for k, v in m.items() if k != "n"},
        f"val_{'mae' if 'mae' in val else 'accuracy'}_per_epoch": prog.epoch_val,
        "sizes": data.info["sizes"],
        "dataset_info": {k: v for k, v in data.info.items() if k != "sizes"},
        "config": asdict(cfg),
        "versions": library_versions(),
        "created": now_iso(),
    }


def write(out: Path, cfg, model, tok, base_name: str, data, metrics: dict[str, Any], seed: int, policy: str) -> None:
    """The finished checkpoint dir, staged and renamed over `out` (which holds only this run's resume files)."""
    import torch

    # force: out holds only this run's own checkpoint by now (resume.plan refused anyone else's files)
    with staged_dir(out, force=True) as tmp:
        # fp32 on disk whatever the training precision: every variant derives from this one reference
        model = model.to(device="cpu", dtype=torch.float32)
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        ModelMeta(
            model_name=metrics["model_name"],
            base_model=base_name,
            dataset=data.name,
            seed=seed,
            max_length=cfg.max_length,
            long_text=policy,
            max_eval_samples=cfg.max_eval_samples,
            labels=tuple(data.labels),
            problem_type=data.problem_type,
            label_range=value_range(data.train.labels) if data.problem_type == REGRESSION else None,
            inputs=pair_inputs(data),
        ).write(tmp / MODEL_META)
        write_json_atomic(tmp / "train_metrics.json", metrics)


def pair_inputs(data) -> tuple[str, ...] | None:
    """`inputs` for qserve_model.json: recorded only for a model trained on text pairs (absent = one text)."""
    return PAIR if data.train.pairs is not None else None
