"""The stages of `make reports`: what each runs, the reports it writes, where they render from, how long it takes.

    python -m benchmarks.render.rebuild          # lists them (make reports), with the CPU each report records

Data only (benchmarks.render.rebuild decides and runs): commands are bash lines run from the repository
root with $PY (this interpreter) and $QSERVE (`$PY -m qserve`) set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MODELS = "models/minilm-l6-distilbert-imdb"
VARIANT = f"{MODELS}/variants/onnx-int8"
BENCH_MD = "qserve.bench.report:render_md"
GATE_MD = "qserve.gate.report:render"


@dataclass(frozen=True)
class Report:
    json: str
    """the report's JSON, relative to the repository root"""
    md: str | None = None
    """the md rendered from it, if any"""
    render: str | None = None
    """"module:function" turning the JSON into the md (a benchmarks/ script or a qserve module), or None"""


@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    commands: tuple[str, ...]
    reports: tuple[Report, ...]
    duration: str
    """What the stage's time goes to, estimates labelled so; never a measured number: the measured wall time
    comes from the reports (rebuild.stage_duration)."""
    needs: tuple[str, ...] = ()
    """paths an earlier stage (or `make demo`) leaves behind on this machine"""
    notes: tuple[str, ...] = field(default=())
    pending: str | None = None
    """why the stage has no committed report yet (a new benchmark waiting for its machine); None: it has one"""


def _bench(d: str) -> Report:
    return Report(f"benchmarks/reports/{d}/report.json", f"benchmarks/reports/{d}/report.md", BENCH_MD)


