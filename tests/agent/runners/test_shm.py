"""Tensors through shared memory: the rings' bookkeeping, both ends of a channel
over a real mapping, and an agent serving large tensors bit for bit while its
rings overflow and its runner is killed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading

import numpy as np
import pytest
import tritonclient.grpc as tg
from tritonclient.utils import InferenceServerException

from edgeplex.agent.catalog import demo
from edgeplex.agent.runners import framing, ipc, shm
from tests.conftest import start_agent
from tests.support.oip import inputs_for
from tests.support.waiting import wait_until

# --- the rings ------------------------------------------------------------------------------


def test_a_ring_frees_out_of_order_and_reuses_only_what_is_free():
    ring = shm.Ring(100)
    a, b, c = ring.reserve(40), ring.reserve(40), ring.reserve(20)
    assert (a, b, c) == (0, 40, 80)
    assert ring.reserve(1) is None  # full
    ring.free(b)  # not the oldest: nothing comes back yet
    assert ring.reserve(1) is None
    ring.free(a)  # now the first 80 bytes are free
    assert ring.tail == 80
    assert ring.reserve(30) == 100  # position 100 is offset 0 again
    assert ring.reserve(60) is None  # only 50 free before c's bytes
    ring.free(c)
    assert ring.reserve(60) == 130


def test_a_payload_never_wraps_past_the_rings_end():
    ring = shm.Ring(100)
    ring.free(ring.reserve(70))
    pos = ring.reserve(50)  # 30 bytes left at the end: skipped
    assert pos == 100 and pos % ring.capacity == 0
    assert ring.reserve(101) is None and ring.reserve(0) is None


def test_results_are_freed_in_order_by_what_the_agent_has_read():
    ring = shm.Ring(100)
    first, second = ring.reserve(60), ring.reserve(30)
    assert ring.reserve(20) is None
    ring.consumed(first + 60)
    assert ring.reserve(20) is not None
    with pytest.raises(ipc.ProtocolError):
        ring.consumed(second + 1000)  # past anything written


def channel_pair(tmp_path, size=1 << 16, threshold=1024):
    mapping, path = shm.Mapping.create(size, size)
    try:
        runner_side = shm.Mapping.attach(str(path), size, size)
    finally:
        path.unlink()
    return shm.AgentChannel(mapping, threshold), shm.RunnerChannel(runner_side, threshold)


def test_both_ends_of_a_channel_over_a_real_mapping(tmp_path):
    agent, runner = channel_pair(tmp_path)
    a, b = socket.socketpair()
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    descs, buffers = framing.pack_tensors({"x": x, "small": np.ones(3, np.float32)})
    message = ipc.Infer(1, "m", None, descs)
    shared = agent.send(message, buffers, sum(b.nbytes for b in buffers))
    framing.send_frame(a, message, None if shared else buffers)
    got, payload = framing.recv_frame(b)
    assert isinstance(got, ipc.Infer) and got.at >= 0 and payload.nbytes == 0  # the doorbell
    arrays = framing.unpack_tensors(got.tensors, runner.received(got, payload))
    np.testing.assert_array_equal(arrays["x"], x)

    y = x * 2
    descs, buffers = framing.pack_tensors({"y": y})
    result = ipc.InferResult(1, 0, descs)
    framing.send_frame(b, result, runner.send(result, buffers))
    back, payload = framing.recv_frame(a)
    assert isinstance(back, ipc.InferResult) and back.at >= 0
    out = framing.unpack_tensors(back.tensors, agent.received(back, payload))
    np.testing.assert_array_equal(out["y"], y)
    # A small payload stays inline.
    descs, buffers = framing.pack_tensors({"s": np.ones(4, np.float32)})
    small = ipc.Infer(2, "m", None, descs)
    assert not agent.send(small, buffers, 16) and small.at == -1
    assert small.consumed == back.at + back.size  # the runner learns what it may reuse


def test_bytes_outside_the_ring_are_refused(tmp_path):
    _agent, runner = channel_pair(tmp_path)
    bogus = ipc.Infer(1, "m", None, [["x", "<f4", [4], 16]], at=(1 << 16) - 8, size=16)
    with pytest.raises(ipc.ProtocolError):
        runner.received(bogus, memoryview(b""))
    both = ipc.Infer(1, "m", None, [["x", "<f4", [4], 16]], at=0, size=16)
    with pytest.raises(ipc.ProtocolError):
        runner.received(both, memoryview(b"\0" * 16))


# --- an agent ---------------------------------------------------------------------------------

WIDTH = 32 * 1024  # 128 KiB per input row


@pytest.fixture
def wide_agent(tmp_path):
    repo = tmp_path / "repo"
    demo.make_add_sub(repo / "wide", width=WIDTH, config="max_batch_size: 8\n")
    agent = start_agent(
        repo,
        tmp_path,
        # Rings of 1 MiB: a batch of up to 8 requests (2 MiB of inputs) does not
        # fit, so both paths serve under load.
        env={"EDGEPLEX_AGENT_RUNNER__SHARED_MEMORY_BYTES": "1MiB"},
    )
    yield agent
    assert agent.stop() == 0, agent.log()


@pytest.mark.slow
def test_large_tensors_bit_for_bit_through_full_rings_and_a_killed_runner(wide_agent):
    failures: list[str] = []
    served = [0]
    stop = threading.Event()

    def call(seed: int) -> None:
        client = tg.InferenceServerClient(wide_agent.grpc_url)
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            a = rng.standard_normal((1, WIDTH)).astype(np.float32)
            b = rng.standard_normal((1, WIDTH)).astype(np.float32)
            try:
                result = client.infer(
                    "wide", inputs_for({"INPUT0": a, "INPUT1": b}), client_timeout=30
                )
            except InferenceServerException as exc:
                failures.append(f"{exc.status()}: {exc.message()}")
                continue
            if not (
                np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                and np.array_equal(result.as_numpy("OUTPUT1"), a - b)
            ):
                failures.append("wrong result")
            served[0] += 1

    threads = [threading.Thread(target=call, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: served[0] >= 20, 30, what="calls served before the kill")
        _, body = wide_agent.http_get("/edgeplex/v1/status")
        pid = {m["name"]: m["runner_pid"] for m in json.loads(body)}["wide"]
        os.kill(pid, signal.SIGKILL)  # mid-batch: whatever it was writing is never read
        before = served[0]
        wait_until(lambda: served[0] >= before + 40, 60, what="calls served after the kill")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert failures == [] and served[0] > 50, (failures[:3], served[0])
    _, metrics = wide_agent.http_get("/metrics")
    sent = {
        (line.split('direction="')[1].split('"')[0], line.split('path="')[1].split('"')[0]): float(
            line.rsplit(" ", 1)[1]
        )
        for line in metrics.decode().splitlines()
        if line.startswith("edgeplex_runner_tensor_bytes_total{")
    }
    for direction in ("request", "result"):
        assert sent[direction, "shared"] > 0 and sent[direction, "socket"] > 0, sent


def test_a_full_shm_directory_fails_at_creation_not_mid_write(tmp_path, monkeypatch):
    """A container's /dev/shm is often 64 MiB: rings that do not fit are refused when
    the runner starts (its tensors then use the socket), never by a SIGBUS later."""
    small = tmp_path / "shm"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)])
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        monkeypatch.setattr(shm, "shm_dir", lambda: small)
        with pytest.raises(OSError):
            shm.Mapping.create(1 << 20, 1 << 20)
        assert list(small.iterdir()) == []  # nothing left behind
        mapping, path = shm.Mapping.create(256 << 10, 256 << 10)
        path.unlink()
        mapping.close()
    finally:
        subprocess.run(["umount", str(small)], check=True)
