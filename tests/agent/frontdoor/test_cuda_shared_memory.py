"""Triton's CUDA shared-memory extension on an agent whose runners use CUDA, through
the stock tritonclient (gRPC) and Triton's JSON (HTTP), as Triton's cudashm
examples use it: the client allocates device memory, registers its IPC handle,
and the agent reads inputs from it and writes outputs into it. Needs a GPU, its
driver and ONNX Runtime's CUDA build; skipped anywhere else (bench/gpu_check.sh
runs it on a GPU machine)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.frontdoor import cuda_ipc
from tests.conftest import AgentProcess, start_agent


def _gpu() -> str:
    """Why this machine cannot run the test, or ""."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "ONNX Runtime has no CUDA provider here"
    try:
        return "" if cuda_ipc.driver().device_count() else "no CUDA device"
    except cuda_ipc.Unavailable as exc:
        return str(exc)


pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_gpu()), reason=_gpu() or "GPU")]

ROW = 16 * 4  # one row of add_sub's FP32 tensors


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("cudashm")
    demo.make_add_sub(root / "repo" / "simple")
    env = {"EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER": "cuda"}
    process = start_agent(root / "repo", root, env=env)
    yield process
    assert process.stop() == 0, process.log()


class DeviceRegion:
    """Device memory a client allocated, and its IPC handle (the agent is another
    process, as CUDA IPC requires)."""

    def __init__(self, size: int) -> None:
        self.driver, self.size = cuda_ipc.driver(), size
        self.pointer = self.driver.allocate(size, 0)
        self.raw = self.driver.ipc_handle(self.pointer, 0)
        self.handle = base64.b64encode(self.raw)  # as tritonclient's get_raw_handle gives it

    def put(self, array: np.ndarray, offset: int = 0) -> None:
        self.driver.to_device(self.pointer + offset, array.tobytes(), 0)

    def get(self, count: int, offset: int = 0) -> np.ndarray:
        return np.frombuffer(self.driver.to_host(self.pointer + offset, count * 4, 0), np.float32)

    def close(self) -> None:
        self.driver.free(self.pointer, 0)


def _post(agent: AgentProcess, path: str, body: dict[str, object]) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://{agent.http_url}{path}", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else {}
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_inputs_and_outputs_travel_through_cuda_shared_memory(agent: AgentProcess) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    client.unregister_cuda_shared_memory()
    inputs_region, outputs_region = DeviceRegion(2 * ROW), DeviceRegion(2 * ROW)
    try:
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.full((1, 16), 2, dtype=np.float32)
        inputs_region.put(a)
        inputs_region.put(b, offset=ROW)
        client.register_cuda_shared_memory("input_data", inputs_region.handle, 0, 2 * ROW)
        # The HTTP door takes the handle as Triton's JSON carries it.
        status, _ = _post(
            agent,
            "/v2/cudasharedmemory/region/output_data/register",
            {"raw_handle": {"b64": outputs_region.handle.decode()},
             "device_id": 0, "byte_size": 2 * ROW},
        )  # fmt: skip
        assert status == 200
        listed = client.get_cuda_shared_memory_status().regions
        assert set(listed) == {"input_data", "output_data"}
        assert listed["input_data"].byte_size == 2 * ROW
        assert not client.get_system_shared_memory_status().regions  # kept apart

        inputs = [tg.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("input_data", ROW)
        inputs[1].set_shared_memory("input_data", ROW, offset=ROW)
        outputs = [tg.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("output_data", ROW)
        outputs[1].set_shared_memory("output_data", ROW, offset=ROW)
        client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(outputs_region.get(16), (a + b).ravel())
        np.testing.assert_array_equal(outputs_region.get(16, offset=ROW), (a - b).ravel())

        # A place past the region's end is refused before the model runs.
        inputs[1].set_shared_memory("input_data", ROW, offset=2 * ROW)
        with pytest.raises(InferenceServerException, match="do not fit"):
            client.infer("simple", inputs, outputs=outputs)
        # A handle that is not 64 bytes, and one that opens nothing, are refused.
        with pytest.raises(InferenceServerException, match="64"):
            client.register_cuda_shared_memory("short", base64.b64encode(b"\1" * 8), 0, 64)
        with pytest.raises(InferenceServerException, match="failed to register"):
            client.register_cuda_shared_memory("bogus", base64.b64encode(b"\1" * 64), 0, 64)

        client.unregister_cuda_shared_memory("input_data")
        assert set(client.get_cuda_shared_memory_status().regions) == {"output_data"}
        client.unregister_cuda_shared_memory()
        assert not client.get_cuda_shared_memory_status().regions
        assert agent.http_get("/v2/health/ready")[0] == 200
    finally:
        client.unregister_cuda_shared_memory()
        inputs_region.close()
        outputs_region.close()
        client.close()