HEAD_MODELS = "models/minilm-l6-distilbert-imdb-head"
FULL_MODELS = "models/minilm-l6-distilbert-imdb-full"
# the long-text stages: the pipeline's recipe trained under a policy, its onnx-fp32, every policy benched
LONG_TRAIN = (
    "$QSERVE train --max-samples {samples} --max-length 128 --epochs {epochs} --batch-size 16 --lr 1e-4 "
    "--precision bf16-mixed --long-text {policy} --out {m}/checkpoint --force"
)
LONG_EXPORT = "$QSERVE export {m}/checkpoint --variant onnx-fp32 --out {m}/variants/onnx-fp32 --force"
LONG_BENCH = (
    "$QSERVE bench {m}/variants/onnx-fp32 --long-text head,tail,head-tail,windows --max-eval-samples 2000 "
    "--batch-sizes 1 --seq-lens 128 --no-floor --time-budget 1 --out benchmarks/reports/{d} --force "
    "&& cp {m}/checkpoint/train_metrics.json benchmarks/reports/{d}/"
)
PIPELINE = (
    "$QSERVE pipeline --threads 2 --force --report-dir benchmarks/reports/{d} "
    "&& cp {m}/checkpoint/train_metrics.json benchmarks/reports/{d}/"
)
STAGES: tuple[Stage, ...] = (
    Stage(
        "embedded-default",
        "the pipeline (train, export every variant, bench) on the embedded default, on the Intel "
        "Xeon with AMX: the AMX table of docs/measurements.md",
        (PIPELINE.format(d="embedded-default", m=MODELS),),
        (_bench("embedded-default"),),
        "",
    ),
    Stage(
        "embedded-default-amd",
        "the same pipeline on the AMD EPYC (its own checkpoint)",
        (PIPELINE.format(d="embedded-default-amd", m=MODELS),),
        (_bench("embedded-default-amd"),),
        "training most of it",
    ),
    Stage(
        "pipeline-fast-amd",
        "`make demo`'s pipeline after issue 30 (policies compared on the reference and the "
        "recommended variant, the eval cut, stage times) on the AMD EPYC, its own checkpoint",
        (
            "$QSERVE pipeline --force --report-dir benchmarks/reports/pipeline-fast-amd && "
            f"cp {MODELS}/checkpoint/train_metrics.json benchmarks/reports/pipeline-fast-amd/",
        ),
        (_bench("pipeline-fast-amd"),),
        "",
    ),
    Stage(
        "pipeline-auto-zen4",
        "`make demo`'s pipeline (`--precision auto`, the training budget, variants by CPU class, the release gate; "
        "after issues 53-56: the placement plan, the training loop's token table, the refit; after 67: racing, the "
        "report's first screen, saved as first-screen.png) on the AMD EPYC Zen 4 class (avx512_bf16 + VNNI), its own "
        "checkpoint: README's headline until pipeline-auto-xeon",
        (
            "$QSERVE pipeline --force --report-dir benchmarks/reports/pipeline-auto-zen4 && "
            f"cp {MODELS}/checkpoint/train_metrics.json benchmarks/reports/pipeline-auto-zen4/",
            # report.html's first screen at 1280x800, committed beside it (issue 67)
            "$PY -m benchmarks.report_screen benchmarks/reports/pipeline-auto-zen4",
        ),
        (_bench("pipeline-auto-zen4"),),
        "",
    ),
    Stage(
        "pipeline-auto-xeon",
        "`make demo`'s pipeline after issues 66-69 (racing and the first screen, the sequential gate, repair) on the "
        "Intel Xeon with AMX, its own checkpoint: README's headline (render/blocks/reports.py MAIN_JOB)",
        (
            "$QSERVE pipeline --force --report-dir benchmarks/reports/pipeline-auto-xeon && "
            f"cp {MODELS}/checkpoint/train_metrics.json benchmarks/reports/pipeline-auto-xeon/",
            "$PY -m benchmarks.report_screen benchmarks/reports/pipeline-auto-xeon",
        ),
        (_bench("pipeline-auto-xeon"),),
        "`make demo`'s stages: training, the exports, the raced bench, the gate, repair",
    ),
    Stage(
        "gate",
        "the release gate (issue 49) of the embedded default's onnx-int8 and ov-int8 against torch-fp32 on "
        "the 2,000 test texts, calibrated on 2,000 validation texts, verdicts sealed into the manifests",
        (
            f"$QSERVE gate {MODELS}/variants/onnx-int8 {MODELS}/variants/ov-int8 --threads 2 --force "
            "--out benchmarks/reports/gate",
        ),
        (Report("benchmarks/reports/gate/gate.json", "benchmarks/reports/gate/gate.md", GATE_MD),),
        "~3 min on the AMD EPYC (estimate: the reference and two variants score 2,000 texts, each variant 2,000 more "
        "for calibration)",
        needs=(f"{MODELS}/variants/torch-fp32",),
    ),
    Stage(
        "gate-50",
        "the same gate, one look at 50 test texts: too few for any bound to reach the bar, so both are undecided "
        "and say so",
        (
            f"$QSERVE gate {MODELS}/variants/onnx-int8 {MODELS}/variants/ov-int8 --threads 2 --max-samples 50 "
            "--looks 1 --no-record --force --out benchmarks/reports/gate-50 || true",
        ),
        (Report("benchmarks/reports/gate-50/gate.json", "benchmarks/reports/gate-50/gate.md", GATE_MD),),
        "~1 min on the AMD EPYC (estimate: 50 texts each, the calibration's 2,000 held-out texts per variant)",
        needs=(f"{MODELS}/variants/torch-fp32",),
    ),
    Stage(
        "gate-multilabel",
        "a multi-label model trained by qserve on the embedded reviews (labels positive, "
        "negative, rotten-tomatoes), its onnx-int8 gated with per-label thresholds fitted on held-out data: macro "
        "F1 at one 0.5 and at the thresholds on the test split, and the gain's interval",
        ("$PY -m benchmarks.studies.multilabel_gate",),
        (
            Report(
                "benchmarks/reports/gate-multilabel/gate.json",
                "benchmarks/reports/gate-multilabel/gate.md",
                "studies.multilabel_gate:render",
            ),
        ),
        "beside other jobs, training most of it (250 steps); a re-gate of the same checkpoint ~1 min (estimate: the "
        "script reuses the checkpoint when the data is unchanged)",
    ),
    Stage(
        "gate-multilabel-aspects",
        "the same on rarer labels a user's tagging rules make (sentiment, and the "
        "acting and music a review mentions): per-label thresholds against one 0.5, the gain's interval",
        ("$PY -m benchmarks.studies.multilabel_gate --task aspects",),
        (
            Report(
                "benchmarks/reports/gate-multilabel-aspects/gate.json",
                "benchmarks/reports/gate-multilabel-aspects/gate.md",
                "studies.multilabel_gate:render",
            ),
        ),
        "beside other jobs, training most of it (the report's own stage seconds)",
    ),
    Stage(
        "deps-upgrade",
        "onnx-int8 and ov-int8 agreement with fp32 on 1,000 test reviews before and after the "
        "dependency upgrade of issue 47 (transformers 4.57.6 + optimum-onnx's export -> transformers 5 + qserve's "
        "own ONNX export), on one checkpoint trained by transformers 4.57",
        ("$PY -m benchmarks.studies.deps_upgrade models/minilm-tf457 --label after",),
        (
            Report(
                "benchmarks/reports/deps-upgrade/report.json",
                "benchmarks/reports/deps-upgrade/report.md",
                "studies.deps_upgrade:render",
            ),
        ),
        "~5 min a run on the AMD EPYC beside other jobs (estimate: three exports and 1,000 texts through four "
        "variants; the report's export seconds)",
        needs=("models/minilm-tf457",),
        notes=(
            "the `before` run is the same command with a venv holding the old pins (transformers 4.57.6, "
            "optimum-onnx 0.1.0) and --label before; the checkpoint: `qserve train --precision 32-true "
            "--max-samples 2400 --max-eval-samples 500 --out models/minilm-tf457` under transformers 4.57.6",
        ),
    ),
    Stage(
        "fast-vs-full",
        "the fast bench's recommendation and served policy against a full comparison (every policy on "
        "every variant, the bench before issue 30, code b7b3591) of the same run's variant files",
        (
            "rm -rf /tmp/qserve-b7b3591 && mkdir -p /tmp/qserve-b7b3591 && git archive b7b3591 qserve | "
            "tar -x -C /tmp/qserve-b7b3591",
            f"PYTHONPATH=/tmp/qserve-b7b3591 $PY -m qserve bench {MODELS}/variants/* --long-text "
            "head,tail,head-tail,windows --max-eval-samples 1000 --batch-sizes 1,8,32 --seq-lens 128 --time-budget 2 "
            "--threads 2 --out benchmarks/reports/full-policy-comparison-amd --force",
            "$PY -m benchmarks.studies.compare_full_policy "
            "--full benchmarks/reports/full-policy-comparison-amd/report.json "
            "--fast benchmarks/reports/pipeline-fast-amd/report.json --out benchmarks/reports/fast-vs-full",
        ),
        (
            Report(
                "benchmarks/reports/full-policy-comparison-amd/report.json",
                "benchmarks/reports/full-policy-comparison-amd/report.md",
                BENCH_MD,
            ),
            Report(
                "benchmarks/reports/fast-vs-full/comparison.json",
                "benchmarks/reports/fast-vs-full/comparison.md",
                "studies.compare_full_policy:render",
            ),
        ),
        "the full comparison nearly all of it, after pipeline-fast-amd: the full comparison reads the variant files "
        "that run exported",
        needs=(f"{MODELS}/variants/torch-fp32", "benchmarks/reports/pipeline-fast-amd/report.json"),
    ),
    Stage(
        "embedded-default-full-test",
        "agreement of every CPU variant (and torch-fp16) on all 2,000 test reviews",
        (
            f"$QSERVE export {MODELS}/checkpoint --variant torch-fp16 --out {MODELS}/extra/torch-fp16 --force",
            f"$QSERVE bench {MODELS}/variants/{{torch-fp32,torch-bf16,bnb-int8,bnb-nf4,bnb-fp4,onnx-fp32,onnx-fp16,"
            f"onnx-int8,onnx-int4}} {MODELS}/extra/torch-fp16 --batch-sizes 1 --seq-lens 128 --no-floor "
            "--real-text-samples 0 --threads 2 --time-budget 1 --out benchmarks/reports/embedded-default-full-test "
            "--force",
        ),
        (_bench("embedded-default-full-test"),),
        "~10 min (estimate: the bench most of it, see its report's own timings; the torch-fp16 export under a minute)",
        needs=(f"{MODELS}/checkpoint", f"{MODELS}/variants/onnx-int8"),
    ),
    Stage(
        "precision",
        "the precision study (one fine-tune per precision, a second seed) and the optimizer step",
        (
            "$QSERVE train --compare --max-samples 6000 --max-eval-samples 2000 --out benchmarks/reports/precision "
            "--force",
            "$PY -m benchmarks.studies.optimizer_step --rounds 5 --out benchmarks/reports/precision",
        ),
        (
            Report(
                "benchmarks/reports/precision/precision_study.json",
                "benchmarks/reports/precision/precision_study.md",
                "qserve.training.study:render_markdown",
            ),
            Report(
                "benchmarks/reports/precision/optimizer_step.json", "benchmarks/reports/precision/optimizer_step.md"
            ),
        ),
        "~50 min (estimate: the five full runs ~30 min, see the study's own train times; the interleaved step rounds "
        "~19 min and the optimizer step ~2 min)",
    ),
    Stage(
        "distilbert-base-dims",
        "speed at DistilBERT-base size (random weights)",
        ("$PY -m benchmarks.studies.distilbert_base_speed --threads 2",),
        (_bench("distilbert-base-dims"),),
        "~13 min (estimate: the bench most of it, see its report's own timings; building the checkpoint and six "
        "exports ~5 min)",
    ),
    Stage(
        "int8-breakdown",
        "where onnx-int8's time goes at DistilBERT-base dims, and smoothing's cost in answers",
        (
            "$PY -m benchmarks.studies.int8_breakdown --threads 2",
            f"$QSERVE export {MODELS}/checkpoint --variant onnx-int8 --no-smooth "
            f"--out {MODELS}/extra/onnx-int8-nosmooth --force",
            f"$QSERVE bench {MODELS}/variants/torch-fp32 {MODELS}/variants/onnx-int8 {MODELS}/extra/onnx-int8-nosmooth "
            "--batch-sizes 1 --seq-lens 128 --no-floor --real-text-samples 0 --threads 2 --time-budget 1 "
            "--out benchmarks/reports/int8-breakdown/smooth-off-agreement --force",
        ),
        (
            Report(
                "benchmarks/reports/int8-breakdown/report.json",
                "benchmarks/reports/int8-breakdown/report.md",
                "studies.int8_breakdown:render",
            ),
            _bench("int8-breakdown/smooth-off-agreement"),
        ),
        "~6 min (estimate: the script's own ~2-3 min plus four first-time exports); the agreement bench a minute or "
        "two (its report's own timings)",
        needs=("models/distilbert-base-dims/variants/onnx-int8", f"{MODELS}/checkpoint"),
    ),
    Stage(
        "crosscheck",
        "qserve bench against plain onnxruntime / torch loops",
        ("$PY -m benchmarks.crosscheck --threads 2",),
        (Report("benchmarks/reports/crosscheck.json", "benchmarks/reports/crosscheck.md", "crosscheck:render_md"),),
        "~9 min (estimate: 5 rounds of a 2-variant bench plus 4 plain-loop children)",
        needs=("models/distilbert-base-dims/variants/onnx-int8",),
    ),
    Stage(
        "int8-invariance",
        "one text, one answer: onnx-int8's candidate fixes, and how a batch's rows run",
        (
            "$PY -m benchmarks.studies.int8_invariance --rounds 6",
            "$PY -m benchmarks.studies.int8_invariance --base-dims --rounds 6",
            f"$PY -m benchmarks.studies.rows_side_by_side {VARIANT} --threads 2",
        ),
        (
            Report(
                "benchmarks/reports/int8-invariance/embedded-default/report.json",
                "benchmarks/reports/int8-invariance/embedded-default/report.md",
                "studies.int8_invariance:render",
            ),
            Report(
                "benchmarks/reports/int8-invariance/distilbert-base-dims/report.json",
                "benchmarks/reports/int8-invariance/distilbert-base-dims/report.md",
                "studies.int8_invariance:render",
            ),
            Report(
                "benchmarks/reports/int8-invariance/rows-side-by-side/report.json",
                "benchmarks/reports/int8-invariance/rows-side-by-side/report.md",
                "studies.rows_side_by_side:render",
            ),
            Report("benchmarks/reports/int8-invariance/embedded-default/variants-invariance.json"),
        ),
        "~25 min (estimate: candidate exports, 6 timing rounds and 2,000-review agreement for each model, then "
        "5 rounds of rows side by side)",
        needs=(f"{MODELS}/checkpoint", VARIANT),
        notes=(
            "variants-invariance.json came from a side run (qserve.bench.invariance per variant); no command "
            "regenerates it: the invariance column of the embedded-default stage measures the same thing.",
        ),
    ),
    Stage(
        "openvino",
        "OpenVINO vs onnx-int8 and torch-bf16, one process, rounds interleaved",
        (
            f"$PY -m benchmarks.studies.openvino_compare {MODELS}/checkpoint "
            "--out benchmarks/reports/openvino/embedded-default",
            "$PY -m benchmarks.studies.openvino_compare --distilbert-base --rounds 4 "
            "--out benchmarks/reports/openvino/distilbert-base-dims",
        ),
        (
            Report(
                "benchmarks/reports/openvino/embedded-default/report.json",
                "benchmarks/reports/openvino/embedded-default/report.md",
                "studies.openvino_compare:render",
            ),
            Report(
                "benchmarks/reports/openvino/distilbert-base-dims/report.json",
                "benchmarks/reports/openvino/distilbert-base-dims/report.md",
                "studies.openvino_compare:render",
            ),
        ),
        "~11 min (estimate: ~5 min for the embedded default, the rest DistilBERT-base dims and its exports)",
        needs=(f"{MODELS}/checkpoint",),
    ),
    Stage(
        "serve",
        "onnx-int8 served over HTTP: batching on vs off, concurrency 1 and 32",
        (f"$PY -m benchmarks.serve_bench {VARIANT} --duration 15 --force",),
        (
            Report(
                "benchmarks/reports/serve/serve_report.json",
                "benchmarks/reports/serve/serve_report.md",
                "serve_bench.__main__:render_md",
            ),
        ),
        "~2.5 min (estimate): the timed load and in-process model timing its settings ask for, ~1.8 "
        "min; server start-ups ~0.5 min",
        needs=(VARIANT,),
    ),
    Stage(
        "serve-protocols",
        "64 real reviews through /v1, V2 (HTTP, gRPC), TEI and vLLM, alone and concurrently: "
        "identical answers; /v1 c32 throughput of the code before the new routes and after, interleaved",
        (
            f"$PY -m benchmarks.serve_protocols {VARIANT} --reviews 64 --duration 10 --rounds 3 "
            "--out benchmarks/reports/serve-protocols --force",
        ),
        (
            Report(
                "benchmarks/reports/serve-protocols/report.json",
                "benchmarks/reports/serve-protocols/report.md",
                "serve_protocols:render_md",
            ),
        ),
        "~4 min (estimate): 6 x 10 s of timed load on /v1, 7 server start-ups, 640 answer requests",
        needs=(VARIANT,),
    ),
    Stage(
        "predict",
        "`qserve predict` over all 25,000 IMDb reviews with the pipeline's recommended variant: rows/s "
        "vs the in-process b32 ceiling, peak RSS (25,000 vs 2,500 rows), Ray Data on 1 node and a 2-node cluster",
        (f"$PY -m benchmarks.predict_bench {MODELS} --force",),
        (
            Report(
                "benchmarks/reports/predict/report.json", "benchmarks/reports/predict/report.md", "predict_bench:render"
            ),
        ),
        "three 25,000-review jobs with the recommended variant, the 2,500-review job, the 3,200-review ceiling, Ray "
        "start-ups",
        needs=(f"{MODELS}/report/report.json",),
    ),
    Stage(
        "serve-ray",
        "uvicorn vs Ray Serve replicas, interleaved",
        (
            f"$PY -m benchmarks.serve_bench {VARIANT} --engine ray --replicas 1,2 --duration 4 --rounds 3 "
            "--reviews 256 --out benchmarks/reports/serve-ray --force",
        ),
        (
            Report(
                "benchmarks/reports/serve-ray/report.json",
                "benchmarks/reports/serve-ray/report.md",
                "serve_bench.engines:render_md",
            ),
        ),
        "the timed load about a third of it; Ray start-ups and the trivial-app cell the rest",
        needs=(VARIANT,),
    ),
    Stage(
        "serve-openvino",
        "the recommended ov-int8 served next to onnx-int8",
        (
            f"$PY -m benchmarks.serve_bench {VARIANT} --duration 6 --threads 2 "
            "--out benchmarks/reports/serve-openvino/onnx-int8 --force",
            f"$PY -m benchmarks.serve_bench {MODELS}/variants/ov-int8 --duration 6 --threads 2 "
            "--out benchmarks/reports/serve-openvino/ov-int8 --force",
        ),
        (
            Report(
                "benchmarks/reports/serve-openvino/onnx-int8/serve_report.json",
                "benchmarks/reports/serve-openvino/onnx-int8/serve_report.md",
                "serve_bench.__main__:render_md",
            ),
            Report(
                "benchmarks/reports/serve-openvino/ov-int8/serve_report.json",
                "benchmarks/reports/serve-openvino/ov-int8/serve_report.md",
                "serve_bench.__main__:render_md",
            ),
        ),
        "2 x 48 s of timed load and model timing, plus start-ups",
        needs=(VARIANT, f"{MODELS}/variants/ov-int8"),
    ),
    Stage(
        "long-text",
        "every long-text policy (head, tail, head-tail, windows) on the 2,000 test reviews, on the "
        "pipeline's checkpoint (trained with the default policy, head-tail)",
        (LONG_BENCH.format(m=MODELS, d="long-text"),),
        (_bench("long-text"),),
        "the bench: one variant under four policies (windows several times the forwards)",
        needs=(f"{MODELS}/variants/onnx-fp32", f"{MODELS}/checkpoint"),
        notes=(
            "The same policies on a checkpoint trained with head, and on the full data, are the stages "
            "long-text-head and long-text-full.",
        ),
    ),
    Stage(
        "long-text-head",
        "the long-text stage's policy bench on a checkpoint trained with `--long-text head` "
        "(the same recipe otherwise): the trained-head column of the policies table",
        (
            LONG_TRAIN.format(m=HEAD_MODELS, samples=6000, epochs=1, policy="head"),
            LONG_EXPORT.format(m=HEAD_MODELS),
            LONG_BENCH.format(m=HEAD_MODELS, d="long-text-head"),
        ),
        (_bench("long-text-head"),),
        "training 375 steps most of it (its train_metrics.json reads longer when other work shared the cores), the "
        "onnx-fp32 export seconds, the policy bench minutes",
    ),
    Stage(
        "long-text-full",
        "the long-text stage's policy bench on the full data: every training review (19,922), 2 epochs, head-tail",
        (
            LONG_TRAIN.format(m=FULL_MODELS, samples=0, epochs=2, policy="head-tail"),
            LONG_EXPORT.format(m=FULL_MODELS),
            LONG_BENCH.format(m=FULL_MODELS, d="long-text-full"),
        ),
        (_bench("long-text-full"),),
        "training 2 epochs of every review nearly all of it, the onnx-fp32 export seconds, the policy bench minutes",
    ),
    Stage(
        "b1-modes",
        "is b1 latency bimodal across processes, and does a setting of ours (ONNX Runtime's spinning, its threads, "
        "their placement, the memory layout) decide the mode? fresh processes per setting, in turn",
        (
            f"$PY -m benchmarks.studies.b1_modes {MODELS}/variants/onnx-int8 {MODELS}/variants/onnx-fp32 "
            f"{MODELS}/variants/ov-int8 --procs 12 --out benchmarks/reports/b1-modes-amd",
        ),
        (
            Report(
                "benchmarks/reports/b1-modes-amd/report.json",
                "benchmarks/reports/b1-modes-amd/report.md",
                "studies.b1_modes:render",
            ),
        ),
        "fresh processes per (variant, setting), each loading its variant and timing its forwards",
    ),
    Stage(
        "bench-repeat-zen4",
        "does the same machine give the same answer? 5 consecutive `qserve bench` runs over the main job's variant "
        "dirs (the gate verdicts `make demo` sealed into them included) at the pipeline's shapes and 1,000 texts, "
        "racing as the pipeline does (issues 60, 67), on the AMD EPYC Zen 4 class",
        (
            f"$PY -m benchmarks.bench_repeat {MODELS}/variants/* --runs 5 --out benchmarks/reports/bench-repeat-zen4 "
            "-- --batch-sizes 1,8,32 --seq-lens 128 --threads 2 --time-budget 0.5 --max-eval-samples 1000 --no-floor",
        ),
        (
            Report(
                "benchmarks/reports/bench-repeat-zen4/report.json",
                "benchmarks/reports/bench-repeat-zen4/report.md",
                "bench_repeat:render",
            ),
        ),
        "~12 min (estimate): 5 runs of `qserve bench` over the 12 variants, each a screen round over all, the other "
        "rounds and 1,000 texts for the contenders",
        needs=(f"{MODELS}/variants/torch-fp32", f"{MODELS}/variants/onnx-int8"),
    ),
    Stage(
        "bench-repeat-xeon",
        "5 consecutive `qserve bench` runs over the main job's variant dirs, as bench-repeat-zen4, on the Intel Xeon "
        "with AMX after issues 66-69 (the gate's verdicts and the repaired variants `make demo` left included)",
        (
            f"$PY -m benchmarks.bench_repeat {MODELS}/variants/* --runs 5 --out benchmarks/reports/bench-repeat-xeon "
            "-- --batch-sizes 1,8,32 --seq-lens 128 --threads 2 --time-budget 0.5 --max-eval-samples 1000 --no-floor",
        ),
        (
            Report(
                "benchmarks/reports/bench-repeat-xeon/report.json",
                "benchmarks/reports/bench-repeat-xeon/report.md",
                "bench_repeat:render",
            ),
        ),
        "5 runs of `qserve bench` over the variants, each a screen round over all, the other "
        "rounds and 1,000 texts "
        "for the contenders",
        needs=(f"{MODELS}/variants/torch-fp32", f"{MODELS}/variants/onnx-int8"),
    ),
    Stage(
        "drain",
        "nothing lost at shutdown (issue 66): 20 SIGTERMs each for the venv server, the serving image and --workers 2 "
        "under 32 keep-alive and 8 new-connection clients, with the default drain period, every request accounted",
        (f"$PY -m benchmarks.drain_bench {VARIANT} --runs 20 --out benchmarks/reports/drain",),
        (Report("benchmarks/reports/drain/report.json", "benchmarks/reports/drain/report.md", "drain_bench:render"),),
        "60 server starts, each a drain period under load and its exit; the serving image built first when missing",
        needs=(VARIANT,),
    ),
    Stage(
        "serve-protocol-cost-refit",
        "one request on each protocol's classify route at one client (wrk), the code before issue 69's one router "
        "(70dc2f0) and after, interleaved, on the Intel Xeon with AMX",
        (
            f"$PY -m benchmarks.serve_protocol_cost {VARIANT} --baseline-ref 70dc2f0 --rounds 3 --duration 8 "
            "--out benchmarks/reports/serve-protocol-cost-refit",
        ),
        (
            Report(
                "benchmarks/reports/serve-protocol-cost-refit/report.json",
                "benchmarks/reports/serve-protocol-cost-refit/report.md",
                "serve_protocol_cost:render",
            ),
        ),
        "2 code trees x 3 rounds, each a server start-up, checked answers and 5 routes x 8 s of wrk",
        needs=(VARIANT,),
    ),
    Stage(
        "serve-windows",
        "windows served on the 2,000 test reviews: answers at concurrency 32 against each "
        "text's answer alone, and windowed texts/s against the ceiling head's texts/s over the windows per "
        "text sets",
        (
            f"$PY -m benchmarks.studies.serve_windows {MODELS}/variants/onnx-fp32 --threads 2 "
            "--out benchmarks/reports/serve-windows --force",
        ),
        (
            Report(
                "benchmarks/reports/serve-windows/report.json",
                "benchmarks/reports/serve-windows/report.md",
                "studies.serve_windows:render",
            ),
        ),
        "2,000 reviews sent four times, alone and from 32 clients under head and windows:128:96:mean; one server "
        "start-up",
        needs=(f"{MODELS}/variants/onnx-fp32",),
    ),
    Stage(
        "lifecycle",
        "several models per server: shadow agreement's throughput cost, a hot swap's latency blip and memory",
        (
            f"$QSERVE export {MODELS}/checkpoint --variant onnx-int8 --out {MODELS}/extra/onnx-int8-v2 --force",
            f"$PY -m benchmarks.lifecycle_bench {VARIANT} --swap-to {MODELS}/extra/onnx-int8-v2 "
            f"--reference {MODELS}/variants/onnx-fp32 --shadow-rate 0.05 --duration 10 --rounds 3 "
            "--out benchmarks/reports/lifecycle --force",
        ),
        (
            Report(
                "benchmarks/reports/lifecycle/report.json",
                "benchmarks/reports/lifecycle/report.md",
                "lifecycle_bench:render",
            ),
        ),
        "a new onnx-int8 version exported and calibrated, two server start-ups, 3 x 2 cells of 11 s and 3 swaps under "
        "load",
        needs=(VARIANT, f"{MODELS}/variants/onnx-fp32", f"{MODELS}/checkpoint"),
    ),
    Stage(
        "serve-buckets",
        "length-bucketed ov-int8 served against onnx-int8 (sentences and reviews, c1 and c32), "
        "gRPC vs HTTP, tracing off vs the code before it",
        (
            f"$PY -m benchmarks.studies.serve_buckets {VARIANT} {MODELS}/variants/ov-int8 --baseline-ref 0546bd7 "
            "--threads 2 --duration 5 --rounds 3 --out benchmarks/reports/serve-buckets --force",
        ),
        (
            Report(
                "benchmarks/reports/serve-buckets/report.json",
                "benchmarks/reports/serve-buckets/report.md",
                "studies.serve_buckets:render",
            ),
        ),
        "3 rounds x 20 cells x 5 s of timed load, four server start-ups and the sequential passes over 512 texts per "
        "server",
        needs=(VARIANT, f"{MODELS}/variants/ov-int8"),
    ),
    Stage(
        "byo-bert",
        "bring your own BERT on real weights: the embedded MiniLM as a BertForSequenceClassification, "
        "trained on 1,500 reviews, exported to every variant, agreement with its fp32 on 2,000 test reviews, "
        "the variants' bench and one served answer",
        ("rm -rf models/byo-bert && $PY -m benchmarks.studies.byo_bert",),
        (
            Report(
                "benchmarks/reports/byo-bert/report.json",
                "benchmarks/reports/byo-bert/report.md",
                "studies.byo_bert:render_md",
            ),
            _bench("byo-bert/bench"),
        ),
        "training a few minutes, then export --all, agreement of 12 variants on 2,000 reviews, their bench, one "
        "served answer",
    ),
    Stage(
        "flood",
        "overload: do admitted requests wait behind refusals?",
        (f"$PY -m benchmarks.flood_bench {VARIANT} --baseline-ref 99c8efd --rounds 3 --out benchmarks/reports/flood",),
        (Report("benchmarks/reports/flood/report.json", "benchmarks/reports/flood/report.md", "flood_bench:render"),),
        "~3 min (estimate: 3 rounds of 300-request floods on two servers, then the slow-client rounds)",
        needs=(VARIANT,),
    ),
    Stage(
        "serve-overhead",
        "what a request costs beyond the model at 1 and 32 clients (wrk), by the server's own "
        "CPU time: onnx-int8 and the recommended variant, the code before (b7b3591) and after; per round also "
        "in one process (the server's own runtime timed beside it: b1 at one client, b32 before and after 32)",
        (
            f"$PY -m benchmarks.serve_overhead {VARIANT} {MODELS} --baseline-ref b7b3591 --rounds 3 --duration 10 "
            "--out benchmarks/reports/serve-overhead",
        ),
        (
            Report(
                "benchmarks/reports/serve-overhead/report.json",
                "benchmarks/reports/serve-overhead/report.md",
                "serve_overhead.__main__:render",
            ),
        ),
        "2 variants x 2 code trees x 3 rounds, each ~60 s: the in-process loops, wrk at 1 and 32 clients for 10 s "
        "each, a server start-up and 64 checked answers; per round the bare and the one-process children, ~25 s each; "
        "then one traced server per variant for the step table; exits 1 while a target is missed",
        needs=(VARIANT, f"{MODELS}/report"),
    ),
    Stage(
        "serve-overhead-xeon",
        "serve-overhead on the Intel Xeon with AMX (its own checkpoint, from the "
        "embedded-default stage, whose report names the recommended variant): the same variants, code trees and "
        "rounds",
        # the embedded-default stage writes its report under benchmarks/; `qserve serve MODEL_DIR` reads it here
        (
            f"rm -rf {MODELS}/report && cp -r benchmarks/reports/embedded-default {MODELS}/report",
            f"$PY -m benchmarks.serve_overhead {VARIANT} {MODELS} --baseline-ref b7b3591 --rounds 3 --duration 10 "
            "--out benchmarks/reports/serve-overhead-xeon",
        ),
        (
            Report(
                "benchmarks/reports/serve-overhead-xeon/report.json",
                "benchmarks/reports/serve-overhead-xeon/report.md",
                "serve_overhead.__main__:render",
            ),
        ),
        "2 variants x 2 code trees x 3 rounds, the floor and one-process children, the traced servers; exits 1 while "
        "a target is missed",
        needs=(VARIANT, "benchmarks/reports/embedded-default/report.json"),
    ),
    Stage(
        "ov-breakdown-xeon",
        "where ov-int8's and ov-bf16's time goes on the Intel Xeon with AMX (OpenVINO's "
        "per-node counters, b1 and b32 at s128) against the int8 / bf16 floor, the thread settings beside the "
        "runtime's, the bound with every GEMM at the peak; ov-int8 exported with the bf16 hint beside them, and "
        "the three variants' agreement with torch-fp32 on 1,000 test reviews",
        (
            f"$QSERVE export {MODELS}/checkpoint --variant ov-int8 --inference-precision bf16 "
            f"--out {MODELS}/extra/ov-int8-bf16 --force",
            f"$PY -m benchmarks.studies.ov_breakdown {MODELS}/variants/ov-int8 {MODELS}/extra/ov-int8-bf16 "
            f"{MODELS}/variants/ov-bf16 --threads 2 --out benchmarks/reports/ov-breakdown-xeon",
            f"$QSERVE bench {MODELS}/variants/torch-fp32 {MODELS}/variants/ov-int8 {MODELS}/extra/ov-int8-bf16 "
            f"{MODELS}/variants/ov-bf16 --max-eval-samples 1000 --race 0 --batch-sizes 1 --seq-lens 128 "
            "--no-floor --real-text-samples 0 --threads 2 --time-budget 1 "
            "--out benchmarks/reports/ov-breakdown-xeon/agreement --force",
        ),
        (
            Report(
                "benchmarks/reports/ov-breakdown-xeon/report.json",
                "benchmarks/reports/ov-breakdown-xeon/report.md",
                "studies.ov_breakdown:render",
            ),
            _bench("ov-breakdown-xeon/agreement"),
        ),
        "in a slow phase of the machine: the export, the breakdown (most of it), the agreement bench",
        needs=(
            f"{MODELS}/checkpoint",
            f"{MODELS}/variants/ov-int8",
            f"{MODELS}/variants/ov-bf16",
            f"{MODELS}/variants/torch-fp32",
        ),
    ),
    Stage(
        "serve-protocol-cost",
        "one request on each protocol's classify route at one client (wrk): p50 and the "
        "server's event-loop CPU ms per request, the code before the fast routes (de8320f) and after, interleaved",
        (
            f"$PY -m benchmarks.serve_protocol_cost {VARIANT} --baseline-ref de8320f --rounds 3 --duration 8 "
            "--out benchmarks/reports/serve-protocol-cost",
        ),
        (
            Report(
                "benchmarks/reports/serve-protocol-cost/report.json",
                "benchmarks/reports/serve-protocol-cost/report.md",
                "serve_protocol_cost:render",
            ),
        ),
        "~6 min (estimate): 2 code trees x 3 rounds, each a server start-up, 5 x 64 checked answers and 5 routes "
        "x 8 s of wrk",
        needs=(VARIANT,),
    ),
    Stage(
        "serve-refit-cost",
        "the fourth refit's cost (issue 56: one admission layer for HTTP and gRPC, one route table, KServe V2 one "
        "package): each protocol's classify route at one client, the code before the refit (6b48b80) and after, "
        "interleaved",
        (
            f"$PY -m benchmarks.serve_protocol_cost {VARIANT} --baseline-ref 6b48b80 --rounds 3 --duration 8 "
            "--out benchmarks/reports/serve-refit-cost",
        ),
        (
            Report(
                "benchmarks/reports/serve-refit-cost/report.json",
                "benchmarks/reports/serve-refit-cost/report.md",
                "serve_protocol_cost:render",
            ),
        ),
        "~6 min (estimate): 2 code trees x 3 rounds, each a server start-up, 5 x 64 checked answers and 5 routes "
        "x 8 s of wrk",
        needs=(VARIANT,),
    ),
    Stage(
        "serve-protocol-cost-xeon",
        "serve-protocol-cost on the Intel Xeon with AMX, after KServe V2's /infer joined "
        "the fast routes: each protocol's classify route at one client, the code before any fast route (de8320f) and "
        "after, interleaved",
        (
            f"$PY -m benchmarks.serve_protocol_cost {VARIANT} --baseline-ref de8320f --rounds 3 --duration 8 "
            "--out benchmarks/reports/serve-protocol-cost-xeon",
        ),
        (
            Report(
                "benchmarks/reports/serve-protocol-cost-xeon/report.json",
                "benchmarks/reports/serve-protocol-cost-xeon/report.md",
                "serve_protocol_cost:render",
            ),
        ),
        "2 code trees x 3 rounds, each a server start-up, 5 x 64 checked answers and 5 routes x 8 s of wrk",
        needs=(VARIANT,),
    ),
    Stage(
        "checkpoint-cost",
        "one resumable training checkpoint of the embedded default per precision: wall and CPU "
        "seconds, size, share of training at the default ~5-minute interval",
        ("$PY -m benchmarks.studies.checkpoint_cost --saves 5",),
        (
            Report(
                "benchmarks/reports/checkpoint_cost/checkpoint_cost.json",
                "benchmarks/reports/checkpoint_cost/checkpoint_cost.md",
            ),
        ),
        "3 precisions x 5 saves of a whole training checkpoint (weights, optimizer state, RNG states; the report "
        "gives its size), plus loading the model",
    ),
    Stage(
        "repair",
        "every int8 and 4-bit variant of the main job's checkpoint gated, repaired where it misses its bars (its "
        "search trace), gated again on the 1,000 held-out test texts, and benched beside its repair",
        ("$PY -m benchmarks.repair_bench " + MODELS + " --threads 2 --out benchmarks/reports/repair-xeon",),
        (
            Report(
                "benchmarks/reports/repair-xeon/report.json",
                "benchmarks/reports/repair-xeon/report.md",
                "repair_bench:render",
            ),
        ),
        "per variant a gate, a ranking and search within its 300 s budget, an export and a gate, "
        "then one bench of them all",
        needs=(f"{MODELS}/checkpoint", f"{MODELS}/variants/torch-fp32"),
    ),
)
BY_NAME = {s.name: s for s in STAGES}
