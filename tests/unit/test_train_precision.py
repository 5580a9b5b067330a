"""qserve train's precisions, flags and the precision study's plan and report (no training run here:
the runs themselves are in tests/integration/test_train.py).

    python -m pytest tests/unit/test_train_precision.py -q
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from qserve import QserveError
from qserve.configflags import field_docs
from qserve.training.config import TrainConfig
from qserve.training.train import config_from_args


def _drift_error(update: str, steps: int = 100, lr: float = 1e-4) -> float:
    """How far bf16 weights trained with `update` end from fp32 AdamW's, relative to how far those moved.

    lr 1e-4 against weights of ~0.1-0.5: an AdamW step (~lr) is below half a bf16 ulp
    (2^-9 relative, 2e-4 to 1e-3 here), so a plain bf16 update rounds away.
    """
    import copy

    import torch

    from qserve.training.precision import build_optimizer

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    net = copy.deepcopy(ref).to(torch.bfloat16)
    x = torch.randn(64, 32)
    y = x[:, :1] * 0.5 - x[:, 1:2]
    start = torch.cat([p.detach().flatten() for p in ref.parameters()])
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr)
    opt = build_optimizer([{"params": list(net.parameters()), "weight_decay": 0.01}], "bf16-true", update, lr)
    for _ in range(steps):
        for model, o, inp in ((ref, ref_opt, x), (net, opt, x.bfloat16())):
            torch.nn.functional.mse_loss(model(inp).float(), y).backward()
            o.step()
            o.zero_grad()
    end_ref = torch.cat([p.detach().flatten() for p in ref.parameters()])
    end = torch.cat([p.detach().float().flatten() for p in net.parameters()])
    return float((end - end_ref).norm() / (end_ref - start).norm())


@pytest.mark.parametrize(
    "update",
    [
        "compensated",
        pytest.param(
            "plain",
            marks=pytest.mark.xfail(
                strict=True, reason="plain bf16 updates below half an ulp round away: the weights stay behind fp32's"
            ),
        ),
    ],
)
def test_bf16_true_updates_land_where_fp32_adamw_goes(update):
    assert _drift_error(update) < 0.1


def test_bf16_on_cpu_without_native_support_warns_and_names_what_auto_would_choose(cpu_flags, caplog):
    from qserve.training.precision import check_precision

    cpu_flags("avx2 fma")
    with caplog.at_level(logging.WARNING, logger="qserve.training.precision"):
        check_precision("bf16-mixed", "cpu")
    assert "emulated and slow" in caplog.text and "--precision auto chooses 32-true here" in caplog.text
    caplog.clear()
    check_precision("32-true", "cpu")
    cpu_flags("avx2 avx512f avx512_bf16")
    check_precision("bf16-mixed", "cpu")
    assert caplog.text == ""


# -- CLI -----------------------------------------------------------------------------------


def parse(argv):
    import argparse

    from qserve.training.train import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


def test_every_config_field_has_help_and_a_flag():
    docs = field_docs(TrainConfig)
    assert set(docs) == {f.name for f in fields(TrainConfig)}
    args = parse([])
    assert config_from_args(args) == TrainConfig()


def test_cli_flags_map_to_config():
    args = parse(
        [
            "--model",
            "m",
            "--dataset",
            "d.csv",
            "--precision",
            "bf16-true",
            "--epochs",
            "3",
            "--batch-size",
            "8",
            "--lr",
            "2e-5",
            "--grad-accum",
            "2",
            "--max-length",
            "256",
            "--max-samples",
            "0",
            "--max-eval-samples",
            "500",
            "--seed",
            "1",
            "--out",
            "o",
            "--device",
            "cpu",
            "--devices",
            "2",
            "--strategy",
            "ddp",
            "--matmul-precision",
            "high",
            "--force",
            "--bf16-update",
            "plain",
            "--data-seed",
            "7",
        ]
    )
    cfg = config_from_args(args)
    assert cfg == TrainConfig(
        model="m",
        dataset="d.csv",
        precision="bf16-true",
        epochs=3,
        batch_size=8,
        lr=2e-5,
        grad_accum=2,
        max_length=256,
        max_samples=None,
        max_eval_samples=500,
        seed=1,
        out="o",
        device="cpu",
        devices=2,
        strategy="ddp",
        matmul_precision="high",
        force=True,
        bf16_update="plain",
        data_seed=7,
    )


def test_cli_rejects_bad_precision_and_repeats_without_compare(capsys):
    with pytest.raises(SystemExit):
        parse(["--precision", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    with pytest.raises(QserveError, match="--precision was given 2 times.*--compare"):
        config_from_args(parse(["--precision", "32-true", "--precision", "bf16-mixed"]))
    with pytest.raises(SystemExit):
        parse(["--bf16-update", "fp32"])
    assert "invalid choice: 'fp32'" in capsys.readouterr().err
    with pytest.raises(QserveError, match="--bf16-update was given 2 times.*--compare"):
        config_from_args(parse(["--bf16-update", "plain", "--bf16-update", "compensated"]))


def test_child_argv_round_trips_the_config():
    from qserve.training.study import child_argv

    cfg = TrainConfig(
        model="m",
        dataset="x.csv",
        epochs=2,
        lr=3e-5,
        max_samples=None,
        max_eval_samples=None,
        matmul_precision="medium",
        force=True,
        bf16_update="plain",
        data_seed=3,
    )
    argv = child_argv(cfg, "bf16-true", Path("/tmp/o"))
    assert argv[1:3] == ["-m", "qserve.training.train"]
    back = config_from_args(parse(argv[3:]))
    assert back == TrainConfig(**{**cfg.__dict__, "precision": "bf16-true", "out": "/tmp/o", "force": False})


def test_import_stays_light():
    code = (
        "import sys, qserve.training.train, qserve.training.study, qserve.data.datasets, qserve.modeling; "
        "heavy = [m for m in ('torch', 'transformers', 'lightning_fabric') if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- precision study --------------------------------------------------------------------


def test_study_refuses_16_mixed_on_cpu(tmp_path):
    from qserve.training.study import compare

    with pytest.raises(QserveError, match="16-mixed is not supported on cpu"):
        compare(TrainConfig(device="cpu"), ["16-mixed"], tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_train_compare_is_dispatched_to_the_study_by_the_composition_root(tmp_path, capsys):
    """qserve.training.train never imports qserve.training.study (the study runs train in children); qserve.cli routes
    `train --compare` to it, and `python -m qserve.training.train --compare` says where the study lives."""
    from qserve import cli
    from qserve.training import train as train_module

    out = tmp_path / "study"
    assert cli.main(["train", "--compare", "--precision", "16-mixed", "--device", "cpu", "--out", str(out)]) == 2
    assert "16-mixed is not supported on cpu" in capsys.readouterr().err  # the study's own refusal
    assert not out.exists()
    assert train_module.main(["--compare"]) == 2
    assert "use `qserve train --compare" in capsys.readouterr().err


def test_study_plan_runs_bf16_true_per_update_and_one_noise_seed_on_the_same_split(cpu_flags):
    from qserve.training.study import plan

    cpu_flags("avx2 avx512f avx512_bf16")  # the noise run is auto's choice: bf16-mixed where bf16 is native
    runs = plan(TrainConfig(seed=5), None, "cpu", None, None)
    assert [(r["precision"], r["bf16_update"], r["seed"], r["noise"]) for r in runs] == [
        ("32-true", "compensated", 5, False),
        ("bf16-mixed", "compensated", 5, False),
        ("bf16-true", "compensated", 5, False),
        ("bf16-true", "plain", 5, False),
        ("bf16-mixed", "compensated", 6, True),
    ]
    assert runs[-1]["data_seed"] == 5  # another seed for init, order and dropout; the same data
    runs = plan(TrainConfig(), ["bf16-true"], "cpu", ["plain"], "bf16-true")
    assert [(r["bf16_update"], r["noise"]) for r in runs] == [("plain", False), ("plain", True)]
    assert len(plan(TrainConfig(), ["32-true"], "cpu", None, "none")) == 1
    with pytest.raises(QserveError, match="--noise-precision bf16-mixed is not among the precisions studied"):
        plan(TrainConfig(), ["32-true"], "cpu", None, "bf16-mixed")
    with pytest.raises(QserveError, match="--bf16-update must be one of compensated, plain"):
        plan(TrainConfig(), None, "cpu", ["kahan"], None)


def test_study_summary_compares_gaps_with_the_two_seed_noise():
    from qserve.training.study import render_markdown, summarize

    def run(label, precision, acc, update="compensated", seed=42, noise=False):
        return {
            "label": label,
            "precision": precision,
            "bf16_update": update,
            "seed": seed,
            "noise": noise,
            "ok": True,
            "test_accuracy": acc,
            "step_time_median_s": 1.0 if precision == "32-true" else 0.5,
        }

    runs = [
        run("32-true", "32-true", 0.830),
        run("bf16-mixed", "bf16-mixed", 0.828),
        run("bf16-true (compensated)", "bf16-true", 0.826),
        run("bf16-true (plain)", "bf16-true", 0.78, "plain"),
        run("bf16-mixed, seed 43", "bf16-mixed", 0.824, seed=43, noise=True),
    ]
    s = summarize(runs)
    assert s["noise"]["test_accuracy_abs_diff"] == pytest.approx(0.004)
    assert {k: v["exceeds_noise"] for k, v in s["gaps_to_bf16_mixed"].items()} == {
        "32-true": False,
        "bf16-true (compensated)": False,
        "bf16-true (plain)": True,
    }
    assert s["gaps_to_bf16_mixed"]["bf16-true (plain)"]["test_accuracy_minus_bf16_mixed"] == pytest.approx(-0.048)
    assert runs[2]["step_time_vs_32_true"] == 0.5 and s["bf16_mixed_over_32_true_step_time"] == 0.5
    assert "| bf16-true (plain) | -4.80 | yes |" in render_markdown(
        {
            "config": {
                "model": "m",
                "dataset": "d",
                "epochs": 1,
                "batch_size": 16,
                "max_length": 128,
                "lr": 1e-4,
                "seed": 42,
            },
            "runs": [{**r, "ok": False, "exit_code": 1} for r in runs],
            "device": "cpu",
            "cpu": {"model": "x", "cores": 2, "flags": []},
            "reference": {"setup": "s", "runs": {}},
            **s,
        }
    )


def test_interleaved_step_rounds_are_compared_round_by_round():
    from qserve.training.study import render_markdown, summarize

    def run(label, precision, rounds, update="compensated"):
        return {
            "label": label,
            "precision": precision,
            "bf16_update": update,
            "seed": 42,
            "noise": False,
            "ok": True,
            "test_accuracy": 0.8,
            "val_accuracy": 0.8,
            "step_time_median_s": 1.0,
            "step_rounds_s": rounds,
            "sizes": {},
            "model_name": "m",
            "train_time_s": 60.0,
            "peak_memory_bytes": 1e9,
            "peak_memory_kind": "RSS",
        }

    runs = [
        run("32-true", "32-true", [1.2, 1.6, 1.5]),
        run("bf16-mixed", "bf16-mixed", [0.8, 1.1, 1.0]),
        run("bf16-true (compensated)", "bf16-true", [0.88, 1.0, None]),
    ]  # a failed short child: None
    s = summarize(runs)
    assert runs[2]["step_interleaved_s"] == pytest.approx(0.94)  # median of the rounds it finished
    assert runs[2]["step_round_ratios_vs_bf16_mixed"] == [1.1, 0.909]
    assert s["bf16_true_over_bf16_mixed_step_round_ratio_median"] == pytest.approx(1.0045, abs=1e-3)
    assert runs[0]["step_interleaved_vs_32_true"] == 1.0 and runs[1]["step_interleaved_vs_32_true"] == 0.667
    md = render_markdown(
        {
            "config": {
                "model": "m",
                "dataset": "d",
                "epochs": 1,
                "batch_size": 16,
                "max_length": 128,
                "lr": 1e-4,
                "seed": 42,
            },
            "runs": runs,
            "device": "cpu",
            "step_rounds": {"rounds": 3, "samples": 768},
            "cpu": {"model": "x", "cores": 2, "flags": []},
            "reference": {"setup": "s", "runs": {}},
            **s,
        }
    )
    assert "| bf16-true (compensated) | 0.8800, 1.0000, — | 0.9400 |" in md and "1.100, 0.909 (1.005x)" in md
