"""What Triton's system shared memory saves for large tensors, against binary HTTP
and raw gRPC, side by side in one run on one agent.

    python bench/shared_memory.py [--sizes 1,8,32] [--duration 5] [--clients 1,4]

An identity model (FP32 [1, n]) answers each request with its input. Per tensor
size (MiB) and number of closed-loop clients (each its own tritonclient, never
pausing), four ways of sending the input and getting the output back:
`http` (binary tensor extension), `grpc` (raw contents), and `http-shm`,
`grpc-shm` (input read from and output written into a registered region). Each
way runs `--duration` seconds; the rows report requests per second, the median
latency and the agent process's CPU time per request (user + system, from
/proc), and the shared-memory rows their ratio to the same protocol without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Agent

from edgeplex.agent.catalog import demo

WAYS = ("http", "grpc", "http-shm", "grpc-shm")


def agent_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Caller:
    """One closed-loop client of one way."""

    def __init__(self, agent: Agent, model: str, way: str, width: int) -> None:
        protocol, shm = way.split("-")[0], way.endswith("shm")
        self.model = model
        self.module: Any = th if protocol == "http" else tg
        url = agent.http if protocol == "http" else agent.grpc
        self.client = self.module.InferenceServerClient(url)
        self.tensor = self.module.InferInput("INPUT", [1, width], "FP32")
        self.output = self.module.InferRequestedOutput("OUTPUT")
        data = np.random.default_rng(0).random((1, width), dtype=np.float32)
        self.regions: list[shared_memory.SharedMemory] = []
        if shm:
            size = data.nbytes
            for role in ("in", "out"):
                region = shared_memory.SharedMemory(
                    f"edgeplex_bench_{uuid.uuid4().hex[:10]}", True, size
                )
                self.regions.append(region)
                self.client.register_system_shared_memory(
                    f"{region.name}-{role}", "/" + region.name, size
                )
            self.regions[0].buf[:size] = data.tobytes()
            self.tensor.set_shared_memory(f"{self.regions[0].name}-in", size)
            self.output.set_shared_memory(f"{self.regions[1].name}-out", size)
        else:
            self.tensor.set_data_from_numpy(data)  # binary over HTTP, raw over gRPC

    def call(self) -> None:
        self.client.infer(self.model, [self.tensor], outputs=[self.output])

    def close(self) -> None:
        for region in self.regions:
            self.client.unregister_system_shared_memory(f"{region.name}-in")
            self.client.unregister_system_shared_memory(f"{region.name}-out")
            region.close()
            region.unlink()
        self.client.close()


def run(
    agent: Agent, model: str, way: str, width: int, clients: int, duration: float
) -> dict[str, Any]:
    """`clients` closed loops of one way; each makes its client in its own thread
    (tritonclient's HTTP client stays on the thread that made it)."""
    latencies: list[float] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)
    stop = [0.0]

    def loop() -> None:
        mine = []
        caller = None
        try:
            caller = Caller(agent, model, way, width)
            caller.call()  # warm: the model loaded, the connection open
        except Exception as exc:
            failures.append(exc)
        ready.wait()
        try:
            while caller is not None and not failures and time.monotonic() < stop[0]:
                started = time.perf_counter()
                caller.call()
                mine.append(time.perf_counter() - started)
        except Exception as exc:  # reported below: a benchmark that failed says so
            failures.append(exc)
        finally:
            if caller is not None:
                caller.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for t in threads:
        t.start()
    stop[0] = time.monotonic() + 3600.0  # set for real once every client is warm
    ready.wait()
    cpu_before, started = agent_cpu_s(agent.proc.pid), time.monotonic()
    stop[0] = started + duration
    for t in threads:
        t.join()
    elapsed, cpu = time.monotonic() - started, agent_cpu_s(agent.proc.pid) - cpu_before
    if failures:
        raise SystemExit(f"{way}: {failures[0]!r}")
    count = len(latencies)
    return {
        "way": way,
        "clients": clients,
        "mib": width * 4 / 2**20,
        "requests": count,
        "rps": count / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "agent_cpu_ms_per_request": 1000 * cpu / max(1, count),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,8,32", help="tensor sizes in MiB")
    parser.add_argument("--clients", default="1,4")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    largest = int(max(sizes) * 2**20) // 4
    repo = Path(tempfile.mkdtemp(prefix="edgeplex-bench-shm-"))
    for mib in sizes:  # a model per size: its width is the tensor's
        demo.make_identity(repo / f"identity-{mib:g}", "FP32", width=int(mib * 2**20) // 4)
    agent = Agent(repo, max_payload_bytes=str(4 * largest + 2**20))
    rows = []
    print(f"# {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"closed loop, {args.duration:g} s per row; python bench/shared_memory.py "
          + " ".join(sys.argv[1:]))  # fmt: skip
    print("| MiB | clients | way | req/s | p50 ms | agent CPU ms/req | vs without shm |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    try:
        for mib in sizes:
            width = int(mib * 2**20) // 4
            for clients in [int(c) for c in args.clients.split(",")]:
                by_way = {}
                for way in WAYS:
                    row = run(agent, f"identity-{mib:g}", way, width, clients, args.duration)
                    by_way[way] = row
                    base = by_way.get(way.split("-")[0]) if way.endswith("shm") else None
                    if base:
                        row["rps_vs_plain"] = row["rps"] / base["rps"]
                        row["cpu_vs_plain"] = (
                            row["agent_cpu_ms_per_request"] / base["agent_cpu_ms_per_request"]
                        )
                    ratio = (f"{row['rps_vs_plain']:.2f}x req/s, {row['cpu_vs_plain']:.2f}x CPU"
                             if base else "")  # fmt: skip
                    print(f"| {mib:g} | {clients} | {way} | {row['rps']:.1f} | "
                          f"{row['p50_ms']:.2f} | {row['agent_cpu_ms_per_request']:.2f} | "
                          f"{ratio} |", flush=True)  # fmt: skip
                    rows.append(row)
    finally:
        agent.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
