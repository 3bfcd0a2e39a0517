"""edgeplex against Seldon MLServer on the same catalog and clients, in one run.

    python bench/peers.py [--models 16] [--rounds 3] [--duration 5]

The catalog: `--models` MLPs (`--width` wide, 512 by default; 3 layers, FP32),
all resident in both.
MLServer 1.7.1 runs from its own virtual environment (.cache/peers/mlserver,
made once; uvloop below 0.22, which its default worker needs to start) with a minimal
ONNX Runtime model class, its default settings otherwise (one parallel
worker). Each round drives both servers in turn with:
  closed-8   8 closed-loop HTTP clients (aiohttp, in their own process), JSON
             bodies, each call to the next model of the catalog;
  wrk-json   wrk, 16 connections, JSON bodies, one model;
  wrk-binary wrk, 16 connections, binary tensors, one model (edgeplex only:
             MLServer's REST door has no binary tensor extension);
and direct ONNX Runtime (8 threads calling session.run, one process) gives the
ceiling. It prints the medians and the ratios edgeplex/MLServer and
edgeplex/direct.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from agent_overhead import run_direct, run_wrk  # noqa: E402
from common import Agent  # noqa: E402

from edgeplex.agent.catalog import demo  # noqa: E402
from edgeplex.net import free_ports  # noqa: E402

MLSERVER = ROOT / ".cache" / "peers" / "mlserver"
MODEL_CLASS = """
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        self.session = ort.InferenceSession(self.settings.parameters.uri,
                                            providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        y = self.session.run(None, {self.input: x})[0]
        return InferenceResponse(model_name=self.name,
                                 outputs=[NumpyCodec.encode_output("output", y)])
"""

CLIENT = r"""
import asyncio, json, sys, time
import aiohttp

base, models, body, seconds = sys.argv[1], sys.argv[2].split(","), sys.argv[3], float(sys.argv[4])
data = open(body, "rb").read()

async def main():
    done = errors = 0
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:
        async def client(i):
            nonlocal done, errors
            n = i
            while time.perf_counter() < stop:
                url = f"{base}/v2/models/{models[n % len(models)]}/infer"
                n += 1
                async with session.post(url, data=data,
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                    else:
                        errors += 1
        await asyncio.gather(*(client(i) for i in range(8)))
    print(json.dumps({"rps": done / seconds, "errors": errors}))

asyncio.run(main())
"""


def mlserver_python() -> Path:
    python = MLSERVER / "bin" / "python"
    if not python.exists():
        print("installing MLServer 1.7.1 into .cache/peers/mlserver (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(MLSERVER)], check=True)
        env = dict(os.environ, PIP_CACHE_DIR=str(ROOT / ".cache" / "pip"))
        subprocess.run([str(python), "-m", "pip", "install", "-q", "mlserver==1.7.1",
                        "uvloop<0.22", "onnxruntime", "numpy"], check=True, env=env)  # fmt: skip
    return python


class MLServer:
    def __init__(self, repo: Path, models: list[str], work: Path) -> None:
        root = work / "mlserver"
        self.http_port, grpc_port, metrics_port = free_ports(3)
        root.mkdir()
        (root / "settings.json").write_text(json.dumps({
            "http_port": self.http_port, "grpc_port": grpc_port, "metrics_port": metrics_port,
        }))  # fmt: skip
        for name in models:
            (root / name).mkdir()
            (root / name / "model.py").write_text(MODEL_CLASS)
            (root / name / "model-settings.json").write_text(json.dumps({
                "name": name, "implementation": "model.OnnxModel",
                "parameters": {"uri": str(repo / name / "1" / "model.onnx")},
            }))  # fmt: skip
        self.log = work / "mlserver.log"
        self.proc = subprocess.Popen(
            [str(MLSERVER / "bin" / "mlserver"), "start", str(root)],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=root,
        )  # fmt: skip
        self.http = f"127.0.0.1:{self.http_port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"MLServer exited: {self.log.read_text()[-3000:]}")
            try:
                url = f"http://{self.http}/v2/models/{models[-1]}/ready"
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise SystemExit("MLServer not ready in 180 s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def closed_loop(http: str, models: list[str], body: Path, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, f"http://{http}", ",".join(models), str(body), str(seconds)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(out)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--width", type=int, default=512, help="1024: about 13 MB a model")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    width = args.width
    mlserver_python()
    names = [f"m{i:02d}" for i in range(args.models)]
    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)
    tensor = {"name": "input", "shape": [1, width], "datatype": "FP32", "data": x.ravel().tolist()}
    results: dict[str, dict[str, list[float]]] = {}

    def record(workload: str, server: str, rps: float) -> None:
        results.setdefault(workload, {}).setdefault(server, []).append(rps)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        repo = work / "repo"
        for i, name in enumerate(names):
            demo.make_mlp(repo / name, width=width, layers=3, in_width=width, seed=i)
        body = work / "body.json"
        body.write_text(json.dumps({"inputs": [tensor]}))
        budget = str(64 * 1024**2 * args.models)
        servers: dict[str, object] = {"edgeplex": Agent(repo, device_memory_budget=budget)}
        try:
            for name in names:
                servers["edgeplex"].post(f"/v2/repository/models/{name}/load")  # type: ignore[attr-defined]
            servers["mlserver"] = MLServer(repo, names, work)
            for r in range(args.rounds):
                order = ["edgeplex", "mlserver"] if r % 2 == 0 else ["mlserver", "edgeplex"]
                for server in order:
                    http = servers[server].http  # type: ignore[attr-defined]
                    got = closed_loop(http, names, body, args.duration)
                    if got["errors"]:
                        raise SystemExit(f"{server}: {got['errors']} failed requests")
                    record("closed-8 json", server, got["rps"])
                    wrk = run_wrk(http, names[0], width, 16, args.duration, json_body=True)
                    record("wrk-16 json", server, wrk["rps"])
                    if server == "edgeplex":
                        wrk = run_wrk(http, names[0], width, 16, args.duration)
                        record("wrk-16 binary", server, wrk["rps"])
                model = repo / names[0] / "1" / "model.onnx"
                record("direct ORT, 8 threads", "direct",
                       run_direct(str(model), width, 8, args.duration)["rps"])  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()  # type: ignore[attr-defined]
    how = (
        f"{args.models} MLPs ({width} wide, 3 layers, FP32) all resident; {args.rounds} rounds "
        f"of {args.duration:g} s, servers alternating; {platform.node()} {os.cpu_count()} CPUs; "
        "python bench/peers.py " + " ".join(sys.argv[1:])
    )
    print(how)
    direct = statistics.median(results["direct ORT, 8 threads"]["direct"])
    report: dict[str, object] = {"how": how, "direct_rps": direct}
    for workload, by_server in results.items():
        if workload.startswith("direct"):
            continue
        medians = {s: statistics.median(v) for s, v in by_server.items()}
        line = f"{workload:<14} " + "  ".join(f"{s} {v:7.0f} rps" for s, v in medians.items())
        ratios = {"edgeplex/direct": medians["edgeplex"] / direct}
        if "mlserver" in medians:
            ratios["edgeplex/mlserver"] = medians["edgeplex"] / medians["mlserver"]
        line += "  " + "  ".join(f"{k} {v:.2f}" for k, v in ratios.items())
        print(line)
        report[workload] = {"rps": medians, "runs": by_server, **ratios}
    print(f"direct ORT, 8 threads: {direct:.0f} rps")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
