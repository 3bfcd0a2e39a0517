"""The multi-site rig: 3 regions x 2 sites in network namespaces, with delays.

Runs as root (network namespaces); CI runs the suite as root. One rig per
module; the tests drive it as an operator and clients would: the admin API,
tritonclient and plain HTTP from inside the sites' namespaces.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.rig.rig import Rig, alive, leftovers
from edgeplex.rig.topology import build
from tests.support.rig import RigHandle
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the rig needs root (network namespaces)"),
]
PLACEMENT_PERIOD_S = 2.0
SITE_LEASE_S = 4.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigHandle]:
    workdir = tmp_path_factory.mktemp("rig")
    r = Rig(workdir / "state")
    topo = build(3, 2, prefix="epxt", octet=79)
    try:
        state = r.up(topo)
        yield RigHandle(r, state, workdir)
    finally:
        left = r.down()
        assert left == [], left


def test_status_lists_sites_and_the_network_is_up(rig: RigHandle) -> None:
    text = rig.rig.status()
    for site in ("r0s0", "r0s1", "r1s0", "r1s1", "r2s0", "r2s1"):
        assert site in text
    assert "10.79.1.10:8001" in text
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "epxt-r2s1" in namespaces


def test_the_broker_refuses_anonymous_clients_and_enforces_its_acl(rig: RigHandle) -> None:
    import asyncio

    import aiomqtt

    from edgeplex.fleet import parse_mqtt_url

    cp_url = rig.state["mqtt"]
    host = cp_url.rpartition("@")[2]

    async def anonymous() -> None:
        async with aiomqtt.Client(**parse_mqtt_url(f"mqtt://{host}").client_kwargs()):  # type: ignore[arg-type]
            pass

    with pytest.raises(aiomqtt.MqttError):
        asyncio.run(anonymous())
    acl = (rig.rig.state_dir / "mosquitto.acl").read_text()
    assert "pattern read edgeplex/v1/sites/%u/desired" in acl
    sites = [s["site_id"] for s in rig.state["sites"]]
    assert all(f"user {site}" in acl for site in sites)


def test_forwarded_requests_pay_the_inter_region_delay(rig: RigHandle) -> None:
    rig.add_model("r2_only", seed=1, regions=["r2"], min_replicas=1)
    wait_until(lambda: "r2_only" in rig.loaded_at("r2s0") | rig.loaded_at("r2s1"), 30,
               "r2_only placed in r2")  # fmt: skip
    holder = "r2s0" if "r2_only" in rig.loaded_at("r2s0") else "r2s1"
    wait_until(lambda: rig.tier(holder, "r2_only") == "loaded", 30, "r2_only loaded")
    wait_until(lambda: rig.requests("r0s0", "r0s0", "r2_only", 1)[0]["status"] == 200, 20,
               "r0s0 has the routes")  # fmt: skip
    local = rig.requests(holder, holder, "r2_only", 20)
    forwarded = rig.requests("r0s0", "r0s0", "r2_only", 20)
    assert all(r["status"] == 200 for r in local + forwarded)
    assert {r["served_by"] for r in forwarded} == {holder}
    local_p50 = sorted(r["ms"] for r in local)[10]
    forwarded_p50 = sorted(r["ms"] for r in forwarded)[10]
    # r0 <-> r2 is 80 ms one way: a forwarded request pays at least one round trip.
    assert forwarded_p50 >= local_p50 + 2 * 80 * 0.9, (local_p50, forwarded_p50)


def test_follow_the_sun(rig: RigHandle) -> None:
    rig.add_model("sun", seed=2)
    # Morning in r0: demand there.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "sun" not in rig.loaded_at("r0s0") | rig.loaded_at(
        "r0s1"
    ):
        rig.requests("r0s0", "r0s0", "sun", 5)
    assert "sun" in rig.loaded_at("r0s0") | rig.loaded_at("r0s1")
    # The sun moves: demand in r1 only. r1 loads it within two placement periods
    # of its demand reaching the control plane (one report interval).
    started = time.monotonic()
    while "sun" not in rig.loaded_at("r1s0") | rig.loaded_at("r1s1"):
        rig.requests("r1s0", "r1s0", "sun", 5)
        assert time.monotonic() - started < 2 * PLACEMENT_PERIOD_S + 1.5, "r1 did not load sun"
    # r0 stops asking: once its demand has decayed, r0's sites demote it.
    wait_until(lambda: "sun" not in rig.loaded_at("r0s0") | rig.loaded_at("r0s1"), 40,
               "r0 stops placing sun")  # fmt: skip
    for site in ("r0s0", "r0s1"):
        wait_until(lambda s=site: rig.tier(s, "sun") in ("staged", "cached", ""), 20,
                   f"{site} demoted sun")  # fmt: skip


def _kill_and_fail_over(rig: RigHandle, how: str, model: str) -> tuple[str, float]:
    holder = wait_until(
        lambda: next((s for s in rig.sites if model in rig.loaded_at(s)), None),
        30,
        f"{model} placed",
    )
    assert isinstance(holder, str)
    wait_until(lambda: rig.tier(holder, model) == "loaded", 30, f"{model} loaded")
    region = rig.sites[holder]["region"]
    other = next(s for s in rig.sites if s != holder and rig.sites[s]["region"] == region)
    wait_until(lambda: rig.requests(other, other, model, 1)[0]["status"] == 200, 20, "routes")
    if how == "kill":
        os.kill(rig.state["pids"][holder], signal.SIGKILL)
    else:
        subprocess.run(["ip", "link", "set", rig.sites[holder]["host_veth"], "down"], check=True)
    died = time.monotonic()
    served_after = None
    while time.monotonic() - died < SITE_LEASE_S + PLACEMENT_PERIOD_S + 10:
        replies = rig.requests(other, other, model, 1, retry=True)
        if replies[-1]["status"] == 200 and replies[-1]["served_by"] != holder:
            served_after = time.monotonic() - died
            break
        time.sleep(0.2)
    assert served_after is not None, "not served elsewhere"
    # A client that retries once succeeds now.
    replies = rig.requests(other, other, model, 5, retry=True)
    assert all(r["status"] == 200 for r in replies[-1:])
    return holder, served_after


def test_failover_after_kill_and_after_a_cut_link(rig: RigHandle) -> None:
    rig.add_model("steady", seed=3, min_replicas=6)  # everywhere: traffic at other sites
    rig.add_model("lonely", seed=4, min_replicas=1)
    wait_until(lambda: all("steady" in rig.loaded_at(s) for s in rig.sites), 30, "steady placed")
    holder = wait_until(
        lambda: next((s for s in rig.sites if "lonely" in rig.loaded_at(s)), None), 30, "lonely"
    )
    bystander = next(s for s in rig.sites if s != holder)
    steady = rig.client(bystander, bystander, "steady", 300)  # runs through the failover
    dead, killed = _kill_and_fail_over(rig, "kill", "lonely")
    out, _ = steady.communicate(timeout=120)
    replies = json.loads(out)
    assert len(replies) == 300 and all(r["status"] == 200 for r in replies)
    assert killed <= SITE_LEASE_S + PLACEMENT_PERIOD_S + 3
    print(f"failover after kill -9: served elsewhere after {killed:.2f} s")
    # Restart the killed site: it rejoins and reconciles.
    assert not alive(rig.state["pids"][dead])
    rig.state["pids"][dead] = rig.rig.start_agent(rig.state, dead)
    rig.rig.save(rig.state)
    wait_until(lambda: _site_up(rig, dead), 30, "killed site rejoined")
    # ...and reconciles: the retained desired state brings its models back.
    wait_until(lambda: rig.tier(dead, "steady") == "loaded", 30, "rejoined site reconciled")
    cut_site, cut = _kill_and_fail_over(rig, "cut", "lonely")
    assert cut <= SITE_LEASE_S + PLACEMENT_PERIOD_S + 3
    print(f"failover after a cut link: served elsewhere after {cut:.2f} s")
    wait_until(lambda: not _site_up(rig, cut_site), 10, "cut site marked down")
    subprocess.run(["ip", "link", "set", rig.sites[cut_site]["host_veth"], "up"], check=True)
    wait_until(lambda: _site_up(rig, cut_site), 30, "cut site rejoined")


def _site_up(rig: RigHandle, site: str) -> bool:
    sites = rig.call("ListSites", pb.ListSitesRequest()).sites  # type: ignore[attr-defined]
    return any(s.site_id == site and s.up for s in sites)


def test_rig_down_leaves_nothing(tmp_path: Path) -> None:
    r = Rig(tmp_path / "state")
    topo = build(2, 1, prefix="epxd", octet=81)
    state = r.up(topo)
    assert r.down() == []
    assert leftovers(state) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "epxd" not in links
    assert (
        "epxd-"
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
