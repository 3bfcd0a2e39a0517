"""Which door serves gRPC: the native one wherever it is built, plaintext or TLS,
grpcio when asked; and the wire format's small parts."""

from __future__ import annotations

import grpc
import pytest

from edgeplex.agent.frontdoor.grpc import native_door
from edgeplex.agent.frontdoor.grpc_wire import parse_timeout, status_trailers


def test_the_native_door_is_built_by_setup_and_chosen_by_default():
    assert native_door("auto")  # make setup builds it (scripts/build_native.py)
    assert native_door("native")
    assert not native_door("grpcio")


def test_grpc_timeouts_and_status_trailers_follow_the_wire_format():
    assert parse_timeout("250m") == pytest.approx(0.25)
    assert parse_timeout("3S") == 3.0 and parse_timeout("1H") == 3600.0
    assert parse_timeout("12x") is None and parse_timeout("") is None
    assert status_trailers(grpc.StatusCode.OK, "") == [(b"grpc-status", b"0")]
    trailers = dict(status_trailers(grpc.StatusCode.INVALID_ARGUMENT, "bad 100% ünïcode\n"))
    assert trailers[b"grpc-status"] == b"3"
    assert trailers[b"grpc-message"] == b"bad 100%25 %C3%BCn%C3%AFcode%0A"
