from __future__ import annotations

import numpy as np
import pytest

from edgeplex.agent.oip.errors import InvalidInput
from edgeplex.agent.oip.tensors import (
    OIP_TO_NUMPY,
    TensorSpec,
    check_against_spec,
    from_list,
    from_raw,
    to_raw,
)

CAP = 1 << 20


@pytest.mark.parametrize("datatype", list(OIP_TO_NUMPY))
def test_raw_round_trip(datatype):
    dtype = OIP_TO_NUMPY[datatype]
    array = np.arange(6).astype(dtype).reshape(2, 3)
    np.testing.assert_array_equal(from_raw("x", datatype, [2, 3], to_raw(array), CAP), array)


def test_raw_length_mismatch_names_the_input():
    with pytest.raises(InvalidInput, match=r"input 'x'.*24 bytes, got 20"):
        from_raw("x", "FP32", [2, 3], b"\0" * 20, CAP)


def test_list_decoding_checks_count_and_values():
    np.testing.assert_array_equal(
        from_list("x", "INT32", [2, 2], [[1, 2], [3, 4]], CAP), np.array([[1, 2], [3, 4]], np.int32)
    )
    with pytest.raises(InvalidInput, match="needs 4 elements, got 3"):
        from_list("x", "INT32", [2, 2], [1, 2, 3], CAP)
    with pytest.raises(InvalidInput, match="not valid FP32"):
        from_list("x", "FP32", [1], ["a"], CAP)


def test_unknown_datatype_and_negative_shapes_are_rejected():
    with pytest.raises(InvalidInput, match="not supported"):
        from_raw("x", "FP8", [1], b"\0", CAP)
    with pytest.raises(InvalidInput, match="negative"):
        from_raw("x", "FP32", [-1], b"", CAP)


def test_spec_check():
    spec = TensorSpec("x", "FP32", (-1, 4))
    check_against_spec(spec, "FP32", [7, 4])
    for datatype, shape in (("FP16", [1, 4]), ("FP32", [1, 5]), ("FP32", [4])):
        with pytest.raises(InvalidInput, match="input 'x'"):
            check_against_spec(spec, datatype, shape)


@pytest.mark.parametrize(
    ("shape", "fault"),
    [
        ([0, 10**30], "larger than"),
        ([1 << 20, 1 << 20], "larger than"),
        ([True, 2], "integers"),
        ([1] * 40, "rank 40"),
    ],
)
def test_shapes_are_checked_before_anything_is_allocated(shape, fault):
    with pytest.raises(InvalidInput, match=fault):
        from_raw("x", "FP32", shape, b"", CAP)
    with pytest.raises(InvalidInput, match=fault):
        from_list("x", "FP32", shape, [], CAP)


def test_list_data_must_be_a_list():
    for data in ({"a": 1}, "1", None):
        with pytest.raises(InvalidInput, match="must be a list"):
            from_list("x", "FP32", [1], data, CAP)
