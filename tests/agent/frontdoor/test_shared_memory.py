"""Triton's system shared-memory extension through the stock tritonclient, HTTP and
gRPC, as Triton's shm examples use it: regions registered, inputs read from them
and outputs written into them, strings too; the CUDA endpoints answer on a CPU
agent; what a client may register is bounded and checked."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.frontdoor.auth import Credentials
from edgeplex.agent.frontdoor.settings import SharedMemorySettings
from edgeplex.agent.frontdoor.shared_memory import ClientRegions, Ref, SharedMemory
from edgeplex.agent.oip.errors import InvalidInput, Unauthenticated
from tests.conftest import AgentProcess, start_agent

pytestmark = pytest.mark.slow

BYTES_16 = 16 * 4  # one row of add_sub's FP32 tensors


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    root = tmp_path_factory.mktemp("shm")
    demo.make_add_sub(root / "repo" / "simple")
    demo.make_identity(root / "repo" / "simple_identity", "BYTES")
    process = start_agent(root / "repo", root)
    yield process
    assert process.stop() == 0, process.log()


class Region:
    """A POSIX shared-memory region as a client makes one (the key is "/" + name)."""

    def __init__(self, size: int) -> None:
        self.shm = shared_memory.SharedMemory(f"edgeplex_test_{uuid.uuid4().hex[:12]}", True, size)
        self.key = "/" + self.shm.name

    def put(self, array: np.ndarray, offset: int = 0) -> None:
        data = array.tobytes()
        self.shm.buf[offset : offset + len(data)] = data

    def get(self, dtype: type, count: int, offset: int = 0) -> np.ndarray:
        return np.frombuffer(bytes(self.shm.buf[offset : offset + count * 4]), dtype)

    def close(self) -> None:
        self.shm.close()
        self.shm.unlink()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_travel_through_shared_memory(agent: AgentProcess, protocol: str):
    module = th if protocol == "http" else tg
    client = module.InferenceServerClient(agent.http_url if protocol == "http" else agent.grpc_url)
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()  # as Triton's examples begin: nothing there
    inputs_region, outputs_region = Region(2 * BYTES_16), Region(2 * BYTES_16)
    try:
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.full((1, 16), 2, dtype=np.float32)
        inputs_region.put(a)
        inputs_region.put(b, offset=BYTES_16)
        client.register_system_shared_memory("input_data", inputs_region.key, 2 * BYTES_16)
        client.register_system_shared_memory("output_data", outputs_region.key, 2 * BYTES_16)
        inputs = [module.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_shared_memory("input_data", BYTES_16)
        inputs[1].set_shared_memory("input_data", BYTES_16, offset=BYTES_16)
        outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        outputs[0].set_shared_memory("output_data", BYTES_16)
        outputs[1].set_shared_memory("output_data", BYTES_16, offset=BYTES_16)
        result = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(outputs_region.get(np.float32, 16), (a + b).ravel())
        np.testing.assert_array_equal(outputs_region.get(np.float32, 16, BYTES_16), (a - b).ravel())
        out = result.get_output("OUTPUT0")
        shape = out["shape"] if protocol == "http" else list(out.shape)
        assert shape == [1, 16]

        status = client.get_system_shared_memory_status()
        names = (
            {r["name"] for r in status} if protocol == "http" else set(status.regions)  # type: ignore[union-attr]
        )
        assert names == {"input_data", "output_data"}
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory("input_data", inputs_region.key, BYTES_16)

        # An output place too small for the result: refused, nothing written past it.
        outputs[0].set_shared_memory("output_data", BYTES_16 - 4)
        with pytest.raises(InferenceServerException, match="should be at least 64 bytes"):
            client.infer("simple", inputs, outputs=outputs[:1])

        client.unregister_system_shared_memory("input_data")
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory"):
            client.infer("simple", inputs)
        client.unregister_system_shared_memory()
        assert not (
            client.get_system_shared_memory_status()
            if protocol == "http"
            else client.get_system_shared_memory_status().regions  # type: ignore[union-attr]
        )

        with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported"):
            client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64)
        assert agent.http_get("/v2/health/ready")[0] == 200
    finally:
        client.unregister_system_shared_memory()
        inputs_region.close()
        outputs_region.close()
        client.close()


def test_strings_travel_through_shared_memory(agent: AgentProcess) -> None:
    client = tg.InferenceServerClient(agent.grpc_url)
    words = np.array([["shared", "memory", "", "ünïcode", "x" * 100, "y", "z", "w"]], dtype=object)
    encoded = b"".join(len(w.encode()).to_bytes(4, "little") + w.encode() for w in words.ravel())
    region = Region(2 * len(encoded))
    try:
        region.shm.buf[: len(encoded)] = encoded
        client.register_system_shared_memory("strings", region.key, 2 * len(encoded))
        tensor = tg.InferInput("INPUT", [1, 8], "BYTES")
        tensor.set_shared_memory("strings", len(encoded))
        wanted = tg.InferRequestedOutput("OUTPUT")
        wanted.set_shared_memory("strings", len(encoded), offset=len(encoded))
        client.infer("simple_identity", [tensor], outputs=[wanted])
        assert bytes(region.shm.buf[len(encoded) : 2 * len(encoded)]) == encoded
    finally:
        client.unregister_system_shared_memory()
        region.close()
        client.close()


def test_what_a_client_may_register_is_bounded(tmp_path: Path) -> None:
    memory = SharedMemory(
        SharedMemorySettings(key_prefix="/allowed_", max_regions=2, max_bytes=256)
    )
    regions = [Region(128) for _ in range(3)]
    try:
        with pytest.raises(InvalidInput, match="not under the prefix"):
            memory.register("a", regions[0].key, 0, 64)
        for reserved in ("/edgeplex-rings-1-x", "/allowed_/../etc"):
            with pytest.raises(InvalidInput):
                SharedMemory(SharedMemorySettings()).register("r", reserved, 0, 64)
        allowed = [shared_memory.SharedMemory(f"allowed_{uuid.uuid4().hex[:8]}", True, 128)
                   for _ in range(3)]  # fmt: skip
        try:
            keys = ["/" + s.name for s in allowed]
            with pytest.raises(InvalidInput, match="pass the end"):
                memory.register("a", keys[0], 64, 128)  # beyond the region's 128 bytes
            memory.register("a", keys[0], 0, 128)
            with pytest.raises(InvalidInput, match="max_bytes"):
                memory.register("b", keys[1], 0, 129)
            memory.register("b", keys[1], 0, 128)
            with pytest.raises(InvalidInput, match="max_regions"):
                memory.register("c", keys[2], 0, 8)
            with pytest.raises(InvalidInput, match="do not fit"):
                memory.read(Ref("a", 100, 64), "INPUT0")
            memory.unregister("a")
            memory.unregister("never-registered")  # no error, as Triton's
            allowed[2].buf[64:128] = bytes(range(64))  # a region at an offset in its key
            memory.register("o", keys[2], 64, 64)
            assert bytes(memory.read(Ref("o", 8, 8), "INPUT0")) == bytes(range(8, 16))
        finally:
            memory.unregister()
            for each in allowed:
                each.close()
                each.unlink()
        link = Path("/dev/shm") / f"allowed_link_{uuid.uuid4().hex[:8]}"
        link.symlink_to(tmp_path / "secret")
        (tmp_path / "secret").write_bytes(b"s" * 128)
        try:
            with pytest.raises(InvalidInput, match="Unable to open"):
                memory.register("l", "/" + link.name, 0, 64)  # no link is followed
        finally:
            link.unlink()
    finally:
        for region in regions:
            region.close()


def test_only_a_client_on_this_machine_or_with_the_admin_token_names_a_region() -> None:
    memory = SharedMemory(SharedMemorySettings())
    region = Region(64)
    try:
        memory.register("r", region.key, 0, 64)
        credentials = Credentials("admin", None)
        ref = Ref("r", 0, 64)
        ClientRegions(memory, credentials, None, "ipv4:127.0.0.1:4000").read(ref, "INPUT0")
        ClientRegions(memory, credentials, None, "127.0.0.1").read(ref, "INPUT0")
        with pytest.raises(Unauthenticated):
            ClientRegions(memory, credentials, None, "ipv4:10.1.2.3:4000").read(ref, "INPUT0")
        remote_admin = ClientRegions(memory, credentials, "Bearer admin", "ipv4:10.1.2.3:4000")
        remote_admin.write(ref, "OUTPUT0", memoryview(b"\1" * 64))
        assert bytes(region.shm.buf[:64]) == b"\1" * 64
    finally:
        memory.unregister()
        region.close()
