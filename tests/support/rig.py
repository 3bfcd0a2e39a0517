"""A rig brought up by a test, and the calls tests and benches make on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc

from edgeplex.agent.catalog import demo
from edgeplex.artifacts import sha256_of
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc
from edgeplex.rig.rig import Rig

CLIENT = r"""
import json, sys, time, urllib.request, urllib.error
url, n, retry = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
body = json.dumps({"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32",
                               "data": [1.0] * 32}]}).encode()
out = []
for _ in range(n):
    for attempt in range(2 if retry else 1):
        t = time.perf_counter()
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
                out.append({"ms": (time.perf_counter() - t) * 1000, "status": 200,
                            "served_by": r.headers.get("edgeplex-served-by"),
                            "cold": r.headers.get("edgeplex-cold-start")})
                break
        except urllib.error.HTTPError as e:
            out.append({"ms": (time.perf_counter() - t) * 1000, "status": e.code,
                        "retry_after": e.headers.get("Retry-After")})
            if retry and attempt == 0:
                time.sleep(float(e.headers.get("Retry-After") or 1))
        except OSError as e:  # refused, timed out
            out.append({"ms": (time.perf_counter() - t) * 1000, "status": 0, "error": str(e)})
            if retry and attempt == 0:
                time.sleep(1)
print(json.dumps(out))
"""


class RigHandle:
    def __init__(self, rig: Rig, state: dict, workdir: Path) -> None:  # type: ignore[type-arg]
        self.rig, self.state, self.workdir = rig, state, workdir
        token = (rig.state_dir / "admin-token").read_text().strip()
        self.auth = [("authorization", f"Bearer {token}")]
        self.sites = {s["site_id"]: s for s in state["sites"]}

    def call(self, method: str, request: object) -> object:
        with grpc.insecure_channel(self.state["control_plane"]) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            return getattr(stub, method)(request, metadata=self.auth, timeout=10)

    def loaded_at(self, site: str) -> set[str]:
        placement = self.call("GetPlacement", pb.PlacementRequest())
        for sp in placement.sites:  # type: ignore[attr-defined]
            if sp.site_id == site:
                return set(sp.loaded)
        return set()

    def add_model(self, name: str, seed: int, **kw: object) -> None:
        folder = self.rig.artifact_root / name  # the rig's allowed file:// root
        demo.make_mlp(folder, width=64, layers=2, in_width=32, seed=seed)
        path = folder / "1" / "model.onnx"
        self.call(
            "AddModel",
            pb.CatalogModel(name=name, artifact_uri=path.as_uri(), sha256=sha256_of(path), **kw),
        )

    def client(self, from_site: str, to_site: str, model: str, n: int, retry: bool = False):  # type: ignore[no-untyped-def]
        """A process in `from_site`'s namespace sending n sequential requests to `to_site`."""
        url = f"http://{self.sites[to_site]['address']}:8000/v2/models/{model}/infer"
        namespace = self.sites[from_site]["namespace"]
        return subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, "-c", CLIENT, url, str(n),
             "1" if retry else "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def requests(self, from_site: str, to_site: str, model: str, n: int, retry: bool = False):  # type: ignore[no-untyped-def]
        out, err = self.client(from_site, to_site, model, n, retry).communicate(timeout=120)
        assert out, err
        return json.loads(out)

    def tier(self, site: str, model: str) -> str:
        import urllib.request

        url = f"http://{self.sites[site]['address']}:8000/edgeplex/v1/status"
        with urllib.request.urlopen(url, timeout=5) as reply:
            for entry in json.load(reply):
                if entry["name"] == model:
                    return str(entry["tier"])
        return ""
