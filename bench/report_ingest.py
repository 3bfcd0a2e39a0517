"""Report ingestion: load reports per second one control-plane process sustains.

    python bench/report_ingest.py [--sites 200] [--models 20] [--duration 10]

Starts real Redis, mosquitto and `edgeplex control-plane`, registers `--sites`
sites through AgentService, then a load generator (a separate process) streams
LoadReports with `--models` models each over one stream per site as fast as
the control plane takes them. Reported: reports/s received, the control
plane's CPU seconds over the run (from /proc), and reports per CPU-second of
the control plane ("per core"). Goal: at least 5,000 per core.
The generator shares the machine's cores, so the wall-clock rate is lower
than what the control plane alone could take.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import cpu_seconds, free_port  # noqa: E402

from edgeplex.proto import edgeplex_control_pb2 as pb  # noqa: E402
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc  # noqa: E402
from tests.services import ControlPlane, Mosquitto, RedisServer  # noqa: E402


def reports_counter(http_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics").read().decode()
    match = re.search(r"^edgeplex_cp_reports_total (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def generator(address: str, sites: int, models: int, duration: float, streams: int) -> None:
    import grpc

    async def run() -> None:
        channel = grpc.aio.insecure_channel(address)
        stub = pb_grpc.AgentServiceStub(channel)
        deadline = time.monotonic() + duration

        async def stream(first: int) -> None:
            ids = list(range(first, sites, streams))
            template = [
                pb.ModelLoad(name=f"m{j}", rate_by_region={"r0": 1.0, "r1": 0.5}, p50_ms=3.0,
                             p99_ms=9.0, tier="loaded", memory_bytes=1 << 20, state="READY")
                for j in range(models)
            ]  # fmt: skip
            reports = [
                pb.LoadReport(site_id=f"s{i}", models=template, devices=[pb.DeviceLoad(index=0)])
                for i in ids
            ]

            async def gen():  # type: ignore[no-untyped-def]
                k = 0
                while time.monotonic() < deadline:
                    yield reports[k % len(reports)]
                    k += 1

            await stub.Report(gen())

        await asyncio.gather(*(stream(i) for i in range(streams)))
        await channel.close()

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=200)
    parser.add_argument("--models", type=int, default=20)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=8)
    args = parser.parse_args()
    import grpc

    with tempfile.TemporaryDirectory(prefix="edgeplex-ingest-") as d:
        work = Path(d)
        redis, mqtt = RedisServer(work), Mosquitto(work)
        redis.start()
        mqtt.start()
        http_port = free_port()
        cp = ControlPlane(
            work,
            redis,
            mqtt.url(),
            EDGEPLEX_CP_HTTP_PORT=str(http_port),
            EDGEPLEX_CP_PLACEMENT_INTERVAL_S="5",
            EDGEPLEX_CP_LOG_LEVEL="WARNING",
            # Sites register without join tokens: this measures ingestion, not joins
            # (bench/fleet_scale.py runs the same with a token and broker user each).
            EDGEPLEX_CP_OPEN_REGISTRATION="true",
        )
        cp.start()
        try:
            with grpc.insecure_channel(cp.address) as channel:
                stub = pb_grpc.AgentServiceStub(channel)
                for i in range(args.sites):
                    stub.Register(pb.RegisterRequest(site_id=f"s{i}", region=f"r{i % 4}",
                                                     address=f"10.0.0.{i % 250}:8001"))  # fmt: skip
            assert cp.process is not None
            before_n, before_cpu = reports_counter(http_port), cpu_seconds(cp.process.pid)
            started = time.monotonic()
            gen = multiprocessing.get_context("spawn").Process(
                target=generator,
                args=(cp.address, args.sites, args.models, args.duration, args.streams),
            )
            gen.start()
            gen.join()
            elapsed = time.monotonic() - started
            time.sleep(0.3)  # the write-behind flush
            received = reports_counter(http_port) - before_n
            cpu = cpu_seconds(cp.process.pid) - before_cpu
        finally:
            cp.stop()
            mqtt.stop()
            redis.stop()
    print(
        f"# report ingestion: {args.sites} sites, {args.models} models per report, "
        f"{args.streams} streams, {args.duration:g} s, {os.cpu_count()} CPUs shared with the "
        f"generator; real Redis {redis.port}"
    )
    per_core = received / cpu if cpu else float("nan")
    print(
        f"received {received:.0f} reports in {elapsed:.1f} s = {received / elapsed:.0f}/s; "
        f"control plane CPU {cpu:.2f} s -> {per_core:.0f} reports per CPU-second "
        f"(goal >= 5000: {'met' if per_core >= 5000 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
