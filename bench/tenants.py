"""What tenants cost and what they give, side by side in one run.

    python bench/tenants.py [--rounds 7] [--duration 4] [--json out.json]

overhead   Two agents on the same repository: one with no tenants (anonymous
           access, as before tenants), one with 100 tenants in its tenants file,
           each with a key, the caller's tenant with limits high enough never to
           refuse (so every check runs: key lookup, model list, token bucket,
           concurrency count, metrics, usage journal). wrk, 16 connections, binary HTTP bodies,
           one 64-wide row to a small MLP; the agents take turns, `--rounds`
           times, and each round's ratio is taken (a pair run back to back: the
           machine's drift between rounds cancels). Goal: the median ratio of the
           tenant agent's throughput to the other's at least 0.97. The agents' CPU
           per request is printed beside it.
fairness   Two tenants of weights 1 and 3, 8 closed-loop callers each, on one
           saturated model (a 768-wide MLP, batches of 4): their shares of its
           throughput. Goal: 1:3 within 10%.
isolation  A light tenant (1 closed-loop caller) alone, then beside a flooding
           tenant (wrk, 32 connections, in its own process) on the same saturated
           model: the light tenant's p99 in both. Goal: within 2x of its p99 alone.
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
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from agent_overhead import run_wrk  # noqa: E402
from common import Agent, cpu_seconds  # noqa: E402

from edgeplex import tenants  # noqa: E402
from edgeplex.agent.catalog import demo  # noqa: E402
from edgeplex.usage import entries, minute_files  # noqa: E402
from tests.support.load import binary_body, closed_loop  # noqa: E402


def make_tenants(path: Path, extra: dict[str, dict]) -> dict[str, str]:
    """100 filler tenants with a key each, plus `extra` (name: limits); the extra
    tenants' keys by name."""
    table = tenants.TenantTable()
    keys = {}
    for i in range(100):
        table = tenants.add(table, f"filler-{i}", {"rate": 100.0})
        table, _, _ = tenants.issue_key(table, f"filler-{i}")
    for name, limits in extra.items():
        table = tenants.add(table, name, limits)
        table, keys[name], _ = tenants.issue_key(table, name)
    tenants.write_file(path, table)
    return keys


def body(key: str | None) -> tuple[bytes, dict[str, str]]:
    data, headers = binary_body(np.full((1, 64), 0.5, np.float32), binary_output=True)
    if key:
        headers = {**headers, "Authorization": f"Bearer {key}"}
    return data, headers


def run(url: str, model: str, clients: int, duration: float, key: str | None, seed: int = 0):
    return asyncio.run(closed_loop(url, [model], clients, duration, seed, body(key)))


