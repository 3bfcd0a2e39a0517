"""Waiting for a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import redis


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (grpc.RpcError, OSError, redis.RedisError) as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what or predicate}: last {last!r}")
