"""The simulator against the real thing: one short trace replayed on the rig and
in the simulator, side by side.

    sudo python bench/sim_vs_rig.py [--minutes 30] [--compression 20] [--replays 5] [--out DIR]

The rig (deploy/rig) runs 3 regions x 2 sites with the real control plane,
Redis, mosquitto and agents; one-way delays r0-r1 30 ms, r0-r2 80 ms, r1-r2
150 ms. The trace (`make_trace`, deterministic) covers `--minutes` simulated
minutes of 12 models (FP32 MLPs of about 2 MB) whose demand follows the sun
round three regions, each with its own Zipf order; each site's device budget
holds three of them. Time runs `--compression` times faster on the rig: a
trace minute lasts 60/compression real seconds, and the control loop's periods
(placement, the demand half-life, the forecast horizon) are scaled by the same
factor. Agents and control plane run at their defaults otherwise (kept
mappings on, forecasting on); `--no-kept-mapping` and `--reactive` turn those
off. Requests are sent open-loop at their trace times from inside each region's
namespace, to the region's sites in turn.

The simulator then runs the same trace on the same fleet, with the catalog
measured on the rig: each model's device bytes, its promotion time (scaled by
the compression, as a trace minute is) and its compute. Both count from the
end of the warm-up (`--warmup-min`). Compared:

- served in region within the SLO: a request answered 200 by a site of its own
  region within `--slo-ms` (rig), the simulator's `served_in_region_within_slo`;
- cold starts: promotions requests waited for (`edgeplex_agent_cold_starts_total`
  summed over the agents), the simulator's loads on demand.

Prints one JSON object (`rig`, `sim`, `ratio`, `how`); `--out` also writes it.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgeplex.agent.catalog import demo  # noqa: E402
from edgeplex.artifacts import sha256_of  # noqa: E402
from edgeplex.control_plane.sim.engine import SimConfig, simulate  # noqa: E402
from edgeplex.control_plane.sim.spec import (  # noqa: E402
    Catalog,
    FleetSpec,
    RegionSpec,
    SiteGroup,
)
from edgeplex.control_plane.sim.traces import TraceFile  # noqa: E402
from edgeplex.proto import edgeplex_control_pb2 as pb  # noqa: E402
from edgeplex.rig.rig import Rig  # noqa: E402
from edgeplex.rig.topology import build  # noqa: E402

REGIONS = ("r0", "r1", "r2")
SITES_PER_REGION = 2
MODELS = 12
WIDTH, LAYERS, IN_WIDTH = 512, 3, 32  # about 2.2 MB of FP32 weights
HELD_PER_SITE = 3.5  # the device budget, in models

CLIENT = r"""
import asyncio, json, sys, time
import aiohttp

schedule = json.load(open(sys.argv[1]))   # [[t_offset_s, minute, model, url], ...]
t0 = float(sys.argv[2])
body = json.dumps({"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32",
                               "data": [0.5] * 32}]})
out = []

async def one(session, minute, model, url):
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers={"Content-Type": "application/json"},
                                timeout=aiohttp.ClientTimeout(total=10)) as r:
            text = await r.read()
            served = r.headers.get("edgeplex-served-by") or ""
            if r.status != 200:
                served = text.decode(errors="replace")[:160]
            out.append([minute, model, r.status, (time.perf_counter() - started) * 1000, served])
    except Exception as e:
        out.append([minute, model, 0, (time.perf_counter() - started) * 1000, repr(e)[:80]])

async def main():
    tasks = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
        for offset, minute, model, url in schedule:
            delay = t0 + offset - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, minute, model, url)))
        await asyncio.gather(*tasks)