def p99(latencies: list[float]) -> float:
    return float(np.percentile(latencies, 99)) * 1000 if latencies else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgeplex-bench-tenants-"))
    repo = work / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    demo.make_mlp(repo / "slow", 768, 6, in_width=64, config="max_batch_size: 4\n")
    file = work / "tenants.yaml"
    keys = make_tenants(
        file,
        {
            "caller": {"rate": 1e6, "burst": 1_000_000, "concurrency": 10_000},
            "light": {"weight": 1.0},
            "heavy": {"weight": 3.0},
            "flood": {"weight": 1.0},
        },
    )
    plain = Agent(repo, load_models_at_start="true")
    usage = work / "usage"
    metered = Agent(repo, load_models_at_start="true", security__tenants_file=str(file),
                    usage_dir=str(usage))  # fmt: skip
    report: dict[str, object] = {
        "command": "python bench/tenants.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    try:
        # Warm both: every model loaded, connections made once.
        for agent, key in ((plain, None), (metered, keys["caller"])):
            run(f"http://{agent.http}", "m", 4, 1.0, key)
            run(f"http://{agent.http}", "slow", 4, 1.0, key if agent is plain else keys["light"])
        rates: dict[str, list[float]] = {"plain": [], "tenants": []}
        cpu_us: dict[str, list[float]] = {"plain": [], "tenants": []}  # agent CPU a request
        metered_requests = 0
        for i in range(args.rounds):
            order = [("plain", plain, ""), ("tenants", metered, f"Bearer {keys['caller']}")]
            for label, agent, authorization in order if i % 2 == 0 else order[::-1]:
                os.environ["EDGEPLEX_WRK_AUTHORIZATION"] = authorization
                cpu = cpu_seconds(agent.proc.pid)
                result = run_wrk(agent.http, "m", 64, 16, args.duration)
                assert not result["errors"], (label, result)
                rates[label].append(result["rps"])
                used = cpu_seconds(agent.proc.pid) - cpu
                cpu_us[label].append(used / max(1, result["requests"]) * 1e6)
                if agent is metered:
                    metered_requests += result["requests"]
        os.environ.pop("EDGEPLEX_WRK_AUTHORIZATION", None)
        # The journal holds counters per (tenant, model, version, failure) and minute:
        # its size follows those, not the request count.
        files = minute_files(usage)
        entries_bytes = [
            max((end for *_, end in entries(path.read_bytes())), default=0) for _, path in files
        ]
        report["usage_journal"] = {"minutes": len(files), "bytes": sum(entries_bytes),
                                   "requests_timed": metered_requests}  # fmt: skip
        print(f"usage     journal {sum(entries_bytes):,} bytes in {len(files)} minute files "
              f"for {metered_requests:,} timed requests (and the warm-up's): counters per "
              "tenant, model and minute; the control plane stores one record each")  # fmt: skip
        plain_rate, tenant_rate = (statistics.median(rates[k]) for k in ("plain", "tenants"))
        pairs = [t / p for p, t in zip(rates["plain"], rates["tenants"], strict=True)]
        ratio = statistics.median(pairs)
        plain_cpu, tenant_cpu = (statistics.median(cpu_us[k]) for k in ("plain", "tenants"))
        report["overhead"] = {"plain_rps": plain_rate, "tenants_rps": tenant_rate,
                              "ratio": ratio, "round_ratios": pairs, "runs": rates,
                              "agent_cpu_us_per_request": cpu_us}  # fmt: skip
        print(f"overhead  wrk c=16: no tenants {plain_rate:,.0f} req/s, 100 tenants with "
              f"keys {tenant_rate:,.0f} req/s: median of {len(pairs)} rounds' ratios "
              f"{ratio:.3f}x (goal >= 0.97; rounds {min(pairs):.3f} to {max(pairs):.3f}); "
              f"agent CPU {plain_cpu:.0f} against {tenant_cpu:.0f} us a request")  # fmt: skip

        url = f"http://{metered.http}"

        async def share() -> dict[str, int]:
            light, heavy = await asyncio.gather(
                closed_loop(url, ["slow"], 8, args.duration, 1, body(keys["light"])),
                closed_loop(url, ["slow"], 8, args.duration, 2, body(keys["heavy"])),
            )
            return {"light": light.codes.get(200, 0), "heavy": heavy.codes.get(200, 0)}

        served = asyncio.run(share())
        ratio = served["heavy"] / max(1, served["light"])
        report["fairness"] = {"served": served, "ratio": ratio}
        print(f"fairness  weights 1:3, 8 callers each: served {served['light']:,} : "
              f"{served['heavy']:,} = 1:{ratio:.2f} (goal 1:3 within 10%)")  # fmt: skip

        alone = run(url, "slow", 1, args.duration, keys["light"])
        # The flood from wrk, its own process: the light caller's latency is then the
        # agent's doing, not that of a client loop shared with 32 flooding callers.
        os.environ["EDGEPLEX_WRK_AUTHORIZATION"] = f"Bearer {keys['flood']}"
        flood = threading.Thread(
            target=run_wrk, args=(metered.http, "slow", 64, 32, args.duration + 2)
        )
        flood.start()
        time.sleep(1.0)  # the flood's backlog builds first
        crowded = run(url, "slow", 1, args.duration, keys["light"]).latencies
        flood.join()
        os.environ.pop("EDGEPLEX_WRK_AUTHORIZATION", None)
        report["isolation"] = {"alone_p99_ms": p99(alone.latencies),
                               "beside_flood_p99_ms": p99(crowded),
                               "ratio": p99(crowded) / p99(alone.latencies)}  # fmt: skip
        print(f"isolation light tenant p99 alone {p99(alone.latencies):.2f} ms, beside a "
              f"32-caller flood {p99(crowded):.2f} ms: "
              f"{p99(crowded) / p99(alone.latencies):.2f}x (goal <= 2x)")  # fmt: skip
    finally:
        plain.stop()
        metered.stop()
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
