"""A response written as buffers (the native door) carries exactly the bytes of
the one-body response (aiohttp's door), for every datatype and memory layout."""

from __future__ import annotations

import numpy as np
import pytest

from edgeplex.agent.frontdoor.oip_body import HEADER_LENGTH, InferBody
from edgeplex.agent.frontdoor.oip_response import TensorResponse, encode_infer_response

rng = np.random.default_rng(0)
OUTPUTS = {
    "f32": rng.standard_normal((3, 4)).astype(np.float32),
    "f16_big_endian": rng.standard_normal((2, 5)).astype(">f2"),
    "i64_transposed": np.arange(12, dtype=np.int64).reshape(3, 4).T,
    "u8_strided": np.arange(40, dtype=np.uint8)[::3],
    "bool": np.array([True, False, True]),
    "bytes": np.array([b"edge", "pl\u00e9x".encode(), b""], dtype=object),
    "empty": np.zeros((0, 4), dtype=np.float32),
}


def body(binary: dict[str, bool]) -> InferBody:
    return InferBody(inputs=[], binary_outputs=binary, binary_default=False, request_id="r1")


@pytest.mark.parametrize("binary_names", [list(OUTPUTS), ["f32", "bytes"], []])
def test_buffers_carry_the_bytes_of_the_single_body(binary_names):
    request = body({name: True for name in binary_names})
    whole = encode_infer_response(request, "m", "1", OUTPUTS)
    parts = encode_infer_response(request, "m", "1", OUTPUTS, buffers=True)
    if not binary_names:
        assert not isinstance(parts, TensorResponse)
        assert parts.body == whole.body
        return
    assert isinstance(parts, TensorResponse)
    joined = b"".join(bytes(p) for p in parts.parts)
    assert joined == whole.body
    assert parts.body_bytes == len(joined)
    assert parts.headers[HEADER_LENGTH] == whole.headers[HEADER_LENGTH]
    assert parts.content_type == whole.content_type == "application/octet-stream"


def test_a_contiguous_little_endian_output_is_not_copied():
    array = np.arange(1000, dtype=np.float32)
    response = encode_infer_response(body({"y": True}), "m", "1", {"y": array}, buffers=True)
    assert isinstance(response, TensorResponse)
    view = response.parts[1]
    assert isinstance(view, memoryview) and np.shares_memory(np.asarray(view), array)
