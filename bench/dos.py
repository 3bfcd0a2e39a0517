"""Denial of service: each attack on the doors, for a fixed time, against one
agent, with a victim client running through it.

Per attack it prints the victim's p50/p99 against its baseline (measured
alone, just before), the victim's errors, the agent's peak RSS growth and CPU,
the attacker's CPU, and how the attacker was stopped. Goals on a 2-core box:
victim p99 at most 2x its baseline and zero victim errors under every attack;
RSS growth under 256 MiB; malformed protobuf never INTERNAL; a flood of
sequences held to the stateful model's slots and backlog.

    python bench/dos.py [--seconds 10] [--attacks json_nesting,big_bodies,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attacks import ATTACKS, Victim, cpu_seconds, rss_bytes, run_attack
from common import Agent

from edgeplex.agent.catalog import demo

# What each attack is run with: (options, door).
PLAN: dict[str, dict[str, object]] = {
    "json_nesting": {"connections": 4, "pause": 0.01},
    "big_bodies": {"connections": 32, "rate": 4e6},
    # Past the default 10 s header deadline, to see it cut the ones still held.
    "slow_headers": {"connections": 1000, "interval": 1.0, "min_seconds": 13},
    "idle_connections": {"connections": 1000},
    "h2_rapid_reset": {"connections": 100_000, "pause": 0.0},
    "h2_ping_flood": {"connections": 100_000, "pause": 0.0},
    "h2_settings_flood": {"connections": 100_000, "pause": 0.0},
    "h2_slow_streams": {"connections": 100, "pause": 0.05},
    "grpc_malformed": {"max_requests": 1_000_000},  # for the whole time
    # 250 STARTs at once (one address may hold 256 connections): 16 take
    # silero_vad_stream's slots, the rest wait in its backlog (256 places).
    "sequence_flood": {"connections": 250, "pause": 0.05},
}
GRPC = {"h2_rapid_reset", "h2_ping_flood", "h2_settings_flood", "h2_slow_streams",
        "grpc_malformed"}  # fmt: skip


def build_repo(root: Path) -> Path:
    repo = root / "repo"
    demo.make_add_sub(repo / "add_sub")
    demo.make_silero_stream(repo / "silero_vad_stream")  # sequence_flood's target
    return repo


class Sampler:
    """The agent's RSS peak and CPU while an attack runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self.base_rss = rss_bytes(pid)
        self.base_cpu = cpu_seconds(pid)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes(self.pid))
            time.sleep(0.05)

    def stop(self) -> tuple[int, float]:
        self._stop.set()
        self._thread.join()
        return self.peak - self.base_rss, cpu_seconds(self.pid) - self.base_cpu


def measure(agent: Agent, name: str, seconds: float, source: str) -> dict[str, object]:
    victim = Victim(agent.http_port).start()
    time.sleep(seconds / 2)
    victim.stop()
    base50, base99 = victim.percentile(0.5), victim.percentile(0.99)
    victim = Victim(agent.http_port)
    sampler = Sampler(agent.proc.pid)
    port = agent.grpc_port if name in GRPC else agent.http_port
    options = dict(PLAN[name])
    seconds = max(seconds, float(options.pop("min_seconds", 0)))  # type: ignore[arg-type]
    summary = run_attack(name, port, seconds, source, victim.start, **options)  # type: ignore[arg-type]
    growth, cpu = sampler.stop()
    victim.stop()
    return {
        "attack": name,
        "victim_p50_ms": round(victim.percentile(0.5) * 1e3, 2),
        "victim_p99_ms": round(victim.percentile(0.99) * 1e3, 2),
        "baseline_p50_ms": round(base50 * 1e3, 2),
        "baseline_p99_ms": round(base99 * 1e3, 2),
        "p99_ratio": round(victim.percentile(0.99) / base99, 2),
        "victim_requests": len(victim.latencies),
        "victim_errors": dict(victim.errors),
        "agent_rss_growth_mib": round(growth / 2**20, 1),
        "agent_cpu_s": round(cpu, 2),
        "attacker": summary,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--attacks", default=",".join(PLAN))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    names = [n for n in args.attacks.split(",") if n]
    unknown = set(names) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {sorted(unknown)}")
    print(f"# {platform.node()} {os.cpu_count()} cpus, python {platform.python_version()}; "
          f"{args.seconds:g} s per attack, victim: 1 closed-loop HTTP caller on 127.0.0.1, "
          f"attackers from 127.0.0.2.. (one address each) in their own process")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(build_repo(Path(tmp)), log_level="WARNING")
        try:
            for i, name in enumerate(names):  # each from its own address (penalties)
                row = measure(agent, name, args.seconds, f"127.0.0.{2 + i}")
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            agent.stop()
    print()
    print("| attack | victim p50 / p99 ms (baseline) | p99 ratio | victim errors | agent RSS "
          "growth MiB | agent CPU s | attacker CPU s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        a = r["attacker"]
        print(f"| {r['attack']} | {r['victim_p50_ms']} / {r['victim_p99_ms']} "
              f"({r['baseline_p50_ms']} / {r['baseline_p99_ms']}) | {r['p99_ratio']} | "
              f"{sum(r['victim_errors'].values())} | {r['agent_rss_growth_mib']} | "  # type: ignore[union-attr]
              f"{r['agent_cpu_s']} | {a['attacker_cpu_s']} |")  # type: ignore[index]  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
