#!/usr/bin/env bash
# One script for a machine with one NVIDIA GPU and no network.
#
#   bench/gpu_check.sh [--dry-run] [--checks-only] [--wheels DIR] [--out DIR]
#
# On the GPU machine it uses the image's python3 and the wheels carried there in
# folders (scripts/gpu_carry.py pack writes them, under 60 MiB each; default
# .cache/gpu-carry): it joins them into a wheelhouse, installs them into
# .cache/gpu-venv (the image's own packages stay visible: its CUDA runtime
# libraries come from them), and writes JSON into DIR (default: $OUT when set,
# else .cache/gpu-check):
#   bandwidth.json  host -> device, pinned and pageable (bench/h2d_bandwidth.py)
#   swap_in.json    staged -> loaded promotion of ~100 MB, 500 MB and 2 GB models
#   serving.json    the agent against ONNX Runtime CUDA directly, 1 and 16 in flight
#   density.json    closed loop at 4x over-commit of a 2 GiB budget, against all
#                   resident, in one run
#   views.json      which mount view of the runner sandbox lets CUDA initialise
#                   (bench/cuda_sandbox_probe.py --views; strace.txt.gz beside it
#                   where the machine has strace)
#   cuda_shm.txt    the CUDA shared-memory tests (tests/agent/frontdoor), on the GPU
#   summary.json    all of it, each promotion against the pinned bandwidth
# The run is capped at 8 minutes, each step at its own share (the last two steps
# need a GPU and are left out of --dry-run). Nothing asks for
# managed (unified) memory: device buffers are explicit and far below the
# card's free memory. The GPU's settings are never touched.
#
# --checks-only: install, then only the last two steps (no measurements).
# --dry-run: the same steps on the CPU with the existing .venv and small sizes,
# so CI keeps the script working on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
CHECKS_ONLY=0
WHEELS=.cache/gpu-carry
OUT_DIR="${OUT:-.cache/gpu-check}"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --checks-only) CHECKS_ONLY=1 ;;
        --wheels) WHEELS="$2"; shift ;;
        --out) OUT_DIR="$2"; shift ;;
        *) echo "usage: $0 [--dry-run] [--checks-only] [--wheels DIR] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT_DIR"
STARTED=$SECONDS

if [ "$DRY_RUN" = 1 ]; then
    [ -x .venv/bin/python ] || ./scripts/setup.sh >/dev/null
    PY=.venv/bin/python
    PROVIDER=cpu
    BANDWIDTH_ARGS="--dry-run --mib 64"
    SWAP_ARGS="--sizes 10MB --repeat 1"
    SERVING_ARGS="--width 256 --layers 2 --concurrency 1,4 --processes 2 --duration 0.5"
    DENSITY_ARGS="--width 256 --layers 4 --factors 4 --duration 1"
else
    PY=.cache/gpu-venv/bin/python
    if [ ! -x "$PY" ]; then
        python3 -m venv --system-site-packages .cache/gpu-venv
        python3 scripts/gpu_carry.py join "$WHEELS" .cache/gpu-wheelhouse
        "$PY" -m pip install -q --no-index --find-links .cache/gpu-wheelhouse \
            -r .cache/gpu-wheelhouse/requirements-gpu.txt
        "$PY" -m pip install -q --no-index --find-links .cache/gpu-wheelhouse \
            --no-deps --no-build-isolation -e .
    fi
    # The CUDA libraries of the image's nvidia-* packages, for every process here.
    LIBS=$("$PY" -c 'import glob, site; print(":".join(sorted({p for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/*/lib")})))')
    export LD_LIBRARY_PATH="${LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
    PROVIDER=cuda
    BANDWIDTH_ARGS="--mib 256"
    SWAP_ARGS="--sizes 100MB,500MB,2GB --repeat 3 --no-naive"
    SERVING_ARGS="--width 4096 --layers 8 --concurrency 1,16 --processes 4 --duration 10"
    DENSITY_ARGS="--width 4096 --layers 8 --factors 4 --duration 10"
fi
export EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER="$PROVIDER"
"$PY" -c 'import onnxruntime as ort; print("onnxruntime", ort.__version__, ort.get_available_providers())'

