"""IPC framing: typed messages and raw tensors only; anything else is refused."""

from __future__ import annotations

import socket
import struct

import msgpack
import numpy as np
import pytest

from edgeplex.agent.runners import framing, ipc


def test_infer_round_trip_over_a_socket():
    a, b = socket.socketpair()
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "m": np.array([True, False])}
    descs, buffers = framing.pack_tensors(arrays)
    framing.send_frame(a, ipc.Infer(7, "model", ["y"], descs), buffers)
    message, payload = framing.recv_frame(b)
    assert isinstance(message, ipc.Infer) and message.req_id == 7 and message.outputs == ["y"]
    decoded = framing.unpack_tensors(message.tensors, payload)
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)


def test_unknown_message_types_are_refused():
    a, b = socket.socketpair()
    header = msgpack.packb({"t": "exec", "code": "import os"})
    a.sendall(struct.pack("<II", len(header), 0) + header)
    with pytest.raises(ipc.ProtocolError):
        framing.recv_frame(b)


def test_object_dtypes_cannot_cross():
    """Only text crosses as objects (BYTES, length-prefixed): no other Python object."""
    with pytest.raises(ipc.ProtocolError):
        framing.pack_tensors({"x": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ipc.ProtocolError):
        framing.pack_tensors({"x": np.array([3], dtype=object)})
    with pytest.raises(ipc.ProtocolError):
        framing.unpack_tensors([["x", "|O", [1], 8]], memoryview(b"\0" * 8))
    descs, _ = framing.pack_tensors({"x": np.array(["a", b"b"], dtype=object)})
    assert descs == [["x", "BYTES", [2], 10]]


def test_descriptor_sizes_are_checked():
    with pytest.raises(ipc.ProtocolError):
        framing.unpack_tensors([["x", "<f4", [4], 16]], memoryview(b"\0" * 8))


def test_oversized_frames_are_refused():
    a, b = socket.socketpair()
    a.sendall(struct.pack("<II", ipc.MAX_HEADER_BYTES + 1, 0))
    with pytest.raises(ipc.ProtocolError):
        framing.recv_frame(b)
