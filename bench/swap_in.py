"""Staged -> loaded promotion time against a memcpy of the same bytes, in one run.

For models of about 10, 100 and 300 MB, through a real agent: load each once
(cached -> staged -> loaded), then `repeat` times demote it to staged and send a
request, reading the promotion's stages (create + warm-up, measured in the
runner) from /edgeplex/v1/status. In the same process and run, it times a
memcpy of the staged bytes into an already-touched buffer (the physical limit
on a CPU), and a naive session creation from the original model bytes.
Both runner modes are measured: prepack_weights=true (the default) and false.

    python bench/swap_in.py [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Agent

from edgeplex.agent.catalog import demo

# name: (width, layers) of the generated MLP. "2GB" stays just under protobuf's 2 GiB
# limit on one model file.
SIZES = {
    "10MB": (512, 10),
    "100MB": (1024, 24),
    "300MB": (2048, 18),
    "500MB": (2048, 30),
    "2GB": (4096, 30),
}


def memcpy_s(nbytes: int, repeat: int) -> float:
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return min(times)


def naive_create_s(path: Path) -> float:
    import onnxruntime as ort

    data = path.read_bytes()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    start = time.perf_counter()
    ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--sizes", default="10MB,100MB,300MB", help="subset of " + ",".join(SIZES))
    parser.add_argument(
        "--no-naive", action="store_true", help="skip the naive session creation from bytes"
    )
    args = parser.parse_args()
    sizes = {name: SIZES[name] for name in args.sizes.split(",")}
    repo = Path(tempfile.mkdtemp(prefix="edgeplex-swapin-"))
    with concurrent.futures.ProcessPoolExecutor() as pool:  # the 2 GB one takes a while
        jobs = [
            pool.submit(demo.make_mlp, repo / f"m{name}", width, layers, 0, None, 64)
            for name, (width, layers) in sizes.items()
        ]
        for job in jobs:
            job.result()
    x = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}
    rows = []
    for prepack in ("true", "false"):
        agent = Agent(repo, load_models_at_start="false", runner__prepack_weights=prepack)
        try:
            for name in sizes:
                model = f"m{name}"
                assert agent.post(f"/v2/models/{model}/infer", x) == 200
                promote, breakdown = [], []
                for _ in range(args.repeat):
                    assert (
                        agent.post(f"/edgeplex/v1/models/{model}/demote", {"tier": "staged"}) == 200
                    )
                    assert agent.post(f"/v2/models/{model}/infer", x) == 200
                    last = agent.status()[model]["last_promotion"]
                    breakdown.append(last["stages_ms"])
                    promote.append(sum(last["stages_ms"].values()) / 1000)
                staged = agent.status()[model]["staged_bytes"]
                copy = memcpy_s(staged, args.repeat)
                naive = 0.0 if args.no_naive else naive_create_s(repo / model / "1" / "model.onnx")
                row = {
                    "model": name,
                    "prepack_weights": prepack == "true",
                    "staged_bytes": staged,
                    "promote_s": statistics.median(promote),
                    "memcpy_s": copy,
                    "naive_create_s": naive,
                    "ratio": statistics.median(promote) / copy,
                    "naive_ratio": naive / copy,
                    "provider": last.get("provider", "cpu"),
                    "stages_ms": {
                        stage: statistics.median(b.get(stage, 0.0) for b in breakdown)
                        for stage in breakdown[-1]
                    },
                }
                rows.append(row)
                print(
                    f"{name:>6} prepack={prepack:<5} staged {staged / 1e6:7.1f} MB  "
                    f"promote {row['promote_s'] * 1000:8.1f} ms  memcpy {copy * 1000:6.1f} ms"
                    f"  ratio {row['ratio']:5.1f}x  (naive create {naive * 1000:7.1f} ms ="
                    f" {row['naive_ratio']:5.1f}x)",
                    flush=True,
                )
        finally:
            agent.stop()
    print(json.dumps({"command": "python bench/swap_in.py " + " ".join(sys.argv[1:])}))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
