"""The fleet dashboard: a live control plane with two agents, read over HTTP and in
real headless Chromium (selenium), and its token-guarded actions."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from edgeplex.agent.catalog import demo
from edgeplex.artifacts import sha256_of
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.conftest import AgentProcess, free_port
from tests.services import TOKEN, ControlPlane
from tests.support.fleet import running_fleet
from tests.support.waiting import wait_until

AUTH = (("authorization", f"Bearer {TOKEN}"),)


class Fleet:
    def __init__(
        self, cp: ControlPlane, http: str, workdir: Path, agents: list[AgentProcess]
    ) -> None:
        self.cp, self.http, self.workdir, self.agents = cp, http, workdir, agents

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        try:
            with urllib.request.urlopen(self.http + path, timeout=10) as reply:
                return reply.status, dict(reply.headers), reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def post(self, path: str, token: str | None = TOKEN) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(self.http + path, data=b"", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def state(self) -> dict[str, Any]:
        status, _, body = self.get("/dashboard/state.json")
        assert status == 200, body
        return json.loads(body)  # type: ignore[no-any-return]

    def admin(self, method: str, request: object) -> Any:
        with grpc.insecure_channel(self.cp.address) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            return getattr(stub, method)(request, metadata=AUTH, timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    workdir = tmp_path_factory.mktemp("dashboard")
    port = free_port()
    sites = (("a1", "a"), ("b1", "b"))
    with running_fleet(workdir, EDGEPLEX_CP_HTTP_PORT=str(port)) as started:
        cp, agents = started.cp, [started.start_agent(sid, region) for sid, region in sites]
        demo.make_mlp(workdir / "src", width=64, layers=2, in_width=32, seed=5)
        model = workdir / "src" / "1" / "model.onnx"
        handle = Fleet(cp, f"http://127.0.0.1:{port}", workdir, agents)
        handle.admin(
            "AddModel",
            pb.CatalogModel(name="mlp", artifact_uri=model.as_uri(), sha256=sha256_of(model),
                            min_replicas=2),
        )  # fmt: skip
        yield handle


def test_the_state_shows_sites_models_and_where_they_are(fleet: Fleet) -> None:
    status, headers, page = fleet.get("/")
    assert status == 200 and b"edgeplex fleet" in page
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    state = wait_until(
        lambda: (s := fleet.state())["tiers"].get("a1", {}).get("mlp") == "loaded" and s,
        30, "mlp loaded at a1 in the dashboard's state",
    )  # fmt: skip
    assert {s["site"] for s in state["sites"]} == {"a1", "b1"}  # type: ignore[index]
    assert all(s["up"] for s in state["sites"])  # type: ignore[index]
    assert state["models"][0]["name"] == "mlp"  # type: ignore[index]
    # A request's usage, once its minute is closed and sent, is in the usage view, by
    # model, by site and by hour.
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32",
                                   "data": [0.5] * 32}]}).encode()  # fmt: skip
    request = urllib.request.Request(
        f"http://{fleet.agents[0].http_url}/v2/models/mlp/infer", data=body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200

    def used(by: str, days: int = 1) -> list[dict[str, object]]:
        status, _, body = fleet.get(f"/dashboard/usage.json?by={by}&days={days}")
        assert status == 200, body
        return json.loads(body)["rows"]  # type: ignore[no-any-return]

    rows = wait_until(lambda: [u for u in used("model") if str(u["model"]).startswith("mlp")],
                      30, "usage on the dashboard")  # fmt: skip
    assert rows[0]["requests"] >= 1, rows  # type: ignore[index]
    sites = {u["site"] for u in used("site")}
    assert sites and sites <= {"a1", "b1"}, sites
    hours = [str(u["hour"]) for u in used("hour")]
    assert hours and all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:00Z", h) for h in hours), hours
    # The 7- and 30-day windows hold the last day's requests too (their hours before
    # it are the longer sums: none yet in a new fleet).
    for days in (7, 30):
        assert sum(u["requests"] for u in used("day", days)) == sum(  # type: ignore[misc]
            u["requests"]
            for u in used("site")  # type: ignore[misc]
        )
    # One tenant's rows alone; a name that is no tenant's has none, one that is no
    # name is refused.
    tenant = rows[0]["tenant"]  # type: ignore[index]
    status, _, body = fleet.get(f"/dashboard/usage.json?tenant={tenant}")
    assert status == 200 and json.loads(body)["rows"] == used("model"), body
    status, _, body = fleet.get("/dashboard/usage.json?tenant=nobody")
    assert status == 200 and json.loads(body)["rows"] == [], body
    assert fleet.get("/dashboard/usage.json?tenant=..%2Fx")[0] == 400
    assert fleet.get("/dashboard/usage.json?by=tenant")[0] == 400
    assert fleet.get("/dashboard/usage.json?days=2")[0] == 400
    status, _, body = fleet.get("/dashboard/explain/mlp")
    assert status == 200 and any("a1" in line for line in json.loads(body)["lines"])
    assert fleet.get("/dashboard/explain/..%2Fx")[0] in (400, 404)


def test_actions_need_the_admin_token(fleet: Fleet) -> None:
    assert fleet.post("/dashboard/sites/b1/cordon", token=None)[0] == 401
    assert fleet.post("/dashboard/sites/b1/cordon", token="wrong")[0] == 401
    assert fleet.post("/dashboard/sites/b1/cordon") == (200, {"site": "b1", "cordoned": True})
    assert next(s for s in fleet.state()["sites"] if s["site"] == "b1")["cordoned"]
    assert fleet.post("/dashboard/sites/b1/uncordon")[0] == 200
    assert fleet.post("/dashboard/sites/nowhere/drain")[0] == 404
    assert fleet.post("/dashboard/sites/b1/explode")[0] == 404
    items = [json.dumps({"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32",
                                     "data": [0.5] * 32}]})] * 400  # fmt: skip
    job = fleet.admin("SubmitBatch", pb.BatchSubmit(model="mlp", inputs=items, shard_size=1))
    assert any(b["job"] == job.job_id for b in fleet.state()["batches"])
    status, body = fleet.post(f"/dashboard/batches/{job.job_id}/cancel")
    assert (status, body["state"]) == (200, "CANCELLED")
    assert fleet.post(f"/dashboard/batches/{job.job_id}/cancel")[0] == 200  # stays cancelled
    assert fleet.post("/dashboard/batches/nope/cancel")[0] == 404


@pytest.mark.skipif(
    shutil.which("chromium") is None or shutil.which("chromedriver") is None,
    reason="needs Debian's chromium and chromium-driver (scripts/setup.sh installs them)",
)
def test_the_page_in_headless_chromium(fleet: Fleet, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def settled(read):  # type: ignore[no-untyped-def]
        """`read`, retried when it raced one of the page's re-renders (a stale element)."""

        def attempt():  # type: ignore[no-untyped-def]
            try:
                return read()
            except StaleElementReferenceException:
                return None

        return attempt

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or ""
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(fleet.http + "/")
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#sites tbody tr"), 20,
                   "the sites table filled")  # fmt: skip
        wait_until(
            settled(lambda: {row.get_attribute("data-site") for row in
                             driver.find_elements(By.CSS_SELECTOR, "#sites tbody tr")}
                    == {"a1", "b1"}),
            10, "both sites in the sites table",
        )  # fmt: skip
        wait_until(
            lambda: driver.find_elements(By.CSS_SELECTOR, "#matrix td.loaded[data-model='mlp']"),
            20, "a loaded cell for mlp",
        )  # fmt: skip
        # The page follows placement: a drain moves mlp away from b1, and the matrix
        # shows it without a reload.
        before = driver.find_element(By.TAG_NAME, "body").get_attribute("data-updated")
        assert fleet.post("/dashboard/sites/b1/drain")[0] == 200

        def b1_has_no_loaded_model() -> bool:
            row = next(r for r in driver.find_elements(By.CSS_SELECTOR, "#matrix tbody tr")
                       if r.find_element(By.TAG_NAME, "th").text == "b1")  # fmt: skip
            return not row.find_elements(By.CSS_SELECTOR, "td.loaded")

        wait_until(settled(b1_has_no_loaded_model), 30, "b1 drained in the matrix")
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-updated") != before

        def explain() -> bool:
            driver.find_element(By.CSS_SELECTOR, "#models button").click()
            return True

        wait_until(settled(explain), 10, "the explain button clicked")
        wait_until(settled(lambda: driver.find_element(By.ID, "explain").text), 10,
                   "an explanation")  # fmt: skip
        # The usage table over 30 days, by day: each select reads the table anew.
        Select(driver.find_element(By.ID, "usage-days")).select_by_value("30")
        Select(driver.find_element(By.ID, "usage-by")).select_by_value("day")
        wait_until(settled(lambda: driver.find_element(By.ID, "usage-key").text == "day"), 10,
                   "the usage table by day")  # fmt: skip
        driver.set_window_size(1400, 1100)
        driver.save_screenshot(os.environ.get("EDGEPLEX_SCREENSHOT", str(tmp_path / "shot.png")))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == [], errors
    finally:
        driver.quit()
        fleet.post("/dashboard/sites/b1/undrain")
