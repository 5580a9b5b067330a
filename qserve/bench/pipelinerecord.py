"""What the `qserve pipeline` run behind a bench report did and chose (gate, choices, stage times): report.md's end.

    python -c "from qserve.benchreport import load_report; from qserve.bench.pipelinerecord import md_lines; \\
print('\\n'.join(md_lines(load_report('benchmarks/reports/pipeline-auto-zen4')[0])))"
"""

from __future__ import annotations

from typing import Any

from qserve.bench.mdtable import blocks, cell, md_table


def md_lines(report: dict[str, Any]) -> list[str]:
    """The release gate, the training and this machine's choices, the stage times; nothing for a plain bench run."""
    return _gate_lines(report) + _stage_lines(report)


def _gate_lines(report: dict[str, Any]) -> list[str]:
    """The pipeline's release gate (report["gate"], written by qserve/pipeline.py): its candidates' verdicts."""
    g = report.get("gate")
    if not g:
        return []
    d, rows, skipped = g.get("data") or {}, g.get("rows") or [], g.get("not_gated")
    head, none = list(rows[0]) if rows else [], f"No variant was gated: {g.get('why', 'no candidate')}."
    return blocks(
        "## Release gate",
        "The pipeline gated the variants that meet their agreement bar here, fastest first, until two passed (the "
        f"recommendation and its runner-up; at most {g.get('max_candidates', '?')}): each against "
        f"{report.get('agreement_reference') or 'fp32'} on "
        f"the {d.get('n', '?')} test texts this bench scored (`{d.get('dataset', '?')}`, fingerprint "
        f"`{str(d.get('fingerprint', ''))[:12]}`), passing on agreement's 95% lower bound; calibration fitted on "
        f"held-out validation texts. Only a gated variant (or the reference) can be recommended. Full report: "
        f"`{g.get('dir', 'gate')}/gate.md`.",
        md_table(head, [[r[h] for h in head] for r in rows]) if rows else none,
        *([f"Not gated (two faster candidates passed first): {', '.join(skipped)}."] if skipped else []),
    )


def _stage_lines(report: dict[str, Any]) -> list[str]:
    """The stage times of the `qserve pipeline` run that wrote this report (bench/stages.py)."""
    st = (report.get("pipeline") or {}).get("stage_s") or {}
    if not st:
        return []
    rows = [[k, f"{st[k]:,.0f}", f"{st[k] / 60:.1f}"] for k in st]  # in stages.STAGES order, as recorded
    return _choice_lines(report["pipeline"]) + blocks(
        "## Pipeline stages",
        "Wall time of each stage of the `qserve pipeline` run that wrote this report "
        "(a stage that reused its finished outputs takes seconds).",
        md_table(["stage", "seconds", "minutes"], rows),
    )


