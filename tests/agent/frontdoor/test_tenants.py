"""Tenants at an agent: keys identify them (unknown, revoked or missing: 401 /
UNAUTHENTICATED), their model lists bound them (403 / PERMISSION_DENIED), keys
rotate without downtime, and each tenant's rate and concurrency hold at the door
(429 with Retry-After / RESOURCE_EXHAUSTED) without touching any other tenant.
A standalone agent reads its tenants file, written by `edgeplex admin tenant
--file`, and rereads it when it changes."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from edgeplex import tenants
from edgeplex.agent.catalog import demo
from edgeplex.agent.frontdoor.tenants import ADMIN, ANONYMOUS, Bucket, Tenants
from edgeplex.agent.oip.errors import PermissionDenied, RateLimited, Unauthenticated
from edgeplex.tenants import TenantTable
from edgeplex.usage import fold, minute_files
from tests.conftest import ADMIN_TOKEN, AgentProcess, start_agent
from tests.support.waiting import wait_until

BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]}
).encode()


def admin(*args: str) -> str:
    """`edgeplex admin tenant ...`, as an operator types it; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "edgeplex", "admin", "tenant", *args],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def issued_key(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("epk_"))


class Client:
    """One keep-alive HTTP connection, as a client's SDK holds one."""

    def __init__(self, agent: AgentProcess, key: str | None) -> None:
        host, port = agent.http_url.rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=30)
        self.headers = {"Content-Type": "application/json"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"

    def infer(self, model: str = "m") -> tuple[int, dict[str, str]]:
        self.connection.request("POST", f"/v2/models/{model}/infer", BODY, self.headers)
        answer = self.connection.getresponse()
        answer.read()
        return answer.status, dict(answer.headers)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AgentProcess, Path]]:
    root = tmp_path_factory.mktemp("tenants")
    for name in ("m", "other"):
        demo.make_mlp(root / "repo" / name, width=64, layers=2, in_width=64)
    # Slow enough (a few ms a batch here) that 16 callers keep a backlog queued.
    demo.make_mlp(root / "repo" / "slow", 768, 6, in_width=64, config="max_batch_size: 4\n")
    file = root / "tenants.yaml"
    admin("add", "acme", "--models", "m", "--file", str(file))
    admin("add", "metered", "--rate", "40", "--burst", "1", "--file", str(file))
    admin("add", "free", "--file", str(file))
    admin("add", "light", "--weight", "1", "--file", str(file))
    admin("add", "heavy", "--weight", "3", "--file", str(file))
    admin("add", "flood", "--file", str(file))
    env = {
        "EDGEPLEX_AGENT_SECURITY__TENANTS_FILE": str(file),
        "EDGEPLEX_AGENT_USAGE_DIR": str(root / "usage"),
    }
    process = start_agent(root / "repo", root, env=env)
    yield process, file
    assert process.stop() == 0, process.log()


def key_of(file: Path, tenant: str) -> str:
    return issued_key(admin("key", "issue", tenant, "--file", str(file)))


def test_keys_identify_tenants_and_rotate_without_downtime(site) -> None:
    agent, file = site
    old = key_of(file, "acme")
    wait_until(lambda: Client(agent, old).infer()[0] == 200, what="the file reread")
    assert Client(agent, None).infer()[0] == 401  # tenants exist: no anonymous access
    assert Client(agent, "epk_000000000000_" + "x" * 43).infer()[0] == 401
    assert Client(agent, old[:-1] + ("A" if old[-1] != "A" else "B")).infer()[0] == 401
    assert Client(agent, old).infer("other")[0] == 403  # outside acme's models
    assert Client(agent, ADMIN_TOKEN).infer("other")[0] == 200  # the admin token: any

    new = key_of(file, "acme")  # rotation: both work until the old one is revoked
    wait_until(lambda: Client(agent, new).infer()[0] == 200, what="the new key")
    assert Client(agent, old).infer()[0] == 200
    admin("key", "revoke", "acme", old.split("_")[1], "--file", str(file))
    wait_until(lambda: Client(agent, old).infer()[0] == 401, what="the revocation")
    assert Client(agent, new).infer()[0] == 200

    client = tg.InferenceServerClient(agent.grpc_url)
    tensor = tg.InferInput("input", [1, 64], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
    for key, model, code in ((old, "m", "UNAUTHENTICATED"), (new, "other", "PERMISSION_DENIED")):
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, [tensor], headers={"authorization": f"Bearer {key}"})
        assert refused.value.status() == f"StatusCode.{code}", refused.value
    client.infer("m", [tensor], headers={"authorization": f"Bearer {new}"})
    client.close()


