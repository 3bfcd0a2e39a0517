"""The agent against ONNX Runtime called directly, on one execution provider.

    python bench/gpu_serving.py [--provider cuda] [--width 4096 --layers 8]
                                [--concurrency 1,16] [--duration 10] [--json FILE]

One generated MLP (`--layers` Gemm layers of `--width`, FP32, single-row
requests, `max_batch_size: 16`), side by side in one run:
- **direct**: one ONNX Runtime session on the provider, `c` threads calling
  `run` in this process;
- **agent**: the same model in an agent whose runners use the provider, driven
  over HTTP (binary tensors) by `c` closed-loop callers spread over
  `--processes` client processes, so that no single Python client is the
  limit.
Prints per concurrency the throughput of each, their ratio and the p50
latencies. Needs no tool beyond Python (the GPU machine has no wrk).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_overhead import run_direct
from common import Agent
from density_closed_loop import IN_WIDTH, request_body

from edgeplex.agent.catalog import demo


def _client(args: tuple[str, int, float]) -> tuple[list[float], float]:
    """One client process: `callers` closed-loop callers for `duration` seconds; their
    latencies and the seconds they ran."""
    import aiohttp

    url, callers, duration = args
    body, headers = request_body()  # one row, binary tensors, as the density benchmark sends

    async def main() -> tuple[list[float], float]:
        out: list[float] = []
        began = time.perf_counter()
        stop = began + duration
        connector = aiohttp.TCPConnector(limit=callers)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def caller() -> None:
                while (start := time.perf_counter()) < stop:
                    async with session.post(url, data=body, headers=headers) as reply:
                        await reply.read()
                        if reply.status != 200:
                            raise SystemExit(f"agent answered {reply.status}")
                    out.append(time.perf_counter() - start)

            await asyncio.gather(*(caller() for _ in range(callers)))
        return out, time.perf_counter() - began

    return asyncio.run(main())


def through_agent(agent: Agent, concurrency: int, processes: int, duration: float) -> dict:
    url = f"http://{agent.http}/v2/models/mlp/infer"
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    jobs = [(url, n, duration) for n in shares if n]
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        results = pool.map(_client, jobs)
    flat = np.array([v for latencies, _ in results for v in latencies])
    rps = sum(len(latencies) / elapsed for latencies, elapsed in results)
    return {"rps": rps, "p50_ms": _p50(flat)}


def _p50(seconds: np.ndarray) -> float:
    return float(np.percentile(seconds, 50) * 1000) if len(seconds) else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--processes", type=int, default=4, help="client processes")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="edgeplex-gpu-serving-"))
    demo.make_mlp(repo / "mlp", width=args.width, layers=args.layers, in_width=IN_WIDTH,
                  config="max_batch_size: 16\n")  # fmt: skip
    path = repo / "mlp" / "1" / "model.onnx"
    agent = Agent(repo, runner__execution_provider=args.provider, load_models_at_start="true")
    rows = []
    try:
        promotion = agent.status()["mlp"]["last_promotion"]
        if promotion.get("provider", "cpu") != args.provider:
            raise SystemExit(f"the agent's model runs on {promotion}, not {args.provider}")
        for c in [int(v) for v in args.concurrency.split(",")]:
            row = {
                "concurrency": c,
                "direct": run_direct(str(path), IN_WIDTH, c, args.duration, args.provider),
                "agent": through_agent(agent, c, min(c, args.processes), args.duration),
            }
            row["ratio"] = row["agent"]["rps"] / row["direct"]["rps"]
            rows.append(row)
            print(
                f"c={c:<3} direct {row['direct']['rps']:8.0f} req/s p50 "
                f"{row['direct']['p50_ms']:.3f} ms | agent {row['agent']['rps']:8.0f} req/s "
                f"p50 {row['agent']['p50_ms']:.3f} ms | agent/direct {row['ratio']:.2f}",
                flush=True,
            )
    finally:
        agent.stop()
    meta = {
        "provider": args.provider,
        "model_bytes": path.stat().st_size,
        "machine": platform.machine(),
        "command": "python bench/gpu_serving.py " + " ".join(sys.argv[1:]),
    }
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
