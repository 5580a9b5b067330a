"""What `auto` decides for a fine-tune on a GPU (the precision, the batch size with its learning rate, TF32), on
faked capabilities and faked probe measurements; the probe's own mechanics on a tiny model on this CPU; the
tensorized batches against the per-batch collate they replace; the pipeline's recipe per device; the seed's table.

    python -m pytest tests/unit/test_autotune.py -q
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from qserve.devices import Capabilities
from qserve.training import autotune
from qserve.training.autotune import (
    BASE_BATCH,
    BATCH_GAIN,
    MAX_BATCH,
    MIN_STEPS,
    Candidate,
    ProbeOOM,
    RunChoices,
    batch_ladder,
    candidates,
    decide,
    pick,
    run_ladder,
    scale_lr,
)
from qserve.training.config import TrainConfig
from qserve.training.precision import AUTO

H200 = Capabilities(
    cpu_model="x",
    cpu_flags=frozenset({"avx2"}),
    cuda=True,
    cuda_name="NVIDIA H200",
    cuda_bf16=True,
    cuda_capability=(9, 0),
)
T4 = Capabilities(
    cpu_model="x",
    cpu_flags=frozenset({"avx2"}),
    cuda=True,
    cuda_name="Tesla T4",
    cuda_bf16=False,
    cuda_capability=(7, 5),
)
GPU_RECIPE = 19_922  # the embedded IMDb's training split, all of it


class FakeGPU:
    """A launch-bound GPU: a step costs max(launch, batch x per-example) per candidate; out of memory from `oom_at`.
    Records every call, so a test can see what was measured, in which order."""

    def __init__(self, launch: dict[str, float], per_example: dict[str, float], oom_at: int | None = None):
        self.launch, self.per_example, self.oom_at, self.calls = launch, per_example, oom_at, []

    def step(self, c: Candidate, batch: int) -> float:
        return max(self.launch[c.label], batch * self.per_example[c.label])

    def warm(self, c: Candidate, batch: int) -> int:
        self.calls.append(("warm", c.label, batch))
        if self.oom_at is not None and batch >= self.oom_at:
            raise ProbeOOM("out of memory: CUDA out of memory. Tried to allocate 3.00 GiB")
        return batch * 10_000_000

    def time(self, c: Candidate, batch: int, steps: int) -> float:
        self.calls.append(("time", c.label, batch))
        return self.step(c, batch)


# The H200's shape at 128 tokens (issue 53): at batch 16 32-true+TF32 is ahead (launch-bound, fewer kernels);
# from batch 64 bf16-mixed's cheaper math wins.
H200_LIKE = dict(
    launch={"bf16-mixed": 0.0234, "32-true+tf32": 0.0172, "32-true": 0.0208},
    per_example={"bf16-mixed": 0.00014, "32-true+tf32": 0.00030, "32-true": 0.0006},
)


def fake_probe(gpu: FakeGPU, seen: list | None = None):
    def probe(cands, ladder):
        if seen is not None:
            seen.append(([c.label for c in cands], list(ladder)))
        return {"rows": run_ladder(gpu, cands, ladder), "max_length": 128, "wall_s": 1.5}

    return probe


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"device": "cuda", "epochs": 3, "max_length": 512, **kw})


# -- the rules ---------------------------------------------------------------------------------------------


def test_the_ladder_keeps_enough_optimizer_steps():
    assert batch_ladder(GPU_RECIPE, 3, 1) == [16, 32, 64, 128, 256]  # 3 epochs at 256: 234 steps
    assert batch_ladder(6000, 1, 1) == [16]  # the CPU cut on a GPU: 32 would leave 188 steps
    assert batch_ladder(8000, 1, 1) == [16, 32]  # 250 steps at 32, 125 at 64
    assert batch_ladder(10**7, 1, 1)[-1] == MAX_BATCH
    for n, e, a in ((GPU_RECIPE, 3, 1), (8000, 1, 1), (50_000, 2, 2)):
        assert all(autotune.optimizer_steps(n, b, e, a) >= MIN_STEPS for b in batch_ladder(n, e, a)[1:])


def test_the_learning_rate_scales_by_the_square_root_of_the_batch():
    assert scale_lr(1e-4, BASE_BATCH) == 1e-4  # the base batch keeps --lr exactly (the CPU's runs)
    assert scale_lr(1e-4, 64) == pytest.approx(2e-4) and scale_lr(1e-4, 256) == pytest.approx(4e-4)


@pytest.mark.parametrize(
    "caps, asked, matmul, want",
    [
        (H200, AUTO, None, ["bf16-mixed", "32-true+tf32"]),
        (T4, AUTO, None, ["16-mixed", "32-true"]),  # no bf16, no TF32 before Ampere
        (H200, AUTO, "highest", ["bf16-mixed (matmul highest)", "32-true (matmul highest)"]),  # obeyed: no TF32
        (H200, "32-true", None, ["32-true"]),  # --precision is obeyed: the only candidate, at torch's matmul default
        (H200, "bf16-true", None, ["bf16-true"]),
    ],
    ids=["h200", "t4", "matmul-given", "precision-given", "bf16-true-given"],
)
def test_candidates_follow_the_gpu_and_the_flags(caps, asked, matmul, want):
    assert [c.label for c in candidates(asked, matmul, caps)] == want


def test_the_ladder_climbs_while_doubling_pays_and_candidates_take_turns():
    gpu = FakeGPU(**H200_LIKE)
    cands = candidates(AUTO, None, H200)
    rows = run_ladder(gpu, cands, [16, 32, 64, 128, 256])
    timed = [c for c in gpu.calls if c[0] == "time"]
    assert timed[:4] == [("time", "bf16-mixed", 16), ("time", "32-true+tf32", 16)] * 2  # alternating rounds
    row, why = pick(rows, [16, 32, 64, 128, 256])
    assert (row["batch"], row["candidate"]) == (256, "bf16-mixed")
    b16 = {r["candidate"]: r for r in rows if r["batch"] == 16}
    assert b16["32-true+tf32"]["samples_per_s"] > b16["bf16-mixed"]["samples_per_s"]  # launch-bound: fp32 ahead
    assert "the top of the ladder" in why


def test_a_doubling_that_buys_too_little_is_not_taken_and_the_climb_stops():
    # bf16-mixed compute-bound from batch 40: 64 buys 1.25x over 32, 128 nothing
    gpu = FakeGPU(
        launch={"bf16-mixed": 0.004, "32-true+tf32": 0.004}, per_example={"bf16-mixed": 0.0001, "32-true+tf32": 0.0002}
    )
    rows = run_ladder(gpu, candidates(AUTO, None, H200), [16, 32, 64, 128, 256])
    row, why = pick(rows, [16, 32, 64, 128, 256])
    assert row["batch"] == 64 and row["candidate"] == "bf16-mixed"
    assert why == f"batch 128 measured 1.00x its samples/s, under the {BATCH_GAIN:.2f}x a doubling must buy"
    assert max(r["batch"] for r in rows) == 128  # measured one rung past, no further


def test_out_of_memory_ends_the_climb_and_names_why():
    gpu = FakeGPU(**H200_LIKE, oom_at=128)
    rows = run_ladder(gpu, candidates(AUTO, None, H200), [16, 32, 64, 128, 256])
    failed = [r for r in rows if "failed" in r]
    assert {r["batch"] for r in failed} == {128} and len(failed) == 2
    assert not [c for c in gpu.calls if c[2] == 256]
    row, why = pick(rows, [16, 32, 64, 128, 256])
    assert row["batch"] == 64 and why.startswith("batch 128 did not fit (out of memory")


def test_the_probe_budget_stops_the_climb():
    gpu = FakeGPU(**H200_LIKE)
    ticks = iter(range(100))
    rows = run_ladder(gpu, candidates(AUTO, None, H200), [16, 32, 64], budget_s=0.5, clock=lambda: next(ticks))
    assert {r["batch"] for r in rows} == {16}


# -- the decision ----------------------------------------------------------------------------------------------


def test_auto_on_a_gpu_takes_the_probes_fastest_with_the_lr_scaled():
    seen: list = []
    ch = decide(cfg(), "cuda", None, GPU_RECIPE, fake_probe(FakeGPU(**H200_LIKE), seen), H200)
    assert seen == [(["bf16-mixed", "32-true+tf32"], [16, 32, 64, 128, 256])]
    assert (ch.precision.precision, ch.precision.asked, ch.batch_size) == ("bf16-mixed", AUTO, 256)
    assert ch.lr == pytest.approx(4e-4) and ch.lr_asked == 1e-4 and ch.matmul_precision is None
    assert ch.precision.reason.startswith("measured fastest on this GPU (NVIDIA H200, sm_90): bf16-mixed ")
    assert "samples/s at batch 256, against 32-true+tf32 " in ch.precision.reason
    assert ch.batch_json()["asked"] == AUTO and "sqrt(256/16)" in ch.lr_rule
    text = "\n".join(ch.lines())
    assert "precision: bf16-mixed" in text and "batch size: 256" in text and "batch 16: bf16-mixed" in text


def test_where_32_true_with_tf32_is_fastest_it_trains_so():
    gpu = FakeGPU(
        launch={"bf16-mixed": 0.03, "32-true+tf32": 0.01}, per_example={"bf16-mixed": 0.0002, "32-true+tf32": 0.0002}
    )
    ch = decide(cfg(max_samples=6000, epochs=1), "cuda", None, 6000, fake_probe(gpu), H200)
    assert (ch.precision.precision, ch.matmul_precision, ch.batch_size, ch.lr) == ("32-true", "high", 16, 1e-4)
    assert "): 32-true+tf32 " in ch.precision.reason
    assert any("fp32 matmul precision: high (TF32)" in line for line in ch.lines())


def test_a_gpu_without_bf16_weighs_16_mixed():
    gpu = FakeGPU(launch={"16-mixed": 0.02, "32-true": 0.02}, per_example={"16-mixed": 0.0001, "32-true": 0.0004})
    ch = decide(cfg(), "cuda", None, GPU_RECIPE, fake_probe(gpu), T4)
    assert ch.precision.precision == "16-mixed" and ch.matmul_precision is None and "sm_75" in ch.precision.reason


def test_explicit_flags_are_obeyed():
    seen: list = []
    gpu = FakeGPU(**H200_LIKE)
    from qserve.training.precision import choose_precision

    # --batch-size: measured at that batch only (for the precision), never changed, --lr as given
    ch = decide(cfg(batch_size=32), "cuda", None, GPU_RECIPE, fake_probe(gpu, seen), H200)
    assert seen[-1][1] == [32] and (ch.batch_size, ch.lr, ch.batch_asked) == (32, 1e-4, 32)
    assert (
        ch.batch_reason == "given (--batch-size, or the pipeline's recipe for this device)"
        and ch.lr_rule.startswith("--lr as given")
    )
    # --precision: the only candidate; the batch is still measured
    explicit = choose_precision("32-true", "cuda", H200)
    ch = decide(cfg(precision="32-true"), "cuda", explicit, GPU_RECIPE, fake_probe(gpu, seen), H200)
    assert seen[-1][0] == ["32-true"] and ch.precision is explicit and ch.matmul_precision is None
    assert ch.batch_size > BASE_BATCH
    # both given: nothing to measure
    probe = fake_probe(gpu, seen)
    n = len(seen)
    ch = decide(
        cfg(precision="32-true", batch_size=24, matmul_precision="medium"), "cuda", explicit, GPU_RECIPE, probe, H200
    )
    assert len(seen) == n and (ch.batch_size, ch.lr, ch.matmul_precision, ch.probe) == (24, 1e-4, "medium", None)


def test_a_cpu_and_several_gpus_never_probe_and_keep_the_base_batch(cpu_flags):
    cpu_flags("avx2 fma")
    seen: list = []
    probe = fake_probe(FakeGPU(**H200_LIKE), seen)
    from qserve.training.precision import PrecisionChoice

    cpu_choice = PrecisionChoice("32-true", AUTO, "this CPU has no bf16 instructions: ...")
    ch = decide(TrainConfig(device="cpu"), "cpu", cpu_choice, 6000, probe)
    assert (ch.precision, ch.batch_size, ch.lr, ch.matmul_precision, ch.probe) == (cpu_choice, 16, 1e-4, None, None)
    assert ch.lines() == [cpu_choice.line]  # what the CPU always printed, nothing more
    ddp = decide(cfg(devices=2), "cuda", None, GPU_RECIPE, probe, H200)
    assert (ddp.precision.precision, ddp.batch_size) == ("bf16-mixed", 16) and "2 devices" in ddp.batch_reason
    assert seen == [] and not autotune.probes(cfg(devices=2), "cuda") and autotune.probes(cfg(), "cuda:1")


def test_nothing_fitting_falls_back_to_the_base_batch_and_says_so():
    ch = decide(cfg(), "cuda", None, GPU_RECIPE, fake_probe(FakeGPU(**H200_LIKE, oom_at=1)), H200)
    assert (ch.precision.precision, ch.batch_size, ch.lr) == ("bf16-mixed", 16, 1e-4)
    assert "fitted no candidate" in ch.precision.reason and "fitted no candidate" in ch.batch_reason


def test_the_choices_round_trip_through_json_for_a_resume():
    ch = decide(cfg(), "cuda", None, GPU_RECIPE, fake_probe(FakeGPU(**H200_LIKE)), H200)
    back = RunChoices.from_json(json.loads(json.dumps(ch.to_json())))
    assert back == ch


def test_resume_plan_hands_back_what_the_run_started_with(tmp_path):
    from dataclasses import asdict

    from qserve.training.resume import CHECKPOINT, STARTED, plan, record_start

    ch = decide(cfg(), "cuda", None, GPU_RECIPE, fake_probe(FakeGPU(**H200_LIKE)), H200)
    c, defaults = asdict(cfg(out=str(tmp_path))), asdict(TrainConfig())
    record_start(tmp_path, c, ch.to_json())
    (tmp_path / CHECKPOINT).write_bytes(b"x")
    todo = plan(tmp_path, c, defaults, None, False)
    assert todo.action == "resume" and RunChoices.from_json(todo.decided) == ch
    old = json.loads((tmp_path / STARTED).read_text())  # a run started before choices were recorded
    old.pop("auto_decided")
    (tmp_path / STARTED).write_text(json.dumps({**old, "batch_size": 16}))
    with pytest.raises(Exception, match=r"--batch-size 16 recorded, None now"):
        plan(tmp_path, c, defaults, None, False)  # its default batch was 16: --batch-size 16 resumes it
    assert plan(tmp_path, {**c, "batch_size": 16}, defaults, None, False).decided is None


# -- the probe's mechanics, on this CPU ---------------------------------------------------------------------------


def test_the_step_timer_trains_real_steps_of_a_private_copy(tiny_checkpoint):
    import torch

    from qserve.modeling import load_for_training

    ref = load_for_training(str(tiny_checkpoint), ["negative", "positive"])[0]
    before = {k: v.clone() for k, v in ref.state_dict().items()}
    probe = autotune.probe_cuda(
        lambda: load_for_training(str(tiny_checkpoint), ["negative", "positive"])[0],
        "cpu",
        32,
        "single_label_classification",
        2,
        1e-3,
    )
    matmul = torch.get_float32_matmul_precision()
    record = probe([Candidate("32-true", "high"), Candidate("bf16-mixed")], [4, 8])
    assert torch.get_float32_matmul_precision() == matmul  # put back as it was
    rows = record["rows"]
    assert {(r["batch"], r["candidate"]) for r in rows if "step_s" in r} <= {
        (4, "32-true+tf32"),
        (4, "bf16-mixed"),
        (8, "32-true+tf32"),
        (8, "bf16-mixed"),
    }
    assert all(r["step_s"] > 0 and r["peak_memory_bytes"] is None for r in rows)  # CPU: no CUDA memory to read
    assert record["max_length"] == 32 and record["candidates"] == ["32-true+tf32", "bf16-mixed"]
    assert all(torch.equal(v, before[k]) for k, v in ref.state_dict().items())  # the run's own model untouched


def test_the_probe_refuses_a_length_past_the_models_positions(tiny_checkpoint):
    from qserve import QserveError
    from qserve.modeling import load_for_training

    model = load_for_training(str(tiny_checkpoint), ["a", "b"])[0]
    limit = model.config.max_position_embeddings
    probe = autotune.probe_cuda(lambda: model, "cpu", limit + 1, "single_label_classification", 2, 1e-3)
    with pytest.raises(QserveError, match=f"--max-length {limit + 1} exceeds the model's {limit} positions"):
        probe([Candidate("32-true")], [4])


def test_fused_adamw_where_asked_and_optimi_for_compensated_bf16_true():
    import torch

    from qserve.training.precision import build_optimizer

    net = torch.nn.Linear(4, 2)
    opt = build_optimizer([{"params": list(net.parameters())}], "bf16-mixed", "compensated", 1e-3, fused=True)
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    net(torch.randn(3, 4)).sum().backward()
    opt.step()  # torch's fused kernel has a CPU implementation too
    assert not build_optimizer([{"params": list(net.parameters())}], "32-true", "compensated", 1e-3).defaults["fused"]
    bf16 = torch.nn.Linear(4, 2).to(torch.bfloat16)
    assert type(
        build_optimizer([{"params": list(bf16.parameters())}], "bf16-true", "compensated", 1e-3, fused=True)
    ).__module__.startswith("optimi")


# -- batches --------------------------------------------------------------------------------------------------


def _pad_collate_before(pad_id: int, batch: list[tuple]) -> dict:
    """The per-batch collate TokenTable replaced (qserve before #53), verbatim: the reference its batches must equal."""
    import torch

    width = max(len(ex[0]) for ex in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, ex in enumerate(batch):
        input_ids[i, : len(ex[0])] = torch.tensor(ex[0], dtype=torch.long)
        mask[i, : len(ex[0])] = 1
    out = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "labels": torch.tensor(
            [ex[1] for ex in batch], dtype=torch.long if isinstance(batch[0][1], int) else torch.float32
        ),
    }
    if len(batch[0]) > 2:
        types = torch.zeros_like(input_ids)
        for i, ex in enumerate(batch):
            types[i, : len(ex[2])] = torch.tensor(ex[2], dtype=torch.long)
        out["token_type_ids"] = types
    return out


def _examples(kind: str, n: int = 53) -> list[tuple]:
    rng = random.Random(kind)
    out = []
    for _ in range(n):
        ids = [101] + [rng.randrange(1000, 30000) for _ in range(rng.randrange(0, 40))] + [102]
        target = {
            "single": rng.randrange(3),
            "multi": [float(rng.random() < 0.5) for _ in range(4)],
            "regression": [rng.uniform(-2, 2)],
            "pair": rng.randrange(2),
        }[kind]
        if kind == "pair":
            cut = rng.randrange(1, len(ids))
            out.append((ids, target, [0] * cut + [1] * (len(ids) - cut)))
        else:
            out.append((ids, target))
    return out


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", ["single", "multi", "regression", "pair"])
def test_token_table_batches_equal_the_per_batch_collate(kind):
    import torch

    from qserve.training.batches import TokenTable

    ex = _examples(kind)
    table = TokenTable(ex, pad_id=7)
    rng = random.Random(0)
    for size in (1, 5, 16, len(ex)):
        idx = rng.sample(range(len(ex)), size)
        assert _same(table.batch(idx), _pad_collate_before(7, [ex[i] for i in idx]))
    # an epoch through a DataLoader with the run's seeded shuffling: the same batches, in the same order
    old = torch.utils.data.DataLoader(
        ex,
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(42),
        collate_fn=lambda b: _pad_collate_before(7, b),
    )
    new = torch.utils.data.DataLoader(
        table, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(42), collate_fn=table
    )
    pairs = list(zip(old, new, strict=True))
    assert len(pairs) == 4 and all(_same(a, b) for a, b in pairs)


# -- the pipeline's recipe and what the report says of it -----------------------------------------------------------


def test_the_pipeline_trains_the_seeds_recipe_on_a_gpu_and_the_cpu_cut_elsewhere():
    from qserve.cli import build_parser
    from qserve.pipeline import PIPELINE_TRAIN, PIPELINE_TRAIN_GPU, recipe_values, train_recipe

    cpu, why = train_recipe("cpu")
    assert cpu == PIPELINE_TRAIN == {"max_samples": 6000, "max_length": 128, "epochs": 1, "batch_size": 16, "lr": 1e-4}
    assert "CPU cut" in why
    gpu, why = train_recipe("cuda:0")
    assert gpu == PIPELINE_TRAIN_GPU and (gpu["max_samples"], gpu["epochs"], gpu["max_length"]) == (None, 3, 512)
    assert gpu["batch_size"] is None and "seed's recipe" in why
    args = build_parser().parse_args(["pipeline"])
    assert [getattr(args, k) for k in ("max_samples", "max_length", "epochs", "batch_size")] == [None] * 4
    assert recipe_values(args, "cpu")[0] == PIPELINE_TRAIN and recipe_values(args, "cpu")[2] == []
    assert recipe_values(args, "cuda")[0] == PIPELINE_TRAIN_GPU
    # a flag given replaces the recipe's value on either device; --max-samples 0 is all
    args = build_parser().parse_args(["pipeline", "--max-samples", "0", "--epochs", "2", "--batch-size", "16"])
    values, _, given = recipe_values(args, "cpu")
    assert (values["max_samples"], values["epochs"], values["batch_size"], given) == (
        None,
        2,
        16,
        ["epochs", "max_samples"],
    )
    values, _, given = recipe_values(args, "cuda")
    assert (values["max_length"], values["batch_size"], given) == (512, 16, ["batch_size", "epochs", "max_samples"])


def test_the_report_says_the_recipe_the_batch_and_the_probe():
    from qserve.bench.pipelinerecord import _choice_lines

    ch = decide(cfg(), "cuda", None, GPU_RECIPE, fake_probe(FakeGPU(**H200_LIKE, oom_at=256)), H200)
    training = {
        "precision": ch.precision.precision,
        "precision_choice": ch.precision.to_json(),
        "batch_choice": {**ch.batch_json(), "warmup_steps": 46, "planned_steps": 468},
        "cuda_probe": ch.probe,
        "samples_per_s": 1500.0,
        "tokens_per_s": {"at_max_length": 768000.0, "padded": 700000.0, "real": 350000.0},
    }
    recipe = {"why": "the seed's recipe on a GPU", "given": [], "max_samples": None, "epochs": 3, "max_length": 512}
    text = "\n".join(_choice_lines({"machine": "cuda", "training": training, "recipe": recipe}))
    assert "- Training recipe: all training examples, 3 epoch(s), up to 512 tokens: the seed's recipe on a GPU." in text
    assert "- Batch size **128** (asked: `auto`)" in text and "warm-up 46 of 468 steps" in text
    assert "batch 256 did not fit" in text and "| 256 | bf16-mixed | did not fit: out of memory" in text
    assert "1,500 samples/s; tokens/s 768,000 at max length, 700,000 padded, 350,000 real" in text


# -- the seed's table ---------------------------------------------------------------------------------------------


def test_the_seed_table_renders_its_ratios_from_the_one_source():
    from qserve.training.study import SEED, seed_rows, seed_table

    table = seed_table()
    assert "| 32-true | 21.75 | 1.00x | 5.37 | 1.00x | 89.92% |" in table
    assert "| bf16-mixed | 7.45 | 0.34x | 4.46 | 0.83x | 92.61% |" in table
    assert "| 32-true (TF32) | 8.11 | 0.37x |" in table and "diverged" in table
    assert len(table.splitlines()) == 2 + len(SEED["runs"])

    def run(label, precision, t, mem, acc, update="compensated", matmul=None, noise=False):
        return {
            "label": label,
            "precision": precision,
            "bf16_update": update,
            "matmul_precision": matmul,
            "ok": True,
            "noise": noise,
            "train_time_s": t,
            "peak_memory_bytes": mem,
            "test_accuracy": acc,
        }

    study = {
        "config": {"matmul_precision": None},
        "runs": [
            run("32-true", "32-true", 600, 4e9, 0.90),
            run("32-true (TF32)", "32-true", 300, 4e9, 0.91, matmul="high"),
            run("bf16-mixed", "bf16-mixed", 200, 3e9, 0.92),
            run("bf16-true (plain)", "bf16-true", 150, 2e9, 0.92, "plain"),
            run("bf16-mixed, seed 43", "bf16-mixed", 999, 3e9, 0.5, noise=True),
        ],
    }
    rows = {r[0]: r for r in seed_rows(study)}
    # ours beside theirs, each as a ratio to its own 32-true; the noise run is not a row
    assert rows["bf16-mixed"][1:] == [
        "3.33",
        "0.33x",
        "3.00",
        "0.75x",
        "92.00%",
        "7.45",
        "0.34x",
        "4.46",
        "0.83x",
        "92.61%",
    ]
    assert rows["32-true (TF32)"][2] == "0.50x" and rows["32-true (TF32)"][7] == "0.37x"
    assert rows["bf16-true (plain)"][6] == "5.22"  # the seed's bf16-true ran plain Adam on bf16 weights
    assert rows["16-true (seed only)"][1:6] == ["—"] * 5 and "bf16-mixed, seed 43" not in rows
    assert "16-mixed (TF32) (seed only)" in rows and "64-true (seed only)" in rows


def test_the_study_on_a_gpu_adds_32_true_with_tf32_and_fixes_one_batch(monkeypatch):
    from qserve.training import study

    monkeypatch.setattr(
        study, "supported_precisions", lambda device: ["32-true", "16-mixed", "bf16-mixed", "bf16-true"]
    )
    runs = study.plan(TrainConfig(device="cuda"), None, "cuda", ["compensated"], "none")
    assert [study.label(r) for r in runs] == [
        "32-true",
        "32-true (TF32)",
        "16-mixed",
        "bf16-mixed",
        "bf16-true (compensated)",
    ]
    assert [
        study.label(r) for r in study.plan(TrainConfig(matmul_precision="highest"), ["32-true"], "cuda", None, "none")
    ] == ["32-true"]
    cpu = study.plan(TrainConfig(), ["32-true"], "cpu", None, "none")
    assert [study.label(r) for r in cpu] == ["32-true"]
    argv = study.child_argv(
        replace(TrainConfig(), batch_size=BASE_BATCH, matmul_precision="high"),
        "32-true",
        __import__("pathlib").Path("/tmp/o"),
    )
    assert argv[argv.index("--batch-size") + 1] == "16" and argv[argv.index("--matmul-precision") + 1] == "high"
