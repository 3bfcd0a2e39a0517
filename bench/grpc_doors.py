"""The cost of a gRPC call by itself: grpcio's asyncio server against its sync
server on a thread pool, and against a pure-Python HTTP/2 server (the `h2`
package, when installed), serving the same empty OIP call (ServerLive).

    python bench/grpc_doors.py [--duration 5] [--client aio|h2load]

Each server runs in its own process (asyncio, uvloop, sync with 8 threads, or
h2 on uvloop); the client (grpc.aio, or h2load from nghttp2 so that a Python
client does not decide the comparison) keeps 1 and then 16 calls in flight
against each server in turn, `--rounds` times with the order rotating, and
prints the medians of calls/s and p50 (h2load: the mean): the floor every
inference call over gRPC pays before any edgeplex code runs.
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

if kind == "h2":  # HTTP/2 framing in Python (h2), gRPC's envelope by hand
    import struct
    import uvloop
    from h2.config import H2Configuration
    from h2.connection import ConnectionState, H2Connection
    from h2.events import DataReceived, StreamEnded

    live = pb.ServerLiveResponse(live=True).SerializeToString()
    framed = b"\0" + struct.pack(">I", len(live)) + live
    head = [(":status", "200"), ("content-type", "application/grpc")]

    class H2Live(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
            self.h2.initiate_connection()
            transport.write(self.h2.data_to_send())

        def data_received(self, data):
            if self.h2.state_machine.state == ConnectionState.CLOSED:
                return  # the client said GOAWAY; what still arrives is moot
            for event in self.h2.receive_data(data):
                if isinstance(event, DataReceived):
                    self.h2.acknowledge_received_data(event.flow_controlled_length,
                                                      event.stream_id)
                elif isinstance(event, StreamEnded) and self.h2.state_machine.state != (
                    ConnectionState.CLOSED
                ):
                    self.h2.send_headers(event.stream_id, head)
                    self.h2.send_data(event.stream_id, framed)
                    self.h2.send_headers(event.stream_id, [("grpc-status", "0")],
                                         end_stream=True)
            self.transport.write(self.h2.data_to_send())

    async def serve():
        await asyncio.get_running_loop().create_server(H2Live, "127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.Event().wait()
    uvloop.run(serve())
elif kind == "sync":
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


def drive_h2load(address: str, in_flight: int, seconds: float) -> dict[str, float]:
    """h2load (nghttp2, C): `in_flight` streams over up to 4 connections."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".grpc") as body:
        body.write(b"\0\0\0\0\0")  # an empty ServerLiveRequest, length-prefixed
        body.flush()
        connections = min(in_flight, 4)
        out = subprocess.run(
            ["h2load", "-D", f"{seconds:.0f}", "-c", str(connections),
             "-m", str(max(1, in_flight // connections)), "-H", "content-type: application/grpc",
             "-H", "te: trailers", "-d", body.name,
             f"http://{address}/inference.GRPCInferenceService/ServerLive"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    rps = float(re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out).group(1))  # type: ignore[union-attr]
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out)
    value, unit = mean.groups()  # type: ignore[union-attr]
    return {"calls_per_s": rps, "p50_ms": float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", choices=["aio", "h2load"], default="aio")
    parser.add_argument("--json")
    args = parser.parse_args()
    import importlib.util

    from common import free_port

    kinds: tuple[str, ...] = ("aio", "aio-uvloop", "sync")
    if importlib.util.find_spec("h2") is not None:
        kinds += ("h2",)
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
            for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
                for in_flight in (1, 16):
                    address = f"127.0.0.1:{ports[kind]}"
                    if args.client == "h2load":
                        got = drive_h2load(address, in_flight, args.duration)
                    else:
                        got = asyncio.run(drive(address, in_flight, args.duration))
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
    print(f"empty ServerLive, {args.client} client, {args.rounds} rounds of {args.duration:g} s "
          f"per server and level; {platform.node()} {os.cpu_count()} CPUs")  # fmt: skip
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"medians": results, "runs": runs}, out, indent=2)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
