"""This checkout against another revision, side by side in one run.

    python bench/ab.py --base <git revision> [--rounds 3] [--duration 5]

The base revision is checked out as a git worktree under .cache/ab/<sha> with a
virtual environment of its own (made once, reused). One agent of each serves
the same repository (one MLP, 512 wide, 3 layers, and one identity model over
image-sized rows, 3x224x224 FP32, all resident); wrk (JSON and binary bodies
to the MLP, binary tensors to the identity model: 588 KiB in and out),
tritonclient gRPC and one gRPC stream, `--in-flight` calls each (8), drive
them in turn, `--rounds` times, so both see the same machine. It prints the median
throughput of each and the ratio this/base per workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
from agent_overhead import _wrk, run_wrk  # noqa: E402
from common import Agent  # noqa: E402
from profile_agent import WIDTH, grpc_load, grpc_stream_load  # noqa: E402
from shm_transport import body as tensor_body  # noqa: E402

from edgeplex.agent.catalog import demo  # noqa: E402

IMAGE = 3 * 224 * 224  # FP32 values per row of the identity model


def base_python(revision: str) -> tuple[str, str]:
    """(sha, python of a venv with that revision installed), made once."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", revision], capture_output=True, text=True, check=True
    ).stdout.strip()
    home = ROOT / ".cache" / "ab" / sha[:12]
    python = home / "venv" / "bin" / "python"
    tree = home / "tree"
    if python.exists():
        build_native(python, tree)
        return sha, str(python)
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), sha],
                       check=True, capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True)
    env = dict(os.environ, PIP_CACHE_DIR=str(ROOT / ".cache" / "pip"))
    print(f"installing {sha[:12]} into {home / 'venv'} (once)", flush=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-e", str(tree)], check=True, env=env
    )
    build_native(python, tree)
    return sha, str(python)


def build_native(python: Path, tree: Path) -> None:
    """Build the revision's native gRPC door as `make setup` does, where it has one, so
    both sides serve gRPC the way a user's install would."""
    script = tree / "scripts" / "build_native.py"
    if not script.exists() or any((tree / "agent" / "frontdoor").glob("_nghttp2*.so")):
        return
    env = dict(os.environ, PIP_CACHE_DIR=str(ROOT / ".cache" / "pip"))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "cython"], check=True, env=env)
    subprocess.run([str(python), str(script)], check=True, cwd=tree, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a git revision to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--in-flight", type=int, default=8, help="calls in flight")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workloads", help="a comma-separated subset (default: all)")
    args = parser.parse_args()
    sha, python = base_python(args.base)
    n = args.in_flight
    header, tail = tensor_body(IMAGE)
    workloads = {
        "http-json": lambda a: run_wrk(a.http, "mlp", WIDTH, n, args.duration, json_body=True),
        "http-binary": lambda a: run_wrk(a.http, "mlp", WIDTH, n, args.duration),
        "http-tensor": lambda a: _wrk(a.http, "image", n, args.duration, header, tail),
        "grpc": lambda a: grpc_load(a.grpc, args.duration, n),
        "grpc-stream": lambda a: grpc_stream_load(a.grpc, args.duration, n),
    }
    if args.workloads:
        wanted = args.workloads.split(",")
        if unknown := set(wanted) - set(workloads):
            parser.error(f"unknown workloads: {sorted(unknown)}")
        workloads = {w: workloads[w] for w in wanted}
    rps: dict[str, dict[str, list[float]]] = {w: {"this": [], "base": []} for w in workloads}
    with tempfile.TemporaryDirectory() as work:
        repo = Path(work) / "repo"
        demo.make_mlp(repo / "mlp", width=WIDTH, layers=3, in_width=WIDTH)
        demo.make_identity(repo / "image", "FP32", width=IMAGE)
        agents = {"this": Agent(repo), "base": Agent(repo, python=python)}
        try:
            for agent in agents.values():
                agent.post("/v2/repository/models/mlp/load")
                agent.post("/v2/repository/models/image/load")
            for r in range(args.rounds):
                for workload, drive in workloads.items():
                    for name in ("this", "base") if r % 2 == 0 else ("base", "this"):
                        rps[workload][name].append(drive(agents[name])["rps"])
        finally:
            for agent in agents.values():
                agent.stop()
    how = (
        f"this checkout against {sha[:12]}, one 512-wide MLP and one identity model over "
        f"{IMAGE * 4 // 1024} KiB rows, {n} in flight, "
        f"{args.rounds} rounds of {args.duration:g} s, alternating; "
        f"{platform.node()} {os.cpu_count()} CPUs"
    )
    print(how)
    report: dict[str, object] = {"how": how}
    for workload, runs in rps.items():
        this, base = statistics.median(runs["this"]), statistics.median(runs["base"])
        report[workload] = {"this_rps": this, "base_rps": base, "ratio": this / base, **runs}
        print(f"{workload:<12} this {this:8.0f} rps  base {base:8.0f} rps  ratio {this / base:.2f}")
        if n == 1:  # one call at a time: the mean latency is 1 / throughput
            print(f"{'':<12} mean {1000 / this:.3f} ms against {1000 / base:.3f} ms")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