FAILED=()
step() {  # step SECONDS NAME COMMAND...: one measurement, within its share of 8 minutes
    local cap=$1 name=$2; shift 2
    local left=$((480 - (SECONDS - STARTED)))
    [ "$cap" -lt "$left" ] || cap=$left
    echo "== $name (at most ${cap} s)"
    # A step that fails is reported and the next one runs: one short lease of a GPU
    # should bring back every figure that can be had.
    if ! timeout "$cap" "$@"; then
        echo "== $name FAILED" >&2
        FAILED+=("$name")
        return 1
    fi
}

if [ "$CHECKS_ONLY" = 0 ]; then
# shellcheck disable=SC2086  # the argument lists above are split on purpose
step 30 bandwidth sh -c "$PY bench/h2d_bandwidth.py $BANDWIDTH_ARGS > '$OUT_DIR/bandwidth.json'" \
    && cat "$OUT_DIR/bandwidth.json" || true
# shellcheck disable=SC2086
step 100 swap-in "$PY" bench/swap_in.py $SWAP_ARGS --json "$OUT_DIR/swap_in.json" || true
# shellcheck disable=SC2086
if ! step 70 serving "$PY" bench/gpu_serving.py --provider "$PROVIDER" $SERVING_ARGS \
    --json "$OUT_DIR/serving.json"; then
    # Tells a sandbox that keeps CUDA out apart from CUDA itself failing.
    # shellcheck disable=SC2086
    EDGEPLEX_AGENT_RUNNER__SANDBOX=off step 60 serving-unsandboxed "$PY" bench/gpu_serving.py \
        --provider "$PROVIDER" $SERVING_ARGS --json "$OUT_DIR/serving.json" \
        && export EDGEPLEX_AGENT_RUNNER__SANDBOX=off || true
fi
# shellcheck disable=SC2086
step 150 density "$PY" bench/density_closed_loop.py $DENSITY_ARGS --json "$OUT_DIR/density.json" || true
fi

if [ "$DRY_RUN" = 0 ]; then
    step 40 sandbox-views "$PY" bench/cuda_sandbox_probe.py --views --json "$OUT_DIR/views.json" || true
    step 30 cuda-ipc sh -c "$PY bench/cuda_ipc_probe.py > '$OUT_DIR/cuda_ipc.json'" || true
    cat "$OUT_DIR/cuda_ipc.json" || true
    STRACE=$(command -v strace || echo .cache/strace/strace)  # carried where none is
    if [ -x "$STRACE" ]; then  # what the view's child opens and fails on
        LD_LIBRARY_PATH="$(dirname "$STRACE"):$LD_LIBRARY_PATH" timeout 40 "$STRACE" \
            -E LD_LIBRARY_PATH="$LD_LIBRARY_PATH" -f -qq -s 96 -e trace=%file,ioctl,mmap \
            -o "$OUT_DIR/strace.txt" \
            "$PY" bench/cuda_sandbox_probe.py --views --only "as is" >/dev/null 2>&1 || true
        gzip -f "$OUT_DIR/strace.txt" || true
    fi
    step 120 cuda-shm sh -c "$PY -m pytest -q -p no:cacheprovider -rs \
        tests/agent/frontdoor/test_cuda_shared_memory.py > '$OUT_DIR/cuda_shm.txt' 2>&1" || true
    tail -20 "$OUT_DIR/cuda_shm.txt" || true
fi

"$PY" - "$OUT_DIR" "${FAILED[@]}" > "$OUT_DIR/summary.json" <<'PYEOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])


def read(name):  # a step that failed left no file (or half of one): null in the summary
    try:
        return json.loads((out / name).read_text())
    except (OSError, ValueError):
        return None


bandwidth, rows = read("bandwidth.json"), read("swap_in.json")
if bandwidth and rows:
    pinned = bandwidth["pinned"]["best_gb_per_s"] * 1e9
    for row in rows:
        row["transfer_s"] = row["staged_bytes"] / pinned
        row["promote_over_transfer"] = row["promote_s"] / row["transfer_s"]
print(json.dumps({"bandwidth": bandwidth, "swap_in": rows, "serving": read("serving.json"),
                  "density": read("density.json"), "failed": sys.argv[2:]}, indent=2))
PYEOF
echo "gpu_check: results in $OUT_DIR after $((SECONDS - STARTED)) s; failed: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]