def test_a_tenants_rate_holds_and_touches_no_other_tenant(site) -> None:
    agent, file = site
    metered, free = key_of(file, "metered"), key_of(file, "free")
    wait_until(lambda: Client(agent, free).infer()[0] == 200, what="the keys")
    outcomes: dict[str, Counter[int]] = {"metered": Counter(), "free": Counter()}
    retry_after: list[str] = []
    seconds = 5.0
    stop = time.monotonic() + seconds

    def loop(tenant: str, key: str) -> None:
        client = Client(agent, key)
        while time.monotonic() < stop:
            status, headers = client.infer()
            outcomes[tenant][status] += 1
            if status == 429:
                retry_after.append(headers.get("Retry-After", ""))

    threads = [threading.Thread(target=loop, args=("metered", metered)) for _ in range(4)]
    threads.append(threading.Thread(target=loop, args=("free", free)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    accepted = outcomes["metered"][200] / seconds
    assert abs(accepted - 40) <= 0.05 * 40, outcomes
    assert set(outcomes["metered"]) == {200, 429}
    assert retry_after and all(r.isdigit() and int(r) >= 1 for r in retry_after)
    assert set(outcomes["free"]) == {200} and outcomes["free"][200] > 50, outcomes
    metrics = agent.http_get("/metrics")[1].decode()
    assert 'edgeplex_tenant_requests_total{outcome="rate_limited",tenant="metered"}' in metrics


def test_backlogged_tenants_share_a_saturated_model_by_weight(site) -> None:
    agent, file = site
    keys = {tenant: key_of(file, tenant) for tenant in ("light", "heavy")}
    wait_until(lambda: Client(agent, keys["heavy"]).infer("slow")[0] == 200, what="the keys")
    before = journaled(file.parent / "usage", "slow")
    served: Counter[str] = Counter()
    stop = time.monotonic() + 4.0

    def loop(tenant: str) -> None:
        client = Client(agent, keys[tenant])
        while time.monotonic() < stop:
            if client.infer("slow")[0] == 200:
                served[tenant] += 1

    threads = [threading.Thread(target=loop, args=(t,)) for t in ("light", "heavy") * 8]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ratio = served["heavy"] / served["light"]
    assert abs(ratio - 3.0) <= 0.3, served
    # Their batches were shared (4 a batch, the two tenants interleaved): each
    # tenant's usage is still exactly its own requests, bytes and no failures.
    after = journaled(file.parent / "usage", "slow")
    used = {t: [a - b for a, b in zip(after[t], before.get(t, (0, 0, 0, 0)), strict=True)]
            for t in ("light", "heavy")}  # fmt: skip
    for tenant in ("light", "heavy"):
        requests, bytes_in, bytes_out, failures = used[tenant]
        assert (requests, failures) == (served[tenant], 0), (tenant, used, served)
        assert bytes_in == requests * 64 * 4, used
        assert bytes_out == requests * (used["heavy"][2] // used["heavy"][0]), used


def journaled(directory: Path, model: str) -> dict[str, tuple[int, int, int, int]]:
    """Each tenant's usage of `model` in the agent's journal so far (the minute being
    written included): requests, bytes in, bytes out, failures."""
    totals: dict[str, tuple[int, int, int, int]] = {}
    for _, path in minute_files(directory):
        for r in fold(path, 60):
            if r.model == model:
                was = totals.get(r.tenant, (0, 0, 0, 0))
                now = (r.requests, r.bytes_in, r.bytes_out, sum(r.failures.values()))
                totals[r.tenant] = tuple(a + b for a, b in zip(was, now, strict=True))  # type: ignore[assignment]
    return totals


def test_a_light_tenant_keeps_its_latency_beside_a_flood(site) -> None:
    """One closed-loop caller of one tenant, alone on a saturated model and then
    beside 32 callers of another tenant that never pause (in their own process):
    fair queueing puts its request in the next batch, so it waits for at most the
    batch running. First-come order would put it behind 32 requests (8 batches).
    (bench/tenants.py measures the same with wrk as the flood.)"""
    agent, file = site
    light, flood = key_of(file, "light"), key_of(file, "flood")
    wait_until(lambda: Client(agent, flood).infer("slow")[0] == 200, what="the keys")

    def p99(seconds: float) -> float:
        client, latencies = Client(agent, light), []
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            sent = time.perf_counter()
            assert client.infer("slow")[0] == 200
            latencies.append(time.perf_counter() - sent)
        return float(np.percentile(latencies, 99))

    alone = p99(5.0)
    # The flood's client at the lowest CPU priority: its callers come from another
    # machine in real life, and only the agent's share of this one is measured.
    host, port = agent.http_url.rsplit(":", 1)
    flooding = subprocess.Popen(
        ["nice", "-n", "19", sys.executable, "-c", FLOOD, host, port, flood],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert flooding.stdout is not None and flooding.stdout.readline() == "flooding\n"
    time.sleep(1.0)  # its backlog builds first
    beside = p99(5.0)
    out, _ = flooding.communicate(timeout=30)
    served = json.loads(out)
    assert served.get("200", 0) > 0 and set(served) == {"200"}, served
    # Its floor: the batch running when it arrives, then a full batch of 4. With the
    # flood from a lean client (tests/support/load.py), 12 runs here measured 1.26x
    # to 2.26x, median 1.7x (the goal: 2x); on a slower day (2026-12-06) 2.2x to
    # 2.8x, median 2.6x, the same for this code and the one before it, side by side,
    # and 3.04x once in a suite run. First-come order measures 7-8x: the bound
    # tells the two apart with room for this machine's noise in a p99 of 5 s.
    ratio = beside / alone
    assert ratio <= 4.0, f"{alone * 1000:.2f} ms alone, {beside * 1000:.2f} ms beside"


FLOOD = """
import json, sys
import numpy as np
from tests.support.load import binary_body, lean_flood
host, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data, headers = binary_body(np.full((1, 64), 0.5, np.float32), binary_output=True)
print("flooding", flush=True)
codes = lean_flood(host, port, "/v2/models/slow/infer",
                   (data, {**headers, "Authorization": f"Bearer {key}"}), 32, 7.0)
print(json.dumps({str(k): v for k, v in codes.items()}))
"""


def test_a_tenants_concurrency_and_rate_over_grpc(tmp_path: Path) -> None:
    demo.make_mlp(tmp_path / "repo" / "m", width=64, layers=2, in_width=64)
    file = tmp_path / "tenants.yaml"
    admin("add", "slow", "--rate", "0.1", "--burst", "1", "--file", str(file))
    key = key_of(file, "slow")
    agent = start_agent(
        tmp_path / "repo", tmp_path, env={"EDGEPLEX_AGENT_SECURITY__TENANTS_FILE": str(file)}
    )
    try:
        client = tg.InferenceServerClient(agent.grpc_url)
        tensor = tg.InferInput("input", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 64), np.float32))
        auth = {"authorization": f"Bearer {key}"}
        client.infer("m", [tensor], headers=auth)  # the burst of one
        with pytest.raises(InferenceServerException) as refused:
            client.infer("m", [tensor], headers=auth)
        assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "over its rate of 0.1 requests a second" in str(refused.value)
        client.close()
    finally:
        assert agent.stop() == 0, agent.log()


# --- the pure parts ------------------------------------------------------------------


def test_a_bucket_gives_its_rate_and_says_how_long_to_wait() -> None:
    bucket = Bucket(rate=10.0, burst=2.0, tokens=2.0, stamp=0.0)
    assert bucket.take(0.0) == 0.0 and bucket.take(0.0) == 0.0
    assert bucket.take(0.0) == pytest.approx(0.1)
    assert bucket.take(0.1) == 0.0  # one token back after 1/rate
    # Over the next second, ten more, asked for a thousand times.
    taken = sum(bucket.take(0.1 + (i + 1) * 0.001 + 1e-9) == 0.0 for i in range(1000))
    assert taken == 10


def test_a_refund_gives_the_token_back_up_to_the_burst() -> None:
    gate = Tenants(TenantTable([tenants.Tenant(name="t", rate=1.0, burst=1)]), clock=lambda: 0.0)
    burst = gate._buckets["t"].burst
    for _ in range(int(burst)):
        gate.admit("t", "m")
    with pytest.raises(RateLimited):
        gate.admit("t", "m")
    gate.refund("t")  # a probe, not the tenant's request
    gate.admit("t", "m")
    for _ in range(5):
        gate.refund("t")
    assert gate._buckets["t"].tokens == burst  # never above the burst


def test_keys_are_stored_hashed_and_found_by_id() -> None:
    table = tenants.add(TenantTable(), "acme", {"rate": 5})
    table, key, record = tenants.issue_key(table, "acme")
    assert key.startswith("epk_") and record.sha256 == tenants.key_hash(key)
    assert key not in json.dumps(table.dump())
    assert table.identify(key).name == "acme"  # type: ignore[union-attr]
    assert table.identify(key + "x") is None and table.identify("garbage") is None
    table = tenants.revoke_key(table, "acme", record.id)
    assert table.identify(key) is None
    with pytest.raises(tenants.TenantExists):
        tenants.add(table, "acme", {})
    with pytest.raises(tenants.UnknownTenant):
        tenants.update(table, "nobody", {"rate": 1})
    with pytest.raises(ValueError, match="rate"):
        tenants.update(table, "acme", {"rate": -1})
    assert tenants.update(table, "acme", {"rate": 0}).tenants["acme"].rate is None


def test_the_gate_decides_by_tenant() -> None:
    now = [0.0]
    table = TenantTable(
        [
            tenants.Tenant(name="capped", concurrency=1),
            tenants.Tenant(name="listed", models=["resnet*"]),
        ],
        legacy=("old-style-key", tenants.Tenant(name="default")),
    )
    gate = Tenants(table, clock=lambda: now[0])
    assert gate.identify("Bearer old-style-key") == "default"
    with pytest.raises(Unauthenticated):
        gate.identify(None)  # tenants exist, anonymous is auto
    gate.admin = b"admin-secret"
    assert gate.identify("Bearer admin-secret") == ADMIN
    gate.admin = b"rotated"  # a value found valid before is checked again after a change
    with pytest.raises(Unauthenticated):
        gate.identify("Bearer admin-secret")
    gate.replace(TenantTable([tenants.Tenant(name="capped", concurrency=1)], legacy=None))
    with pytest.raises(Unauthenticated):
        gate.identify("Bearer old-style-key")  # the table changed: its key went with it
    gate.replace(table)
    gate.admit("capped", "m")
    with pytest.raises(RateLimited):
        gate.admit("capped", "m")
    gate.release("capped")
    gate.admit("capped", "m")
    assert gate.admit("listed", "resnet50") is not None
    with pytest.raises(PermissionDenied):
        gate.admit("listed", "bert")
    assert Tenants().identify(None) == ANONYMOUS  # no tenants: open, as before
    with pytest.raises(Unauthenticated):
        Tenants(anonymous="deny").identify(None)


def test_grpc_status_codes_of_the_refusals() -> None:
    assert RateLimited("x").grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert RateLimited("x").http_status == 429


def test_a_fleet_rate_is_split_by_each_sites_share_of_demand() -> None:
    rates = tenants.split_rate(100.0, {"a": 90, "b": 10}, ["a", "b", "c"])
    assert rates == {"a": 86.0, "b": 9.5, "c": 4.8}  # c: the floor, so new traffic starts
    assert tenants.split_rate(90.0, {}, ["a", "b", "c"]) == {"a": 30.0, "b": 30.0, "c": 30.0}
    table = TenantTable(
        [tenants.Tenant(name="t", fleet_rate=100.0, rate=50.0), tenants.Tenant(name="u")]
    )
    at_a = tenants.for_site(table, {"t": rates}, "a")
    assert at_a.tenants["t"].rate == 50.0  # its per-site rate is lower
    assert tenants.for_site(table, {"t": rates}, "c").tenants["t"].rate == 4.8
    assert tenants.for_site(table, {"t": rates}, "c").tenants["u"].rate is None
