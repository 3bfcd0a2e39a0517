"""One ONNX Runtime session for every model that has the same graph.

A catalog is often many models of one architecture: fine-tunes of one base,
one detector trained per site, one voice model per language. Their staged
graphs differ only in their weights. For such a model the runner takes the
weights out of the graph (graph.weights_as_inputs) and keeps one session of
what is left, the weightless graph, per distinct graph and session settings.
Every model of that graph runs on it, fed its own weights with each run from
the runner's kept mapping of its staged copy (staged_weights.py). A promotion
then creates no session at all once its graph has a session: it costs the
messages and the bookkeeping.

The session holds no weights, so what a model holds while loaded is what it
held before: the pages of its staged weights, which a loaded model keeps in
use. Sessions in use are found through the models that hold them; the most
recently used idle ones are kept, so that the next promotion of their graph
finds them. The runner calls it from whichever thread holds its load lock.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.sessions import STAGED_MODEL, providers
from edgeplex.agent.runners.staged_weights import StagedWeights, mappable

KEEP_IDLE = 16  # sessions kept for graphs no loaded model uses now

Key = tuple[Any, ...]


class SharedGraphs:
    def __init__(self, keep_idle: int = KEEP_IDLE) -> None:
        self._live: weakref.WeakValueDictionary[Key, ort.InferenceSession] = (
            weakref.WeakValueDictionary()
        )
        self._recent: OrderedDict[Key, ort.InferenceSession] = OrderedDict()
        self._keep_idle = keep_idle
        self.created = 0  # sessions created, for tests and logs

    def has(self, weights: StagedWeights, request: ipc.LoadModel) -> bool:
        """Whether this load would find its graph's session (and create nothing)."""
        return shareable(request) and _key(weights, request) in self._live

    def session(
        self,
        weights: StagedWeights,
        request: ipc.LoadModel,
        create: Callable[[bytes], ort.InferenceSession],
    ) -> ort.InferenceSession | None:
        """The session of this staged copy's weightless graph under the load's session
        settings, made by `create` from the graph's bytes when there is none; None
        when the graph cannot be shared."""
        if weights.weightless is None:
            return None
        key = _key(weights, request)
        session = self._live.get(key)
        if session is None:
            session = create(weights.weightless)
            self._live[key] = session
            self.created += 1
        self._recent[key] = session
        self._recent.move_to_end(key)
        while len(self._recent) > self._keep_idle:
            self._recent.popitem(last=False)  # still alive while a model uses it
        return session


def shareable(request: ipc.LoadModel) -> bool:
    """Loads that may run on a shared session: weights from the kept mapping."""
    return mappable(request) and request.share_graphs


def session_for(
    graphs: SharedGraphs,
    request: ipc.LoadModel,
    staged: Path,
    options: ort.SessionOptions,
    mapped: StagedWeights | None,
) -> tuple[ort.InferenceSession, dict[str, np.ndarray]]:
    """The session for a load, and the weights to feed it with each run: the shared
    session of its weightless graph where it has one, else its own session, over the
    kept mapping when there is one (ORT then takes the weights from it)."""

    def create(model: bytes | str) -> ort.InferenceSession:
        return ort.InferenceSession(model, sess_options=options, providers=providers(request))

    if mapped is not None and shareable(request):
        shared = graphs.session(mapped, request, create)
        if shared is not None:
            return shared, mapped.arrays
    if mapped is not None:
        mapped.hand_to(options)
    return create(str(staged / STAGED_MODEL)), {}


def _key(weights: StagedWeights, request: ipc.LoadModel) -> Key:
    """What makes two sessions of one graph differ."""
    threads = (request.intra_op_threads, request.inter_op_threads, request.allow_spinning)
    return (weights.weightless_digest, request.provider, *threads)


class WithWeights:
    """A shared session as one model sees it: each run is fed that model's weights
    (after the request's inputs, so a request cannot replace a weight)."""

    __slots__ = ("session", "weights")

    def __init__(self, session: ort.InferenceSession, weights: dict[str, np.ndarray]) -> None:
        self.session = session
        self.weights = weights

    def run(self, names: list[str] | None, feeds: dict[str, Any]) -> list[Any]:
        return self.session.run(names, {**feeds, **self.weights})
