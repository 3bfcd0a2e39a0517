"""Tensors through the runners' shared rings against the same tensors over their
sockets, side by side in one run.

Two agents serve one identity model whose rows are image-sized (default
3x224x224 FP32, 588 KiB in and out): one with the shared rings (the default),
one with `runner.shared_memory_bytes: 0`. wrk drives each in turn with binary
tensors, in alternating rounds, at a fixed number of connections; the report
gives req/s, p50 and p99 per transport, the shared/socket ratio, and the tensor
bytes each agent counted per path (so the comparison shows which path served).

    python bench/shm_transport.py [--width 150528] [--rounds 3] [--duration 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from agent_overhead import _wrk  # noqa: E402
from common import Agent, metric_sum  # noqa: E402

from edgeplex.agent.catalog import demo  # noqa: E402


def body(width: int) -> tuple[str, bytes]:
    import numpy as np

    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)
    header = {
        "inputs": [
            {
                "name": "INPUT",
                "shape": [1, width],
                "datatype": "FP32",
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
    }
    return json.dumps(header), x.tobytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=3 * 224 * 224, help="FP32 values per row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", default="1,8", help="wrk connections to measure")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk (apt install wrk)")
    repo = Path(".cache/bench-shm") / str(args.width)
    if not (repo / "wide").exists():
        demo.make_identity(repo / "wide", "FP32", width=args.width)
    header, tail = body(args.width)
    agents = {
        "shared": Agent(repo),
        "socket": Agent(repo, runner__shared_memory_bytes="0"),
    }
    rows: dict[tuple[str, int], list[dict]] = {}
    try:
        for agent in agents.values():  # load and warm both before measuring
            _wrk(agent.http, "wide", 2, 1, header, tail)
        for _ in range(args.rounds):
            for c in (int(x) for x in args.connections.split(",")):
                for name, agent in agents.items():
                    result = _wrk(agent.http, "wide", c, args.duration, header, tail)
                    rows.setdefault((name, c), []).append(result)
                    time.sleep(0.5)
        paths = {
            name: {
                path: metric_sum(agent.metrics(), "edgeplex_runner_tensor_bytes_total", path=path)
                for path in ("shared", "socket")
            }
            for name, agent in agents.items()
        }
    finally:
        for agent in agents.values():
            agent.stop()

    print(
        f"identity model, one FP32 row of {args.width} values ({args.width * 4 / 1024:.0f} KiB "
        f"in and out), wrk binary tensors, {args.rounds} alternating rounds of "
        f"{args.duration:.0f} s; medians"
    )
    report = {"width": args.width, "rounds": args.rounds, "duration_s": args.duration}
    for c in sorted({c for _, c in rows}):
        med = {
            name: {k: statistics.median(r[k] for r in rows[name, c]) for k in ("rps", "p50_ms")}
            for name in agents
        }
        ratio = med["shared"]["rps"] / med["socket"]["rps"]
        print(
            f"c={c}: shared rings {med['shared']['rps']:.0f} req/s (p50 "
            f"{med['shared']['p50_ms']:.2f} ms), socket {med['socket']['rps']:.0f} req/s (p50 "
            f"{med['socket']['p50_ms']:.2f} ms): shared/socket {ratio:.2f}"
        )
        report[f"c{c}"] = {**med, "ratio": ratio}
        errors = sum(r["errors"] for name in agents for r in rows[name, c])
        if errors:
            print(f"  {errors} non-2xx responses")
    for name, by_path in paths.items():
        print(f"tensor bytes through the {name} agent: " + json.dumps(by_path))
    report["tensor_bytes"] = paths
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
