"""Errors that reach clients, each with its gRPC status and HTTP code.

Raise these anywhere in the agent; the front doors (frontdoor/grpc.py, frontdoor/http.py)
turn them into the right status. Messages name the model or input at fault and
never a filesystem path.
"""

from __future__ import annotations

import grpc


class ServeError(Exception):
    """Base of every client-visible error."""

    grpc_code = grpc.StatusCode.INTERNAL
    http_status = 500
    retry_after_s: float | None = None
    not_here = False  # NotHere: marked on the wire for the forwarder
    sequence_not_here = False  # SequenceNotHere: likewise
    # The `reason` of Triton's nv_inference_request_failure: REJECTED (refused by
    # the queue or past its deadline), BACKEND (the model's execution failed),
    # CANCELED (the caller went away) or OTHER.
    failure_reason = "OTHER"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelNotFound(ServeError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404

    @classmethod
    def unknown(cls, name: str, version: str = "", detail: str = "") -> ModelNotFound:
        """Worded as Triton words it (clients and Triton's examples match the start),
        with what edgeplex knows more after it: "Request for unknown model: 'm'
        version 2 is not found (serving version 3)"."""
        shown = f" version {version}" if version else ""
        more = f" ({detail})" if detail else ""
        return cls(f"Request for unknown model: '{name}'{shown} is not found{more}")


class InvalidInput(ServeError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class QueueFull(ServeError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    retry_after_s = 1.0
    failure_reason = "REJECTED"


class RateLimited(ServeError):
    """A tenant's rate or concurrency limit is spent: refused before anything was
    decoded or queued; retry after `retry_after_s`."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    failure_reason = "REJECTED"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Overloaded(ServeError):
    """Refused before admission: more promotions wait for device memory than the
    agent will queue. Nothing was started for this request; retry shortly."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    retry_after_s = 1.0
    failure_reason = "REJECTED"


class NoRoom(ServeError):
    """A model cannot be loaded: not enough device memory even after eviction."""

    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 507
    failure_reason = "REJECTED"


class DeadlineExceeded(ServeError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504
    failure_reason = "REJECTED"


class Unavailable(ServeError):
    """The model or the agent cannot serve now; retrying later may succeed."""

    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    retry_after_s = 1.0


class NotHere(Unavailable):
    """A forwarded request for a model this site does not hold: the forwarder's
    routes are out of date. Marked on the wire (`edgeplex-not-here`), so the
    forwarder drops this site from the model's routes and routes the request again
    instead of failing it."""

    not_here = True


class ModelFailed(ServeError):
    """The model cannot be loaded (bad artifact); retrying will not help."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409

    @classmethod
    def load(cls, name: str, reason: str) -> ModelFailed:
        """Worded as Triton words a failed load: "failed to load 'm', <reason>"."""
        return cls(f"failed to load '{name}', {reason}")


class InferenceFailed(ServeError):
    """ONNX Runtime rejected or failed a batch; every member gets this."""

    grpc_code = grpc.StatusCode.INTERNAL
    http_status = 500
    failure_reason = "BACKEND"


class AlreadyExists(ServeError):
    """A name that is taken already (a shared-memory region)."""

    grpc_code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 400


class NotFound(ServeError):
    """A named thing other than a model that does not exist (a shared-memory region);
    Triton answers 400 for these."""

    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 400


class NotSupported(ServeError):
    """An extension this agent does not provide (CUDA shared memory on the CPU)."""

    grpc_code = grpc.StatusCode.UNIMPLEMENTED
    http_status = 400


class Unauthenticated(ServeError):
    """No credential, or one that is not valid."""

    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401


class PermissionDenied(ServeError):
    """A valid credential that does not grant this call."""

    grpc_code = grpc.StatusCode.PERMISSION_DENIED
    http_status = 403


class StaleRoute(Exception):
    """Every peer tried answered NotHere; the request is routed again (internal only)."""


class RunnerLost(Exception):
    """The runner holding a request died before it answered (internal only)."""
