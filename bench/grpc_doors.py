"""The cost of a gRPC call by itself: grpcio's asyncio server against its sync
server on a thread pool, serving the same empty OIP call (ServerLive).

    python bench/grpc_doors.py [--duration 5]

Each server runs in its own process (asyncio, uvloop, or sync with 8 threads);
the client (grpc.aio) keeps 1 and then 16 calls in flight against each server
in turn, `--rounds` times with the order rotating, and prints the medians of
calls/s and p50: the floor every inference call over gRPC pays before any
edgeplex code runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SERVER = r"""
import asyncio, sys
from concurrent import futures
import grpc
from edgeplex.proto import inference_pb2 as pb, inference_pb2_grpc as pb_grpc

kind, port = sys.argv[1], int(sys.argv[2])

class Live(pb_grpc.GRPCInferenceServiceServicer):
    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

class AioLive(pb_grpc.GRPCInferenceServiceServicer):
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

if kind == "sync":
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Live(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()
else:
    async def main():
        server = grpc.aio.server()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(AioLive(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()
    if kind == "aio-uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())
"""


async def drive(address: str, in_flight: int, seconds: float) -> dict[str, float]:
    import grpc

    from edgeplex.proto import inference_pb2 as pb
    from edgeplex.proto import inference_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(200):
            await stub.ServerLive(pb.ServerLiveRequest())
        latencies: list[float] = []
        stop = time.perf_counter() + seconds

        async def caller() -> None:
            while (start := time.perf_counter()) < stop:
                await stub.ServerLive(pb.ServerLiveRequest())
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(caller() for _ in range(in_flight)))
    return {
        "calls_per_s": len(latencies) / seconds,
        "p50_ms": float(np.percentile(latencies, 50) * 1000),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    from common import free_port

    kinds = ("aio", "aio-uvloop", "sync")
    servers, ports = {}, {}
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        for kind in kinds:
            ports[kind] = free_port()
            servers[kind] = subprocess.Popen([sys.executable, "-c", SERVER, kind,
                                              str(ports[kind])], stdout=subprocess.PIPE,
                                             text=True)  # fmt: skip
            out = servers[kind].stdout
            assert out is not None and out.readline().strip() == "ready"
        for r in range(args.rounds):  # all servers up; each driven in turn, order rotating
            for kind in kinds[r % 3 :] + kinds[: r % 3]:
                for in_flight in (1, 16):
                    got = asyncio.run(drive(f"127.0.0.1:{ports[kind]}", in_flight, args.duration))
                    runs.setdefault(f"{kind} c={in_flight}", []).append(got)
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(10)
    results = {}
    for key, got in runs.items():
        results[key] = {
            "calls_per_s": statistics.median(g["calls_per_s"] for g in got),
            "p50_ms": statistics.median(g["p50_ms"] for g in got),
        }
        print(f"{key:<16} {results[key]['calls_per_s']:8.0f} calls/s  "
              f"p50 {results[key]['p50_ms']:.3f} ms  (medians of {len(got)})")  # fmt: skip
    print(f"empty ServerLive, grpc.aio client, {args.rounds} rounds of {args.duration:g} s per "
          f"server and level; {platform.node()} {os.cpu_count()} CPUs")  # fmt: skip
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"medians": results, "runs": runs}, out, indent=2)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
