"""A loaded model rebuilt with prepacked weights, in the runner's background.

A model promoted on demand serves from a session over its mapped staged
weights, which costs almost nothing to create but computes batched GEMMs
slower; once it has stayed loaded a while the agent asks for this rebuild
(runner_settings.prepack_after_s), or at once for a hot model
(residency/hot_set.py). Workers pick the new session up at their next batch;
the old one goes with its last run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort

from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.crew import Model
from edgeplex.agent.runners.sessions import (
    STAGED_MODEL,
    device_bytes,
    ms_since,
    providers,
    scrub,
    session_options,
    trim_heap,
    warm_up,
)


def prepack(request: ipc.Prepack, current: Callable[[str], Model | None]) -> ipc.Message:
    """Rebuild the model `current` finds under the request's name, and swap the new
    session in if it is still that model once the rebuild is done."""
    model = current(request.model)
    if model is None:
        return ipc.Failure(request.req_id, "not_loaded", f"{request.model} is not loaded")
    load = model.request
    upgraded = dataclasses.replace(load, prepack_weights=True)
    cuda = load.provider == "cuda"
    started = time.perf_counter()
    before = device_bytes() if cuda else 0
    try:
        session = ort.InferenceSession(
            str(Path(load.staged_dir) / STAGED_MODEL),
            sess_options=session_options(upgraded),
            providers=providers(upgraded),
        )
        warm_up(session)
    except Exception as exc:
        return ipc.Failure(request.req_id, "internal", scrub(str(exc), load.path, load.staged_dir))
    if current(request.model) is not model:
        return ipc.Failure(request.req_id, "not_loaded", f"{request.model} was replaced")
    model.session = session
    model.request = upgraded
    del session
    trim_heap()
    # What the model holds changes by: on CUDA, what the device grew by; on the CPU,
    # nothing. A prepacked CPU session holds about its weights, as the session it
    # replaces did (its own copy, or the staged copy's pages it kept in use, which now
    # count with the staged copy alone). The process's growth would not tell: the
    # reader thread serves and promotes meanwhile, and the staged copy stays mapped.
    grown = device_bytes() - before if cuda else 0
    return ipc.Prepacked(request.req_id, grown, ms_since(started))
