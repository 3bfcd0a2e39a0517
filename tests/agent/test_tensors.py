from __future__ import annotations

import numpy as np
import pytest

from edgeplex.agent.errors import InvalidInput
from edgeplex.agent.tensors import (
    OIP_TO_NUMPY,
    TensorSpec,
    check_against_spec,
    from_list,
    from_raw,
    to_raw,
)


@pytest.mark.parametrize("datatype", list(OIP_TO_NUMPY))
def test_raw_round_trip(datatype):
    dtype = OIP_TO_NUMPY[datatype]
    array = np.arange(6).astype(dtype).reshape(2, 3)
    np.testing.assert_array_equal(from_raw("x", datatype, [2, 3], to_raw(array)), array)


def test_raw_length_mismatch_names_the_input():
    with pytest.raises(InvalidInput, match=r"input 'x'.*24 bytes, got 20"):
        from_raw("x", "FP32", [2, 3], b"\0" * 20)


def test_list_decoding_checks_count_and_values():
    np.testing.assert_array_equal(
        from_list("x", "INT32", [2, 2], [[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]], np.int32)
    )
    with pytest.raises(InvalidInput, match="needs 4 elements, got 3"):
        from_list("x", "INT32", [2, 2], [1, 2, 3])
    with pytest.raises(InvalidInput, match="not valid FP32"):
        from_list("x", "FP32", [1], ["a"])


def test_unknown_datatype_and_negative_shapes_are_rejected():
    with pytest.raises(InvalidInput, match="not supported"):
        from_raw("x", "FP8", [1], b"\0")
    with pytest.raises(InvalidInput, match="negative"):
        from_raw("x", "FP32", [-1], b"")


def test_spec_check():
    spec = TensorSpec("x", "FP32", (-1, 4))
    check_against_spec(spec, "FP32", [7, 4])
    for datatype, shape in (("FP16", [1, 4]), ("FP32", [1, 5]), ("FP32", [4])):
        with pytest.raises(InvalidInput, match="input 'x'"):
            check_against_spec(spec, datatype, shape)
