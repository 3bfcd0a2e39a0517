"""The Batch API: durable jobs, shards at idle sites, a control-plane restart mid-job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from edgeplex.agent.catalog import demo
from edgeplex.artifacts import sha256_of
from edgeplex.control_plane.batch import SiteLoad, is_night, make_job, pick_site
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from tests.conftest import AgentProcess
from tests.services import TOKEN, ControlPlane
from tests.support.fleet import running_fleet
from tests.support.waiting import wait_until

AUTH = [("authorization", f"Bearer {TOKEN}")]
SITES = (("a1", "a"), ("b1", "b"))


def site(sid: str, region: str, util: float = 0.0, loaded: tuple[str, ...] = ()) -> SiteLoad:
    return SiteLoad(sid, region, f"{sid}:8000", True, False, util, frozenset(loaded))


def test_shards_prefer_idle_sites_where_it_is_night() -> None:
    noon_utc = 12 * 3600.0
    offsets = {"eu": 0.0, "ap": 12.0}  # noon in eu, midnight in ap
    assert is_night("ap", offsets, noon_utc) and not is_night("eu", offsets, noon_utc)
    sites = [site("eu1", "eu"), site("ap1", "ap", util=0.3), site("ap2", "ap", util=0.9)]
    assert pick_site(sites, "m", {}, offsets, noon_utc).site_id == "ap1"  # type: ignore[union-attr]
    # Busy with a shard already: the next one goes to the day side rather than wait.
    assert pick_site(sites, "m", {"ap1": 1}, offsets, noon_utc).site_id == "eu1"  # type: ignore[union-attr]
    assert pick_site(sites, "m", {"ap1": 1, "eu1": 1}, offsets, noon_utc) is None
    # Same time of day: the site that already has the model loaded.
    both = [site("eu1", "eu"), site("eu2", "eu", loaded=("m",))]
    assert pick_site(both, "m", {}, offsets, noon_utc).site_id == "eu2"  # type: ignore[union-attr]
    # A site with no HTTP address takes no shard, idle as it is.
    headless = [replace(site("ap1", "ap"), http_address=""), site("eu1", "eu", util=0.2)]
    assert pick_site(headless, "m", {}, offsets, noon_utc).site_id == "eu1"  # type: ignore[union-attr]


def test_jobs_validate_their_inputs() -> None:
    job, shards = make_job("m", ['{"inputs": []}'] * 70, 32)
    assert (job.items, job.shards, len(shards)) == (70, 3, 3)
    with pytest.raises(ValueError, match="input 1 is not JSON"):
        make_job("m", ['{"inputs": []}', "nope"], 0)


def body(i: int) -> str:
    data = [float(i % 7) / 7 + k / 32 for k in range(32)]
    return json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": data}]}
    )


@pytest.fixture(scope="module")
def batch_fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ControlPlane, Path, list[AgentProcess]]]:
    workdir = tmp_path_factory.mktemp("batch")
    with running_fleet(workdir) as fleet:
        cp, agents = fleet.cp, [fleet.start_agent(sid, region) for sid, region in SITES]
        demo.make_mlp(workdir / "src", width=64, layers=2, in_width=32, seed=5)
        model = workdir / "src" / "1" / "model.onnx"
        with grpc.insecure_channel(cp.address) as channel:
            pb_grpc.AdminServiceStub(channel).AddModel(
                pb.CatalogModel(name="mlp", artifact_uri=model.as_uri(), sha256=sha256_of(model),
                                min_replicas=2),
                metadata=AUTH,
            )  # fmt: skip
        yield cp, model, agents


def admin(cp: ControlPlane, method: str, request: object) -> object:
    with grpc.insecure_channel(cp.address) as channel:
        return getattr(pb_grpc.AdminServiceStub(channel), method)(
            request, metadata=AUTH, timeout=10
        )


@pytest.mark.slow
def test_a_restart_mid_job_loses_no_shard_and_duplicates_none(batch_fleet) -> None:  # type: ignore[no-untyped-def]
    cp, model, _ = batch_fleet
    items = [body(i) for i in range(120)]
    wait_until(lambda: admin(cp, "GetModel", pb.ModelName(name="mlp")).model.state == "READY")  # type: ignore[attr-defined]
    job = admin(cp, "SubmitBatch", pb.BatchSubmit(model="mlp", inputs=items, shard_size=4))
    job_id = job.job_id  # type: ignore[attr-defined]
    wait_until(lambda: admin(cp, "GetBatch", pb.BatchRef(job_id=job_id)).shards_done >= 3,  # type: ignore[attr-defined]
               what="some shards done")  # fmt: skip
    cp.stop(signal.SIGKILL)
    cp.start()
    done = wait_until(
        lambda: (j := admin(cp, "GetBatch", pb.BatchRef(job_id=job_id))).state == "DONE" and j,  # type: ignore[attr-defined]
        timeout=90, what="job done",
    )  # fmt: skip
    assert done.shards_done == 30 and done.items_failed == 0  # type: ignore[attr-defined]
    sites = {s.site_id for s in done.shard_states}  # type: ignore[attr-defined]
    assert sites <= {"a1", "b1"}
    results = admin(cp, "GetBatchResults", pb.BatchRef(job_id=job_id)).outputs  # type: ignore[attr-defined]
    assert len(results) == len(items)  # nothing lost, nothing twice
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for i, output in enumerate(results):
        got = np.array(json.loads(output)["outputs"][0]["data"], dtype=np.float32)
        x = np.array(json.loads(items[i])["inputs"][0]["data"], dtype=np.float32).reshape(1, 32)
        np.testing.assert_allclose(
            got, session.run(None, {"input": x})[0].ravel(), rtol=1e-4, atol=1e-5
        )


@pytest.mark.slow
def test_batch_cli(batch_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cp, _, _ = batch_fleet
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("\n".join(body(i) for i in range(10)) + "\n")
    env = {**os.environ, "EDGEPLEX_ADMIN_TOKEN": TOKEN, "EDGEPLEX_CONTROL_PLANE": cp.address}
    cli = [sys.executable, "-m", "edgeplex", "admin", "batch"]
    wait_until(lambda: admin(cp, "GetModel", pb.ModelName(name="mlp")).model.state == "READY")  # type: ignore[attr-defined]
    submit = subprocess.run([*cli, "submit", "--model", "mlp", "--inputs", str(inputs)],
                            env=env, capture_output=True, text=True, check=True)  # fmt: skip
    job_id = submit.stdout.strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = subprocess.run([*cli, "status", job_id], env=env, capture_output=True, text=True)
        if "DONE" in status.stdout.splitlines()[0]:
            break
        time.sleep(0.3)
    assert "10 items" in status.stdout
    out = tmp_path / "out.jsonl"
    subprocess.run([*cli, "results", job_id, "--out", str(out)], env=env, check=True,
                   capture_output=True)  # fmt: skip
    lines = out.read_text().splitlines()
    assert len(lines) == 10 and all(json.loads(ln)["model_name"] == "mlp" for ln in lines)
    bad = subprocess.run([*cli, "submit", "--model", "nope", "--inputs", str(inputs)],
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and "NOT_FOUND" in bad.stderr


@pytest.mark.slow
def test_batch_list_cancel_and_wait(batch_fleet, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cp, _, _ = batch_fleet
    env = {**os.environ, "EDGEPLEX_ADMIN_TOKEN": TOKEN, "EDGEPLEX_CONTROL_PLANE": cp.address}
    cli = [sys.executable, "-m", "edgeplex", "admin", "batch"]
    wait_until(lambda: admin(cp, "GetModel", pb.ModelName(name="mlp")).model.state == "READY")  # type: ignore[attr-defined]
    small = tmp_path / "small.jsonl"
    small.write_text("\n".join(body(i) for i in range(6)) + "\n")
    waited = subprocess.run(
        [*cli, "submit", "--model", "mlp", "--inputs", str(small), "--shard-size", "2",
         "--wait", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    done = json.loads(waited.stdout)
    assert done["state"] == "DONE" and done["shards_done"] == 3
    # A long job, cancelled while it runs: it stops, and keeps no results.
    big = tmp_path / "big.jsonl"
    big.write_text("\n".join(body(i) for i in range(2000)) + "\n")
    job = admin(cp, "SubmitBatch", pb.BatchSubmit(
        model="mlp", inputs=big.read_text().splitlines(), shard_size=2))  # fmt: skip
    job_id = job.job_id  # type: ignore[attr-defined]
    listed = subprocess.run([*cli, "list"], env=env, capture_output=True, text=True, check=True)
    assert (
        job_id in listed.stdout and done["job_id"] in listed.stdout and "RUNNING" in listed.stdout
    )
    cancel = subprocess.run([*cli, "cancel", job_id], env=env, capture_output=True, text=True)
    assert cancel.returncode == 0 and "CANCELLED" in cancel.stdout, cancel.stderr
    time.sleep(2)  # the scheduler's next ticks: nothing more of it runs
    shards = admin(cp, "GetBatch", pb.BatchRef(job_id=job_id)).shards_done  # type: ignore[attr-defined]
    time.sleep(2)
    assert admin(cp, "GetBatch", pb.BatchRef(job_id=job_id)).shards_done <= shards + 2  # type: ignore[attr-defined]
    results = subprocess.run([*cli, "results", job_id], env=env, capture_output=True, text=True)
    assert results.returncode == 1 and "cancelled" in results.stderr
    again = subprocess.run([*cli, "cancel", done["job_id"]], env=env, capture_output=True,
                           text=True)  # fmt: skip
    assert again.returncode == 1 and "already done" in again.stderr


def test_results_are_capped_and_expire_with_their_job(tmp_path: Path) -> None:
    """A result beyond MAX_OUTPUT_BYTES is recorded as an error in its place, and a
    job that ended RESULTS_TTL_S ago goes with everything it stored (real Redis, a
    real HTTP site)."""
    import asyncio

    import aiohttp
    from aiohttp import web

    from edgeplex.control_plane import batch
    from edgeplex.control_plane.store import ShardLease, Store
    from tests.services import RedisServer
    from tests.support.fake_site import fake_infer_site

    redis_server = RedisServer(tmp_path)
    redis_server.start()

    async def infer(request: web.Request) -> web.Response:
        item = json.loads(await request.read())["inputs"][0]["data"][0]
        size = batch.MAX_OUTPUT_BYTES + 1 if item == 0 else 10
        return web.json_response({"outputs": [{"data": "x" * size}]})

    async def scenario() -> None:
        store = Store(redis_server.url)
        async with fake_infer_site(infer) as port, aiohttp.ClientSession() as session:
            job, shards = batch.make_job("m", [body(0), body(1)], 2)
            await store.put_batch(job, shards)
            runs = batch.BatchRunner(store, None, {})  # type: ignore[arg-type]
            runs._http = session
            runs._busy["s1"] = 1
            where = batch.SiteLoad("s1", "a", f"127.0.0.1:{port}", True, False, 0.0, frozenset())
            lease = ShardLease("s1", time.time() + 60, 1)
            await store.lease_batch_shard(job.job_id, 0, "", lease)
            await runs._run_shard(job, 0, where, lease)
            (raw,) = (await store.batch_outputs(job.job_id)).values()
            first, second = json.loads(raw)
            assert "exceeds" in json.loads(first)["error"]
            assert json.loads(second)["outputs"][0]["data"] == "x" * 10
            job.state, job.finished_at = "DONE", time.time() - batch.RESULTS_TTL_S - 1
            await store.update_batch(job)
            fresh, fresh_shards = batch.make_job("m", [body(1)], 1)
            fresh.state, fresh.finished_at = "DONE", time.time()
            await store.put_batch(fresh, fresh_shards)
            await runs._tick()
            assert await store.get_batch(job.job_id) is None
            assert await store.batch_outputs(job.job_id) == {}
            assert await store.get_batch(fresh.job_id) is not None
        await store.close()

    try:
        asyncio.run(scenario())
    finally:
        redis_server.stop()
