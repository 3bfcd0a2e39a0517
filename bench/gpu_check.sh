#!/usr/bin/env bash
# One script for a machine with one NVIDIA GPU.
#
#   bench/gpu_check.sh [--dry-run] [--out DIR]
#
# It installs onnxruntime-gpu (in place of the CPU wheel) and nvidia-ml-py into
# .cache/gpu-venv, measures host->device bandwidth, then runs the swap-in and
# density benchmarks with runners on the CUDA provider, and writes every figure
# as JSON into DIR (default: $OUT when set, else .cache/gpu-check). The whole
# run is capped at 8 minutes. It never asks for managed (unified) memory: every
# allocation is an explicit device buffer, far below the card's free memory.
#
# --dry-run: the same steps on the CPU provider with the existing .venv and
# small sizes, so CI can keep the script from rotting on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
OUT_DIR="${OUT:-.cache/gpu-check}"
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT_DIR="$2"; shift ;;
        *) echo "usage: $0 [--dry-run] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT_DIR"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$PWD/.cache/pip}"

if [ "$DRY_RUN" = 1 ]; then
    ./scripts/setup.sh >/dev/null
    PY=.venv/bin/python
    PROVIDER=cpu
    DURATION=4; FACTOR=4; BUDGET=24MiB; SWAP_REPEAT=1; SWAP_SIZES=10MB
else
    if [ ! -x .cache/gpu-venv/bin/python ]; then
        python3 -m venv .cache/gpu-venv
    fi
    PY=.cache/gpu-venv/bin/python
    $PY -m pip install -q --upgrade pip
    $PY -m pip install -q -e ".[dev]"
    $PY -m pip uninstall -q -y onnxruntime
    $PY -m pip install -q --force-reinstall --no-deps "onnxruntime-gpu>=1.31"
    $PY -m pip install -q nvidia-ml-py
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true
    PROVIDER=cuda
    DURATION=20; FACTOR=4; BUDGET=512MiB; SWAP_REPEAT=3; SWAP_SIZES=10MB,100MB,300MB
fi

run() { timeout 480 "$@"; }

# 1. Host -> device bandwidth, pinned and pageable, with explicit device buffers.
run $PY - "$PROVIDER" > "$OUT_DIR/bandwidth.json" <<'PYEOF'
import json, sys, time
import numpy as np
import onnxruntime as ort

provider = sys.argv[1]
size = 256 * 2**20 if provider == "cuda" else 64 * 2**20
host = np.ones(size, np.uint8)
times = []
for _ in range(5):
    start = time.perf_counter()
    if provider == "cuda":
        ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)  # pageable host -> device
    else:
        np.copy(host)
    times.append(time.perf_counter() - start)
best = min(times)
print(json.dumps({"provider": provider, "bytes": size, "seconds": best,
                  "gb_per_s": size / best / 1e9, "ort": ort.__version__,
                  "providers": ort.get_available_providers()}))
PYEOF
cat "$OUT_DIR/bandwidth.json"

# 2. Swap-in: staged -> loaded promotion against the same bytes' transfer.
run env EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER="$PROVIDER" \
    $PY bench/swap_in.py --repeat "$SWAP_REPEAT" --sizes "$SWAP_SIZES" \
    --json "$OUT_DIR/swap_in.json"

# 3. Density, short: the default policy against the no-over-commit baseline.
run env EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER="$PROVIDER" \
    $PY bench/density.py --factor "$FACTOR" --budget "$BUDGET" --duration "$DURATION" \
    --policies none,gdsf --json "$OUT_DIR/density.json"

# 4. Promotion time against the host->device transfer of the same bytes.
$PY - "$OUT_DIR" > "$OUT_DIR/summary.json" <<'PYEOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
bandwidth = json.loads((out / "bandwidth.json").read_text())
rows = json.loads((out / "swap_in.json").read_text())
for row in rows:
    row["transfer_s"] = row["staged_bytes"] / (bandwidth["gb_per_s"] * 1e9)
    row["promote_over_transfer"] = row["promote_s"] / row["transfer_s"]
density = json.loads((out / "density.json").read_text())
print(json.dumps({"bandwidth": bandwidth, "swap_in": rows, "density": density["report"]},
                 indent=2))
PYEOF
echo "gpu_check: results in $OUT_DIR"