def _choice_lines(pipe: dict[str, Any]) -> list[str]:
    """What the pipeline chose for the machine it ran on: the training precision and why, what was trained on
    (a time budget may cut the recipe), and the variants it skipped and why."""
    training, skipped = pipe.get("training") or {}, pipe.get("skipped") or {}
    if not training and not skipped and not pipe.get("machine"):
        return []
    out = ["## Training and this machine's choices", ""]
    if pipe.get("machine"):
        out.append(f"- Machine: {pipe['machine']}.")
    plan = pipe.get("plan") or {}
    moved = [p for p in plan.get("placements") or [] if p.get("device") and p["device"] != plan.get("device")]
    if moved:  # decided before training (qserve.placement); the tables mark these variants with their device
        out.append(
            f"- Run on {plan['device']}, except: "
            + "; ".join(
                f"**{p['variant']}** on the {p['device']}" + (f" ({p['why']})" if p.get("why") else "") for p in moved
            )
            + "."
        )
    choice = training.get("precision_choice") or {}
    if training.get("precision"):
        why = choice.get("reason") or "recorded before qserve recorded why"
        asked = f" (asked: `{choice['asked']}`)" if choice.get("asked") else ""
        out.append(f"- Training precision: **{training['precision']}**{asked}: {why}.")
    out += _recipe_lines(pipe.get("recipe") or {}, training)
    budget, sizes = training.get("time_budget") or {}, training.get("sizes") or {}
    if budget:
        cut = (
            f"cut to **{budget['steps']} of {budget['of_steps']} optimizer steps ({budget['examples']:,} of "
            f"{budget['of_examples']:,} training examples)**"
            if budget.get("cut")
            else f"the full recipe fit ({budget['steps']} steps, {budget['examples']:,} examples)"
        )
        step = training.get("step_time_median_s")
        out.append(f"- Time budget {budget['minutes']:g} min of optimizer steps: {cut}")
        out[-1] += (f", at a median {step:.2f} s a step" if step else "") + "."
    elif sizes.get("train"):
        out.append(
            f"- Trained on {sizes['train']:,} examples ({training.get('optimizer_steps', '?')} optimizer steps)."
        )
    if training.get("test_accuracy") is not None:
        out.append(
            f"- The checkpoint's test accuracy: {training['test_accuracy']:.2%} "
            f"({sizes.get('test', '?')} reviews; validation {training.get('val_accuracy', float('nan')):.2%})."
        )
    out += [f"- Skipped **{name}**: {why}." for name, why in skipped.items()]
    out += [f"- Export failed for **{name}**: {why}." for name, why in (pipe.get("export_failed") or {}).items()]
    return out + [""]


def _recipe_lines(recipe: dict[str, Any], training: dict[str, Any]) -> list[str]:
    """The recipe the pipeline chose for the device and why, the batch size (and the learning rate with it), the
    GPU probe's measurements where one ran, and the throughput the training reached."""
    out = []
    if recipe.get("why"):
        n = "all" if recipe.get("max_samples") is None else f"{recipe['max_samples']:,}"
        flags = ", ".join("--" + g.replace("_", "-") for g in recipe.get("given") or [])
        given = f"; given: {flags}" if flags else ""
        out.append(
            f"- Training recipe: {n} training examples, {recipe.get('epochs')} epoch(s), up to "
            f"{recipe.get('max_length')} tokens: {recipe['why']}{given}."
        )
    b = training.get("batch_choice") or {}
    if b:
        tf32 = f"; fp32 matmuls `{b['matmul_precision']}`" if b.get("matmul_precision") else ""
        out.append(
            f"- Batch size **{b['batch_size']}** (asked: `{b['asked']}`): {b['reason']}; learning rate "
            f"{b['lr']:.3g} ({b['lr_rule']}), warm-up {b.get('warmup_steps', '?')} of "
            f"{b.get('planned_steps', '?')} steps{tf32}."
        )
    rate, tokens = training.get("samples_per_s"), training.get("tokens_per_s") or {}
    if rate:
        out.append(
            f"- Training throughput: {rate:,.0f} samples/s; tokens/s {cell(tokens.get('at_max_length'), 0)} at "
            f"max length, {cell(tokens.get('padded'), 0)} padded, {cell(tokens.get('real'), 0)} real."
        )
    rows = (training.get("cuda_probe") or {}).get("rows") or []
    if rows:
        probe = training["cuda_probe"]
        out += [
            "",
            f"The GPU probe ({probe.get('wall_s', '?')} s, full {probe.get('max_length')}-token batches, "
            "median step after a warm-up step):",
            "",
        ]
        out += md_table(
            ["batch", "candidate", "step (ms)", "samples/s", "peak memory (GB)"],
            [
                [str(r["batch"]), r["candidate"]]
                + (
                    ["did not fit: " + r["failed"], "", ""]
                    if "failed" in r
                    else [
                        f"{r['step_s'] * 1e3:.1f}",
                        f"{r['samples_per_s']:,.0f}",
                        cell(r.get("peak_memory_bytes") and r["peak_memory_bytes"] / 1e9),
                    ]
                )
                for r in rows
            ],
            ["---:", "---", "---:", "---:", "---:"],
        ) + [""]
    return out
