"""What the agent costs over calling ONNX Runtime directly, measured side by side.

For each model and concurrency, in one run on one machine:
  direct  ONNX Runtime in one process, `concurrency` threads calling session.run;
  grpc    the agent, driven by tritonclient.grpc.aio with `concurrency` in-flight calls;
  http    the agent, driven by wrk (C) with `concurrency` connections, binary tensors;
  grpc_h2load  the agent's gRPC door driven by h2load (nghttp2, C), when installed.
It reports throughput ratios agent/direct and the p50/p99 latency the agent adds,
plus the round trip of an empty gRPC call (ServerLive) from the same client: the
floor of the Python gRPC transport on this machine.

Every load generator runs in its own process. Usage:
    python bench/agent_overhead.py --repo .cache/demo-repo [--duration 8] [--json out.json]
        [--event-loops asyncio,uvloop] [--grpc-servers native,grpcio]
        [--http-servers native,aiohttp] [--idle-spins 300,0]
        (one agent per event loop, door and runner idle spin, side by side)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
from common import Agent  # noqa: E402

from tests.support.load import binary_body  # noqa: E402

MODELS = {"mlp_small": (512, "~1 MB"), "mlp_medium": (1024, "~50 MB")}


def percentiles(latencies: list[float]) -> dict[str, float]:
    arr = np.asarray(latencies) * 1000
    return {"p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


# --- load generators (each runs as `python agent_overhead.py _<kind> ...`) ----------------


def run_direct(
    path: str, width: int, concurrency: int, duration: float, provider: str = "cpu"
) -> dict:
    """ONNX Runtime in this process: `concurrency` threads calling `run` on one session
    on `provider` ("cpu" or "cuda"), single-row inputs of `width`."""
    import onnxruntime as ort

    wanted = "CUDAExecutionProvider" if provider == "cuda" else "CPUExecutionProvider"
    session = ort.InferenceSession(path, providers=[wanted])
    if session.get_providers()[0] != wanted:
        raise SystemExit(f"the direct session runs on {session.get_providers()}, not {wanted}")
    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)
    for _ in range(20):
        session.run(None, {"input": x})
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    stop = time.perf_counter() + duration

    def worker(out: list[float]) -> None:
        while (start := time.perf_counter()) < stop:
            session.run(None, {"input": x})
            out.append(time.perf_counter() - start)

    threads = [threading.Thread(target=worker, args=(lat,)) for lat in latencies]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [v for lat in latencies for v in lat]
    return {"rps": len(flat) / (time.perf_counter() - began), **percentiles(flat)}


async def _grpc_load(url: str, model: str, width: int, concurrency: int, duration: float) -> dict:
    import tritonclient.grpc.aio as tga

    client = tga.InferenceServerClient(url)
    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)
    tensor = tga.InferInput("input", [1, width], "FP32")
    tensor.set_data_from_numpy(x)
    for _ in range(20):
        await client.infer(model, [tensor])
    live = []
    for _ in range(300):
        start = time.perf_counter()
        await client.is_server_live()
        live.append(time.perf_counter() - start)
    latencies: list[float] = []
    errors = 0
    stop = time.perf_counter() + duration

    async def worker() -> None:
        nonlocal errors
        while (start := time.perf_counter()) < stop:
            try:
                await client.infer(model, [tensor])
                latencies.append(time.perf_counter() - start)
            except Exception:
                errors += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    await client.close()
    return {
        "rps": len(latencies) / elapsed,
        "errors": errors,
        **percentiles(latencies),
        "empty_rpc_p50_ms": percentiles(live)["p50_ms"],
    }


def run_wrk(
    http_url: str,
    model: str,
    width: int,
    concurrency: int,
    duration: float,
    json_body: bool = False,
) -> dict:
    """wrk against the agent: binary tensors, or (json_body) the same tensor as JSON."""
    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)
    if json_body:
        tensor = {"name": "input", "shape": [1, width], "datatype": "FP32",
                  "data": x.ravel().tolist()}  # fmt: skip
        return _wrk(http_url, model, concurrency, duration, json.dumps({"inputs": [tensor]}), "")
    data, headers = binary_body(x, binary_output=True)
    split = int(headers["Inference-Header-Content-Length"])
    return _wrk(http_url, model, concurrency, duration, data[:split].decode(), data[split:])


def _wrk(
    http_url: str, model: str, concurrency: int, duration: float, header: str, tail: bytes | str
) -> dict:
    """wrk with `header` + `tail` as the body; a binary tail sets the header length."""
    with tempfile.NamedTemporaryFile(suffix=".bin", delete=False) as f:
        f.write(header.encode() + (tail if isinstance(tail, bytes) else tail.encode()))
        body = f.name
    length = str(len(header)) if isinstance(tail, bytes) else ""
    env = dict(os.environ, EDGEPLEX_WRK_BODY=body, EDGEPLEX_WRK_HEADER=length)
    threads = min(concurrency, 2)
    out = subprocess.run(
        [
            "wrk",
            "-t",
            str(threads),
            "-c",
            str(concurrency),
            "-d",
            f"{duration:.0f}s",
            "--latency",
            "-s",
            str(HERE / "infer.lua"),
            f"http://{http_url}/v2/models/{model}/infer",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    os.unlink(body)

    def ms(label: str) -> float:
        value, unit = re.search(rf"{label}\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": rps,
        "requests": requests,
        "p50_ms": ms("50%"),
        "p99_ms": ms("99%"),
        "errors": int(non2xx.group(1)) if non2xx else 0,
    }


def run_h2load(grpc_url: str, model: str, width: int, concurrency: int, duration: float) -> dict:
    """h2load (nghttp2, C) against the gRPC door: one pre-framed ModelInferRequest
    (binary tensor), `concurrency` streams in flight over up to 4 connections, so
    the comparison with wrk is not decided by a Python client."""
    import struct

    from edgeplex.proto import inference_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="input", datatype="FP32", shape=[1, width])
    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)
    request.raw_input_contents.append(x.tobytes())
    message = request.SerializeToString()
    connections = min(concurrency, 4)
    with tempfile.NamedTemporaryFile(suffix=".grpc", delete=False) as f:
        f.write(b"\x00" + struct.pack(">I", len(message)) + message)  # gRPC length prefix
        body = f.name
    out = subprocess.run(
        ["h2load", "-D", f"{duration:.0f}", "-c", str(connections),
         "-m", str(max(1, concurrency // connections)), "-H", "content-type: application/grpc",
         "-H", "te: trailers", "-d", body,
         f"http://{grpc_url}/inference.GRPCInferenceService/ModelInfer"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    os.unlink(body)
    rps = float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out).group(1))  # type: ignore[union-attr]
    failed = int(re.search(r"(\d+) failed", out).group(1))  # type: ignore[union-attr]
    # "time for request: min max mean sd": the mean stands in for p50 (h2load has no
    # percentiles without per-request logging).
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    value, unit = mean.groups()  # type: ignore[union-attr]
    mean_ms = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]
    return {"rps": rps, "p50_ms": mean_ms, "p99_ms": float("nan"), "errors": failed}


# --- orchestration ------------------------------------------------------------------------


def sub(kind: str, *args: object) -> dict:
    cmd = [sys.executable, __file__, f"_{kind}", *map(str, args)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--models", default="mlp_small,mlp_medium")
    parser.add_argument(
        "--event-loops",
        default="auto",
        help="comma-separated event_loop settings (auto, uvloop, asyncio): one agent each, "
        "driven in turn within each row",
    )
    parser.add_argument(
        "--grpc-servers",
        default="auto",
        help="comma-separated grpc_server settings (auto, native, grpcio): one agent each",
    )
    parser.add_argument(
        "--http-servers",
        default="auto",
        help="comma-separated http_server settings (auto, native, aiohttp): one agent each",
    )
    parser.add_argument(
        "--idle-spins",
        default="",
        help="comma-separated runner.idle_spin_us settings: one agent each (default: the "
        "agent's own default)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    has_wrk = shutil.which("wrk") is not None
    agents = {
        f"{loop}/{door}/{http}" + (f"/spin{spin}" if spin else ""): Agent(
            args.repo,
            log_level="WARNING",
            event_loop=loop,
            grpc_server=door,
            http_server=http,
            **({"runner__idle_spin_us": spin} if spin else {}),
        )
        for loop in args.event_loops.split(",")
        for door in args.grpc_servers.split(",")
        for http in args.http_servers.split(",")
        for spin in args.idle_spins.split(",")
    }
    results = []
    try:
        for model in args.models.split(","):
            width = MODELS[model][0]
            path = args.repo / model / "1" / "model.onnx"
            for c in levels:
                direct = sub("direct", path, width, c, args.duration)
                for loop, agent in agents.items():
                    row = {
                        "model": model,
                        "size": MODELS[model][1],
                        "concurrency": c,
                        "agent": loop,  # event_loop/grpc_server/http_server
                        "direct": direct,
                        "grpc": sub("grpc", agent.grpc, model, width, c, args.duration),
                    }
                    if has_wrk:
                        row["http"] = run_wrk(agent.http, model, width, c, args.duration)
                    if shutil.which("h2load"):
                        row["grpc_h2load"] = run_h2load(agent.grpc, model, width, c, args.duration)
                    results.append(row)
                    print_row(row)
    finally:
        for agent in agents.values():
            agent.stop()
    meta = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "duration_s": args.duration,
        "command": "python bench/agent_overhead.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


def print_row(row: dict) -> None:
    d = row["direct"]
    parts = [
        f"{row['model']:<10} c={row['concurrency']:<3} {row['agent']:<23} "
        f"direct {d['rps']:8.0f} rps "
        f"p50 {d['p50_ms']:.3f} ms"
    ]
    for kind in ("grpc", "grpc_h2load", "http"):
        if kind in row:
            r = row[kind]
            parts.append(
                f"{kind} {r['rps']:7.0f} rps ratio {r['rps'] / d['rps']:.2f} "
                f"p50 {r['p50_ms']:.3f} (+{r['p50_ms'] - d['p50_ms']:.3f}) "
                f"p99 {r['p99_ms']:.3f} (+{r['p99_ms'] - d['p99_ms']:.3f}) ms err {r['errors']}"
            )
    if "grpc" in row:
        parts.append(f"empty gRPC call p50 {row['grpc']['empty_rpc_p50_ms']:.3f} ms")
    print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        kind, rest = sys.argv[1], sys.argv[2:]
        if kind == "_direct":
            out = run_direct(rest[0], int(rest[1]), int(rest[2]), float(rest[3]))
        elif kind == "_grpc":
            out = asyncio.run(
                _grpc_load(rest[0], rest[1], int(rest[2]), int(rest[3]), float(rest[4]))
            )
        else:
            raise SystemExit(f"unknown {kind}")
        print(json.dumps(out))
    else:
        main()