asyncio.run(main())
print(json.dumps(out))
"""


def make_trace(minutes: int, seed: int = 0, per_minute: float = 150.0) -> np.ndarray:
    """[minute, region, model] requests: each region's demand rises and falls over a
    cycle of `minutes` (offset by a third per region, a compressed day), Zipf 1/rank
    over the models in an order of its own, Poisson counts."""
    rng = np.random.default_rng(seed)
    out = np.zeros((minutes, len(REGIONS), MODELS))
    ranks = 1.0 / np.arange(1, MODELS + 1)
    for r in range(len(REGIONS)):
        popularity = np.empty(MODELS)
        popularity[rng.permutation(MODELS)] = ranks / ranks.sum()
        for t in range(minutes):
            phase = 2 * math.pi * (t / minutes - r / len(REGIONS))
            level = 0.15 + 0.85 * (0.5 + 0.5 * math.cos(phase))
            out[t, r] = rng.poisson(per_minute / len(REGIONS) * level * popularity)
    return out


def model_names() -> list[str]:
    return [f"m{j:02d}" for j in range(MODELS)]


def schedule_for(trace: np.ndarray, region: int, urls: list[str], minute_s: float, seed: int):  # type: ignore[no-untyped-def]
    """The region's requests as [t_offset_s, minute, model, url], spread uniformly
    within each trace minute, sent to the region's sites in turn."""
    rng = np.random.default_rng(seed + region)
    rows = []
    for t in range(trace.shape[0]):
        for j, name in enumerate(model_names()):
            for _ in range(int(trace[t, region, j])):
                rows.append([(t + float(rng.random())) * minute_s, t, name])
    rows.sort()
    return [[o, t, m, urls[i % len(urls)].format(model=m)] for i, (o, t, m) in enumerate(rows)]


