"""Where the agent's time goes: py-spy samples the agent and a runner while a named
workload drives the agent, and the samples become a per-function table.

    python bench/profile_agent.py --workload http-binary [--duration 10] [--out DIR]

Workloads (one MLP, 512 wide, 3 layers, single-row requests, all resident):
  http-binary  wrk, 8 connections, binary tensors (the binary data extension)
  http-json    wrk, 8 connections, the same tensor as JSON
  grpc         tritonclient.grpc.aio, 8 calls in flight
(`--in-flight N` changes the 8).
For each process it writes DIR/<process>.txt: the share of samples in which each
function is on the stack (total) and at the top (self), busiest first, and how
busy each thread was (its active samples against a thread never idle); and
DIR/<process>.folded, the folded stacks for a flame graph tool. py-spy runs
with --nonblocking, so the processes are not paused to be sampled.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from agent_overhead import run_wrk  # noqa: E402
from common import Agent  # noqa: E402

from edgeplex.agent.catalog import demo  # noqa: E402

WIDTH = 512
CONCURRENCY = 8


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def grpc_load(
    url: str, duration: float, in_flight: int = CONCURRENCY, model: str = "mlp"
) -> dict[str, float]:
    import tritonclient.grpc.aio as grpcclient

    async def main() -> int:
        client = grpcclient.InferenceServerClient(url)
        x = np.random.default_rng(0).standard_normal((1, WIDTH), dtype=np.float32)
        inputs = [grpcclient.InferInput("input", [1, WIDTH], "FP32")]
        inputs[0].set_data_from_numpy(x)
        stop = time.perf_counter() + duration
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await client.infer(model, inputs)
                done += 1

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        await client.close()
        return done

    served = asyncio.run(main())
    return {"rps": served / duration, "requests": served}


def grpc_stream_load(
    url: str, duration: float, in_flight: int = CONCURRENCY, model: str = "mlp"
) -> dict[str, float]:
    """One gRPC stream (ModelStreamInfer) with `in_flight` requests outstanding on it,
    closed-loop: a request goes out as each answer comes back."""
    import tritonclient.grpc.aio as grpcclient

    async def main() -> int:
        client = grpcclient.InferenceServerClient(url)
        x = np.random.default_rng(0).standard_normal((1, WIDTH), dtype=np.float32)
        inputs = [grpcclient.InferInput("input", [1, WIDTH], "FP32")]
        inputs[0].set_data_from_numpy(x)
        room = asyncio.Semaphore(in_flight)
        stop = time.perf_counter() + duration

        async def requests():  # type: ignore[no-untyped-def]
            while True:
                await room.acquire()
                if time.perf_counter() >= stop:
                    return
                yield {"model_name": model, "inputs": inputs}

        done = 0
        async for _result, error in client.stream_infer(requests()):
            if error is not None:
                raise error
            done += 1
            room.release()
        await client.close()
        return done

    served = asyncio.run(main())
    return {"rps": served / duration, "requests": served}


def summarise(folded: Path, expected: float) -> tuple[str, dict[str, float]]:
    """Per-function total and self shares of the active samples in a folded-stacks
    file ("thread (tid): name;frame;...;frame count"); `expected` is the number of
    samples a thread busy all the time would have given."""
    total: collections.Counter[str] = collections.Counter()
    top: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        thread, *frames = stack.split(";")
        threads[thread.split(": ", 1)[-1]] += count
        samples += count
        for name in set(frames):
            total[name] += count
        if frames:
            top[frames[-1]] += count
    busy = {name: count / expected for name, count in threads.most_common()}
    lines = [
        f"{samples} active samples; busy share of each thread: "
        + ", ".join(f"{name} {100 * share:.0f}%" for name, share in busy.items()),
        "",
        f"{'total %':>8} {'self %':>8}  function (shares of the active samples)",
    ]
    for name, count in total.most_common(60):
        lines.append(f"{100 * count / samples:8.1f} {100 * top[name] / samples:8.1f}  {name}")
    lines += ["", f"{'self %':>8}  function, by self time"]
    for name, count in top.most_common(30):
        lines.append(f"{100 * count / samples:8.1f}  {name}")
    return "\n".join(lines) + "\n", {
        "active_samples": samples,
        **{f"busy_{name}": round(share, 3) for name, share in busy.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["http-binary", "http-json", "grpc"],
                        default="http-binary")  # fmt: skip
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples a second")
    parser.add_argument("--in-flight", type=int, default=CONCURRENCY, help="calls in flight")
    parser.add_argument(
        "--native",
        action="store_true",
        help="sample C frames too (py-spy --native; pauses the agent "
        "for each sample, which overstates system calls)",
    )
    parser.add_argument("--out", type=Path, default=Path(".cache/profile"))
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        repo = Path(work) / "repo"
        demo.make_mlp(repo / "mlp", width=WIDTH, layers=3, in_width=WIDTH)
        agent = Agent(repo)
        try:
            agent.post("/v2/repository/models/mlp/load")
            (zygote,) = children(agent.proc.pid)
            runners = children(zygote)
            targets = {"agent": agent.proc.pid}
            if not args.native:  # py-spy cannot unwind a sandboxed runner's C frames
                targets |= {f"runner-{p}": p for p in runners[:1]}
            spies = {
                name: subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(pid),
                        "--rate",
                        str(args.rate),
                        "--duration",
                        str(int(args.duration)),
                        "--format",
                        "raw",
                        # Native stacks need the process paused for each sample.
                        "--native" if args.native else "--nonblocking",
                        "--threads",
                        "--output",
                        str(args.out / f"{name}.folded"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                for name, pid in targets.items()
            }
            time.sleep(0.5)  # py-spy attached
            if args.workload == "grpc":
                load = grpc_load(agent.grpc, args.duration, args.in_flight)
            else:
                load = run_wrk(agent.http, "mlp", WIDTH, args.in_flight, args.duration,
                               json_body=args.workload == "http-json")  # fmt: skip
            for name, proc in spies.items():
                _, err = proc.communicate(timeout=60)
                if proc.returncode != 0:
                    raise SystemExit(f"py-spy on {name} failed: {err.decode()[-1000:]}")
        finally:
            agent.stop()
    how = (
        f"{args.workload}, {args.in_flight} in flight, {args.duration:g} s, py-spy {args.rate}/s "
        f"--nonblocking; {platform.node()} {os.cpu_count()} CPUs"
    )
    report: dict[str, object] = {"how": how, "load": load}
    print(how)
    print(f"load: {json.dumps(load)}")
    for name in spies:
        text, figures = summarise(args.out / f"{name}.folded", args.rate * int(args.duration))
        (args.out / f"{name}.txt").write_text(f"{how}\n{text}")
        report[name] = figures
        print(f"\n== {name} ==")
        print("\n".join(text.splitlines()[:28]))
    (args.out / "profile.json").write_text(json.dumps(report, indent=2))
    print(f"\nwritten to {args.out}/")


if __name__ == "__main__":
    main()
