"""Latency across sites on the rig: in-region, forwarded, cold start; failover time.

    sudo python bench/rig_latency.py [--requests 200]

Brings up a 3-region x 2-site rig (deploy/rig; 30/80/150 ms one-way between
regions, tc netem or the userspace delay proxy), places a small model only in
region r2, and measures from inside region r0 and r2 namespaces with plain
HTTP/JSON clients:

- in-region: a client in r2 calling the r2 site that holds the model;
- forwarded: a client in r0 calling its own site, which forwards to r2
  (80 ms one way, so at least one 160 ms round trip);
- cold start: the first request after the model was demoted to `staged`
  (promotion from host RAM) and to `cached` (from disk);
- failover: kill -9 of the site holding a second model; time until a client
  that retries once is served by another site.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgeplex.rig.rig import Rig  # noqa: E402
from edgeplex.rig.topology import build  # noqa: E402
from tests.support.rig import RigHandle  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def demote(rig: RigHandle, site: str, model: str, tier: str) -> None:
    url = f"http://{rig.sites[site]['address']}:8000/edgeplex/v1/models/{model}/demote"
    token = (rig.rig.state_dir / "admin-token").read_text().strip()  # the rig's agents share it
    request = urllib.request.Request(
        url,
        data=json.dumps({"tier": tier}).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}"},
    )
    urllib.request.urlopen(request, timeout=30).read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the rig needs root")
    with tempfile.TemporaryDirectory(prefix="edgeplex-rig-bench-") as d:
        work = Path(d)
        rig_obj = Rig(work / "state")
        try:
            state = rig_obj.up(build(3, 2, prefix="epxb", octet=83))
            rig = RigHandle(rig_obj, state, work)
            report = run(rig, args.requests, state["netem"])
        finally:
            left = rig_obj.down()
    print(json.dumps(report, indent=2))
    if left:
        print(f"left behind: {left}")


def run(rig: RigHandle, n: int, netem: bool) -> dict:  # type: ignore[type-arg]
    rig.add_model("far", seed=11, regions=["r2"], min_replicas=1)
    holder = wait_until(
        lambda: next((s for s in ("r2s0", "r2s1") if "far" in rig.loaded_at(s)), None), 60, "far"
    )
    assert isinstance(holder, str)
    wait_until(lambda: rig.tier(holder, "far") == "loaded", 60, "far loaded")
    wait_until(lambda: rig.requests("r0s0", "r0s0", "far", 1)[0]["status"] == 200, 30, "routes")
    rig.requests(holder, holder, "far", 20)  # warm
    local = [r["ms"] for r in rig.requests(holder, holder, "far", n)]
    forwarded = [r["ms"] for r in rig.requests("r0s0", "r0s0", "far", n)]
    cold: dict[str, list[float]] = {"staged": [], "cached": []}
    for _ in range(5):
        for tier in ("staged", "cached"):
            demote(rig, holder, "far", tier)
            reply = rig.requests(holder, holder, "far", 1)[0]
            assert reply["cold"] == tier, reply
            cold[tier].append(reply["ms"])
    rig.add_model("lonely", seed=12, min_replicas=1)
    lonely = wait_until(
        lambda: next((s for s in rig.sites if "lonely" in rig.loaded_at(s)), None), 60, "lonely"
    )
    assert isinstance(lonely, str)
    wait_until(lambda: rig.tier(lonely, "lonely") == "loaded", 60, "lonely loaded")
    region = rig.sites[lonely]["region"]
    caller = next(s for s in rig.sites if s != lonely and rig.sites[s]["region"] == region)
    wait_until(lambda: rig.requests(caller, caller, "lonely", 1)[0]["status"] == 200, 30, "route")
    os.kill(rig.state["pids"][lonely], signal.SIGKILL)
    died = time.monotonic()
    while True:
        reply = rig.requests(caller, caller, "lonely", 1, retry=True)[-1]
        if reply["status"] == 200 and reply["served_by"] != lonely:
            failover_s = time.monotonic() - died
            break
        if time.monotonic() - died > 60:
            failover_s = float("nan")
            break
    summary = {
        "how": f"3 regions x 2 sites, one-way delays r0-r1 30 ms, r0-r2 80 ms, r1-r2 150 ms "
        f"({'tc netem' if netem else 'userspace TCP delay proxy'}); HTTP/JSON, sequential, "
        f"{n} requests per case; 2-core machine",
        "in_region_ms": {"p50": pct(local, 0.5), "p99": pct(local, 0.99)},
        "forwarded_r0_to_r2_ms": {"p50": pct(forwarded, 0.5), "p99": pct(forwarded, 0.99)},
        "cold_start_ms": {
            tier: {"median": statistics.median(v), "max": max(v)} for tier, v in cold.items()
        },
        "failover_s": failover_s,
        "site_lease_s": 4.0,
        "placement_period_s": 2.0,
    }
    return summary


if __name__ == "__main__":
    main()
