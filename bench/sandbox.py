"""What the runner sandbox costs: spawn time per layer and in total, promotion time,
and closed-loop throughput at 4x over-commit, with and without it, in one run.

Spawn: a real RunnerPool (zygote, runner socket, shared rings) starts `--spawns`
runners one after another and times each from the request to the zygote until the
runner serves (its Hello received and its rings mapped), `runner.sandbox: off`
against `best_effort`, alternating; each sandboxed runner reports what each layer
took to apply inside it. Goal: a sandboxed runner ready within 50 ms.

Serving: bench/density_closed_loop.py's 4x scenario (16 MLPs of ~13 MB, a device
budget for 4, 8 callers that never pause, Zipf 1/rank) on a fresh agent with the
sandbox off and on, `--rounds` alternating pairs: requests served per second and
the mean promotion time. Goal: throughput within 5%.

    python bench/sandbox.py [--spawns 40 --duration 15 --rounds 2 --json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from density_closed_loop import build_catalog, run_scenario

from edgeplex.agent.config import AgentSettings
from edgeplex.agent.runners.sandbox import LAYERS
from edgeplex.agent.runners.settings import RunnerSettings
from edgeplex.agent.runners.supervisor import RunnerPool
from edgeplex.agent.runners.view import runner_view


async def spawn_times(
    mode: str, count: int, repo: Path
) -> tuple[list[float], list[dict[str, int]]]:
    """Milliseconds from asking to ready for `count` runners started one by one."""
    staging = Path(tempfile.mkdtemp(prefix="edgeplex-bench-staged-"))
    settings = AgentSettings(model_repo=repo)
    pool = RunnerPool(
        RunnerSettings(sandbox=mode),  # type: ignore[arg-type]
        "WARNING",
        on_up=lambda _: None,
        on_down=lambda *_: None,
        view=lambda: runner_view(settings, staging),
    )
    await pool.start()
    times, layers = [], []
    try:
        for i in range(count):
            runner_id = f"bench-{mode}-{i}"
            started = time.perf_counter()
            runner = pool.get(runner_id)
            await runner.ensure_ready()
            times.append((time.perf_counter() - started) * 1000)
            layers.append(dict(runner.sandbox_us))
            await pool.retire(runner_id)
    finally:
        await pool.stop()
    return times, layers


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return f"{statistics.median(values):.1f} ms (p90 {p90:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=40, help="runners started per mode")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per serving run")
    parser.add_argument("--rounds", type=int, default=2, help="alternating serving pairs")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    repo = build_catalog(16, args.width, args.layers)
    spawns: dict[str, list[float]] = {"off": [], "best_effort": []}
    per_layer: list[dict[str, int]] = []
    for _ in range(2):  # alternate the modes, in halves
        for mode in ("off", "best_effort"):
            times, layers = asyncio.run(spawn_times(mode, args.spawns // 2, repo))
            spawns[mode] += times
            if mode != "off":
                per_layer += layers

    per_model = (repo / "c000" / "1" / "model.onnx").stat().st_size
    budget = int(per_model * 1.15 * 4)
    serving: dict[str, list[dict[str, object]]] = {"off": [], "best_effort": []}
    for r in range(args.rounds):
        for mode in ("off", "best_effort") if r % 2 == 0 else ("best_effort", "off"):
            run = run_scenario("4x", repo, 16, budget, args, {"runner__sandbox": mode})
            serving[mode].append(run)

    print(
        f"# runner sandbox: {args.spawns} spawns per mode, then 4x over-commit closed loop "
        f"({args.clients} clients, {args.duration:g} s, {args.rounds} alternating pairs), "
        f"models of {per_model} bytes; {platform.machine()}, Python "
        f"{platform.python_version()}, {platform.release()}"
    )
    off, on = spawns["off"], spawns["best_effort"]
    print("\n| spawn to ready | median (p90) |\n| --- | --- |")
    print(f"| sandbox off | {summary(off)} |")
    print(f"| sandbox on (every layer) | {summary(on)} |")
    print(f"| cost of the sandbox | {statistics.median(on) - statistics.median(off):+.1f} ms |")
    print("\n| layer (inside the runner) | median µs | p90 µs |\n| --- | --- | --- |")
    for layer in LAYERS:
        values = sorted(t.get(layer, 0) for t in per_layer)
        p90 = values[int(0.9 * (len(values) - 1))]
        print(f"| {layer} | {statistics.median(values):.0f} | {p90} |")
    print("\n| serving at 4x | req/s | failed | mean promotion ms | p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for mode, runs in serving.items():
        for run in runs:
            print(
                f"| {mode} | {run['throughput']:.0f} | {run['failed']} | "
                f"{run['promotion_ms']:.2f} | {run['p99_ms']:.1f} |"
            )
    if args.rounds:
        rate = {
            m: statistics.mean(float(r["throughput"]) for r in runs) for m, runs in serving.items()
        }
        ratio = rate["best_effort"] / rate["off"]
        print(f"\nthroughput with the sandbox / without: {ratio:.3f} (goal >= 0.95)")
    print(f"sandboxed spawn median {statistics.median(on):.1f} ms (goal <= 50 ms)")
    if args.json:
        for runs in serving.values():
            for run in runs:
                run.pop("status", None)
        args.json.write_text(
            json.dumps({"spawns": spawns, "layers_us": per_layer, "serving": serving}, indent=1)
        )


if __name__ == "__main__":
    main()
