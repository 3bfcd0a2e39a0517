"""Host-to-device bandwidth, pinned and pageable, through the CUDA runtime itself.

    python bench/h2d_bandwidth.py [--mib 256] [--repeat 5] [--device 0] [--dry-run]

Calls libcudart with ctypes (the `nvidia-*` runtime packages provide it; no
torch, no cupy): one explicit device buffer of `--mib` MiB, filled from a pinned
host buffer (cudaMallocHost) and from ordinary pageable memory, `--repeat`
times each. It never asks for managed (unified) memory, and refuses a size
over half the device's free memory. Prints one JSON object: the best and the
median GB/s of each kind. `--dry-run` times a host memcpy instead, so the script
runs where there is no GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import statistics
import sys
import time

import numpy as np

H2D = 1  # cudaMemcpyHostToDevice


def cudart() -> ctypes.CDLL:
    """The CUDA runtime: from the nvidia-* wheels on sys.path, else the system's."""
    candidates = []
    for root in sys.path:
        candidates += sorted(glob.glob(os.path.join(root, "nvidia", "**", "libcudart.so*"),
                                       recursive=True))  # fmt: skip
    candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SystemExit("no CUDA runtime (libcudart) found")


def check(code: int, what: str) -> None:
    if code != 0:
        raise SystemExit(f"{what} failed with CUDA error {code}")


def rates(nbytes: int, times: list[float]) -> dict[str, float]:
    return {
        "best_gb_per_s": nbytes / min(times) / 1e9,
        "median_gb_per_s": nbytes / statistics.median(times) / 1e9,
    }


def measure_gpu(nbytes: int, repeat: int, device: int) -> dict[str, object]:
    rt = cudart()
    check(rt.cudaSetDevice(device), "cudaSetDevice")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "cudaMemGetInfo")
    if nbytes > free.value // 2:
        raise SystemExit(f"{nbytes} bytes is over half the device's free {free.value}")
    dev, pinned = ctypes.c_void_p(), ctypes.c_void_p()
    check(rt.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(nbytes)), "cudaMalloc")
    check(rt.cudaMallocHost(ctypes.byref(pinned), ctypes.c_size_t(nbytes)), "cudaMallocHost")
    pageable = np.ones(nbytes, np.uint8)
    ctypes.memset(pinned, 1, nbytes)
    out: dict[str, object] = {"device": device, "device_free_bytes": free.value}
    try:
        for kind, source in (("pinned", pinned.value), ("pageable", pageable.ctypes.data)):
            times = []
            for _ in range(repeat + 1):  # the first copy pays for mappings: not counted
                start = time.perf_counter()
                check(rt.cudaMemcpy(dev, ctypes.c_void_p(source), ctypes.c_size_t(nbytes), H2D),
                      "cudaMemcpy")  # fmt: skip
                check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
                times.append(time.perf_counter() - start)
            out[kind] = rates(nbytes, times[1:])
    finally:
        rt.cudaFreeHost(pinned)
        rt.cudaFree(dev)
    return out


def measure_host(nbytes: int, repeat: int) -> dict[str, object]:
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    host = rates(nbytes, times[1:])
    return {"device": None, "pinned": host, "pageable": host}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="a host memcpy, no GPU")
    args = parser.parse_args()
    nbytes = args.mib * 2**20
    if args.dry_run:
        result = measure_host(nbytes, args.repeat)
    else:
        result = measure_gpu(nbytes, args.repeat, args.device)
    result |= {
        "bytes": nbytes,
        "kind": "host memcpy (dry run)" if args.dry_run else "cudaMemcpy host to device",
        "command": "python bench/h2d_bandwidth.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