def scrape_cold_starts(addresses: list[str]) -> list[float]:
    """Per site, the promotions requests waited for so far."""
    out = []
    for address in addresses:
        total = 0.0
        with urllib.request.urlopen(f"http://{address}:8000/metrics", timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("edgeplex_agent_cold_starts_total{"):
                    total += float(line.rsplit(" ", 1)[1])
        out.append(total)
    return out


def statuses(addresses: list[str]) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for address in addresses:
        with urllib.request.urlopen(f"http://{address}:8000/edgeplex/v1/status", timeout=10) as r:
            out.extend(json.load(r))
    return out


def replay_on_rig(args: argparse.Namespace, trace: np.ndarray, work: Path) -> dict:  # type: ignore[type-arg]
    k = args.compression
    minute_s = 60.0 / k
    artifacts = work / "state" / "artifacts"
    rig = Rig(work / "state")
    file_bytes = 0
    try:
        probe = demo.make_mlp(work / "probe", WIDTH, LAYERS, seed=0, in_width=IN_WIDTH)
        file_bytes = probe.stat().st_size
        budget = int(HELD_PER_SITE * file_bytes)
        state = rig.up(
            build(len(REGIONS), SITES_PER_REGION, prefix="epxs", octet=85),
            agent_env={
                "EDGEPLEX_AGENT_DEVICE_MEMORY_BUDGET": str(budget),
                "EDGEPLEX_AGENT_RUNNER__KEEP_STAGED_MAPPED": str(args.kept_mapping).lower(),
            },
            cp_env={
                "EDGEPLEX_CP_PLACEMENT_INTERVAL_S": str(args.placement_period_min * minute_s),
                "EDGEPLEX_CP_DEMAND_HALF_LIFE_S": str(60.0 / k),
                # Forecasting at its default horizon, scaled as the other periods are; a
                # replay this short has no season, so it places from the recent demand.
                "EDGEPLEX_CP_FORECAST_HORIZON_S": "0" if args.reactive else str(3600.0 / k),
            },
        )
        token = (rig.state_dir / "admin-token").read_text().strip()
        import grpc

        from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc

        with grpc.insecure_channel(state["control_plane"]) as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            for j, name in enumerate(model_names()):
                folder = artifacts / name
                demo.make_mlp(folder, WIDTH, LAYERS, seed=j + 1, in_width=IN_WIDTH)
                path = folder / "1" / "model.onnx"
                admin.AddModel(
                    pb.CatalogModel(name=name, artifact_uri=path.as_uri(), sha256=sha256_of(path)),
                    metadata=(("authorization", f"Bearer {token}"),),
                    timeout=10,
                )
        sites = state["sites"]
        addresses = [s["address"] for s in sites]
        t0 = time.time() + 3.0
        clients = []
        for r, region in enumerate(REGIONS):
            members = [s for s in sites if s["region"] == region]
            urls = [f"http://{s['address']}:8000/v2/models/{{model}}/infer" for s in members]
            path = work / f"schedule-{region}.json"
            path.write_text(json.dumps(schedule_for(trace, r, urls, minute_s, args.seed)))
            command = ["ip", "netns", "exec", members[0]["namespace"], sys.executable, "-c",
                       CLIENT, str(path), str(t0)]  # fmt: skip
            clients.append(
                subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            )
        counted: dict[str, list[float]] = {}

        def at_warmup_end() -> None:
            time.sleep(max(0.0, t0 + args.warmup_min * minute_s - time.time()))
            counted["start"] = scrape_cold_starts(addresses)

        scraper = threading.Thread(target=at_warmup_end, daemon=True)
        scraper.start()
        results = []
        for c in clients:
            out, err = c.communicate(timeout=trace.shape[0] * minute_s + 120)
            if not out:
                raise RuntimeError(f"a client failed: {err[-2000:]}")
            results.append(json.loads(out))
        scraper.join()
        cold_by_site = [
            b - a for a, b in zip(counted["start"], scrape_cold_starts(addresses), strict=True)
        ]
        status = statuses(addresses)
    finally:
        left = rig.down()
        if left:
            print(f"left behind: {left}", file=sys.stderr)
    region_of = {s["site_id"]: s["region"] for s in sites}
    counted_requests = in_region = failed = elsewhere = slow = 0
    why_failed: collections.Counter[str] = collections.Counter()
    for r, rows in enumerate(results):
        for minute, _model, status_code, ms, served_by in rows:
            if minute < args.warmup_min:
                continue
            counted_requests += 1
            if status_code != 200:
                failed += 1
                why_failed[f"{status_code} {served_by}"] += 1
            elif region_of.get(served_by) != REGIONS[r]:
                elsewhere += 1
            elif ms > args.slo_ms:
                slow += 1
            else:
                in_region += 1
    loaded = [s for s in status if s["memory_bytes"]]
    promotions = [s["last_promotion"]["load_ms"] for s in status if s["last_promotion"]]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rig_requests.json").write_text(json.dumps(results))
    return {
        "requests": counted_requests,
        "failed": failed,
        "failures": dict(why_failed.most_common(5)),
        "served_elsewhere": elsewhere,
        "in_region_over_slo": slow,
        "served_in_region_within_slo": in_region / max(counted_requests, 1),
        "cold_starts": sum(cold_by_site),
        "cold_starts_by_region": [
            sum(c for c, site in zip(cold_by_site, sites, strict=True) if site["region"] == r)
            for r in REGIONS
        ],
        "model_bytes": float(np.median([s["memory_bytes"] for s in loaded])) if loaded else 0.0,
        "file_bytes": file_bytes,
        "budget_bytes": budget,
        "promotion_ms": float(np.median(promotions)) if promotions else 0.0,
    }


def simulate_replay(args: argparse.Namespace, trace: np.ndarray, rig: dict) -> dict:  # type: ignore[type-arg]
    """The same trace in the simulator, on the rig's fleet and measured catalog."""
    topo = build(len(REGIONS), SITES_PER_REGION)
    fleet = FleetSpec(
        regions=[RegionSpec(name=r) for r in REGIONS],
        rtt_ms={f"{a},{b}": 2 * d for (a, b), d in topo.delays_ms.items()},
        sites=[
            SiteGroup(region=r, count=SITES_PER_REGION, gpu_memory=rig["budget_bytes"])
            for r in REGIONS
        ],
    )
    n = MODELS
    catalog = Catalog(
        names=model_names(),
        size_bytes=np.full(n, int(rig["model_bytes"] or rig["file_bytes"])),
        # A trace minute lasts 60/k real seconds on the rig: a promotion takes
        # k times its share of one in the simulator's minute.
        load_s=np.full(n, rig["promotion_ms"] / 1000.0 * args.compression),
        compute_ms=np.full(n, 0.5),
        slo_ms=np.full(n, float(args.slo_ms)),
    )
    config = SimConfig(
        step_min=1,
        placement_period_min=args.placement_period_min,
        demand_half_life_s=60.0,
        warmup_min=args.warmup_min,
        siblings_see_loads=False,  # the agents' routes list placement's holders only
        wan_mbps=float("inf"),  # the rig's artifacts are files on the same machine
        region_rtt_ms=0.0,  # no delay inside a region's namespace
    )
    names = model_names()
    rows = [
        (int(t), REGIONS[r], names[j], float(trace[t, r, j]))
        for t, r, j in zip(*np.nonzero(trace), strict=True)
    ]
    source = TraceFile(rows, fleet, catalog)
    strategy = "reactive" if args.reactive else "forecast"
    outcome = simulate(fleet, catalog, source, trace.shape[0], strategy, config)
    summary = outcome.summary(n)
    return {
        "requests": summary["requests"],
        "served_in_region_within_slo": summary["served_in_region_within_slo"],
        "cold_starts": summary["cold_starts"],
        "cold_starts_by_region": np.sum(outcome.timeline.cold_by_region, axis=0).tolist(),
        "forwarded": summary["forwarded"],
    }


def run(args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    trace = make_trace(args.minutes, args.seed)
    replays = []
    for _ in range(args.replays):
        with tempfile.TemporaryDirectory(prefix="edgeplex-sim-vs-rig-") as d:
            replays.append(replay_on_rig(args, trace, Path(d)))
    rig = replays[0]
    sim = simulate_replay(args, trace, rig)  # deterministic: one run answers every replay
    keys = ("served_in_region_within_slo", "cold_starts")

    def ratio_of(replay: dict) -> dict[str, float]:  # type: ignore[type-arg]
        return {key: (sim[key] / replay[key] if replay[key] else math.inf) for key in keys}

    ratio = ratio_of(rig)
    report: dict[str, object] = {}
    if args.replays > 1:
        each = [ratio_of(replay) for replay in replays]
        report["replays"] = [
            {**{key: replay[key] for key in ("requests", "failed", *keys)}, "ratio": r}
            for replay, r in zip(replays, each, strict=True)
        ]
        report["median_ratio"] = {key: float(np.median([r[key] for r in each])) for key in keys}
    return {
        "how": f"{len(REGIONS)} regions x {SITES_PER_REGION} sites on the rig, {MODELS} models "
        f"of {rig['file_bytes']} bytes, device budget {rig['budget_bytes']} bytes per site; "
        f"{args.minutes} trace minutes at {args.compression:g}x "
        f"({args.minutes * 60 / args.compression:.0f} s), "
        f"placement every {args.placement_period_min} trace minutes, SLO {args.slo_ms} ms, "
        f"counted after {args.warmup_min} minutes; seed {args.seed}; agents with "
        f"keep_staged_mapped {'on' if args.kept_mapping else 'off'}, placement "
        f"{'reactive' if args.reactive else 'forecasting (the default)'}",
        "rig": rig,
        "sim": sim,
        "ratio": ratio,
        **report,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--compression", type=float, default=20.0)
    parser.add_argument("--placement-period-min", type=int, default=5)
    parser.add_argument("--warmup-min", type=int, default=5)
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--kept-mapping",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the rig's agents with runner.keep_staged_mapped (on: their default)",
    )
    parser.add_argument(
        "--reactive",
        action="store_true",
        help="place from the observed demand alone (forecast horizon 0) on both sides; by "
        "default the control plane forecasts, as it does unless configured otherwise",
    )
    parser.add_argument(
        "--replays", type=int, default=1, help="replays on the rig; more print the median ratio"
    )
    return parser.parse_args(argv)


def main() -> None:
    args = parse()
    if os.geteuid() != 0:
        raise SystemExit("the rig needs root")
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sim_vs_rig.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
