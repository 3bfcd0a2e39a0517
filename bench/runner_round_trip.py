"""The agent-runner hop alone: one call at a time from this process to a forked
runner, over the same framing and socket the agent uses, with and without
running short executions on the runner's reader thread, side by side.

Each round forks two runners in turn (one with inline execution off) and times
`--calls` Infer round trips of a generated MLP (`--width` wide, 3 layers);
the first 500 are warm-up. It reports the p50 and mean of each, the compute time
the runner reported, and a bare socket echo between two processes for scale.

    python bench/runner_round_trip.py [--rounds 3] [--calls 4000] [--width 512]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path


def fork_runner(inline: bool) -> tuple[socket.socket, int]:
    """A runner in a child forked before this process starts any thread."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the child: serve until the socket closes
        ours.close()
        from edgeplex.agent.runners import crew, runner

        if not inline:
            crew.INLINE_NS = 0
        runner.Runner(theirs).serve()
        os._exit(0)
    theirs.close()
    return ours, pid


def time_calls(sock: socket.socket, model: Path, width: int, calls: int) -> dict[str, float]:
    import numpy as np

    from edgeplex.agent.runners import framing, ipc

    staged = tempfile.mkdtemp(prefix="edgeplex-bench-")
    load = ipc.LoadModel(1, "m", str(model), staged, 0, 1, False, True, "cpu", 0, 0, 1)
    framing.send_frame(sock, load)
    reader = framing.FrameReader(sock)
    loaded, _ = reader.read()
    if not isinstance(loaded, ipc.ModelLoaded):
        raise SystemExit(f"load failed: {loaded}")
    descs, buffers = framing.pack_tensors({"input": np.ones((1, width), np.float32)})
    seconds, compute = [], []
    for i in range(calls):
        started = time.perf_counter()
        framing.send_frame(sock, ipc.Infer(i + 2, "m", None, descs), buffers)
        reply, _ = reader.read()
        seconds.append(time.perf_counter() - started)
        if not isinstance(reply, ipc.InferResult):
            raise SystemExit(f"call failed: {reply}")
        compute.append(reply.compute_ns / 1e9)
    warm = seconds[500:]
    return {
        "p50_us": statistics.median(warm) * 1e6,
        "mean_us": statistics.mean(warm) * 1e6,
        "compute_us": statistics.median(compute[500:]) * 1e6,
    }


def echo_p50_us(calls: int) -> float:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        while data := theirs.recv(65536):
            theirs.sendall(data)
        os._exit(0)
    theirs.close()
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        ours.sendall(b"x" * 64)
        got = 0
        while got < 64:
            got += len(ours.recv(65536))
        seconds.append(time.perf_counter() - started)
    ours.close()
    os.waitpid(pid, 0)
    return statistics.median(seconds[500:]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    model_dir = Path(".cache/bench-round-trip") / str(args.width)
    model = model_dir / "mlp" / "1" / "model.onnx"
    if not model.exists():
        # Made in a child, so this process forks runners before any ORT thread exists.
        pid = os.fork()
        if pid == 0:
            from edgeplex.agent.catalog import demo

            demo.make_mlp(model_dir / "mlp", width=args.width, layers=3, in_width=args.width)
            os._exit(0)
        os.waitpid(pid, 0)
    results: dict[str, list[dict[str, float]]] = {"hand-off": [], "inline": []}
    for _ in range(args.rounds):
        for name, inline in (("hand-off", False), ("inline", True)):
            sock, pid = fork_runner(inline)
            try:
                results[name].append(time_calls(sock, model.resolve(), args.width, args.calls))
            finally:
                sock.close()
                os.waitpid(pid, 0)
    print(
        f"runner round trip, {args.width}-wide MLP (3 layers), one call at a time, "
        f"{args.calls} calls x {args.rounds} rounds, alternating; vm {os.cpu_count()} CPUs"
    )
    for name, rows in results.items():
        p50 = statistics.median(r["p50_us"] for r in rows)
        mean = statistics.median(r["mean_us"] for r in rows)
        compute = statistics.median(r["compute_us"] for r in rows)
        each = ", ".join(f"{r['p50_us']:.0f}" for r in rows)
        print(
            f"{name:9} p50 {p50:6.1f} us (rounds: {each}), mean {mean:6.1f} us, "
            f"compute {compute:5.1f} us"
        )
    print(f"bare socket echo between two processes: p50 {echo_p50_us(args.calls):.1f} us")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
