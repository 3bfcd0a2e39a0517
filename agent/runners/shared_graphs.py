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
from edgeplex.agent.runners.sessions import STAGED_MODEL, dims, providers
from edgeplex.agent.runners.staged_weights import StagedWeights, mappable

KEEP_IDLE = 16  # sessions kept for graphs no loaded model uses now

Key = tuple[Any, ...]
Interface = tuple[list[list[Any]], list[list[Any]]]  # inputs, outputs: [name, type, dims]


class SharedGraphs:
    def __init__(self, keep_idle: int = KEEP_IDLE) -> None:
        self._live: weakref.WeakValueDictionary[Key, ort.InferenceSession] = (
            weakref.WeakValueDictionary()
        )
        self._recent: OrderedDict[Key, ort.InferenceSession] = OrderedDict()
        self._keep_idle = keep_idle
        self._interfaces: weakref.WeakKeyDictionary[ort.InferenceSession, Interface] = (
            weakref.WeakKeyDictionary()
        )
        self.created = 0  # sessions created, for tests and logs

    def find(self, weights: StagedWeights, request: ipc.LoadModel) -> ort.InferenceSession | None:
        """The session this load would run on, if its graph has one: a load that then
        creates nothing."""
        if not shareable(request):
            return None
        key = _key(weights, request)
        session = self._live.get(key)
        if session is not None:
            self._use(key, session)
        return session

    def interface(self, session: ort.InferenceSession, weights: dict[str, Any]) -> Interface:
        """A session's inputs less `weights` (every model of a graph has the same
        weight names) and its outputs, as a load reports them: [name, type, dims]
        each, read once per session."""
        known = self._interfaces.get(session)
        if known is None:
            known = self._interfaces[session] = interface(session, weights)
        return known

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
        self._use(key, session)
        return session

    def _use(self, key: Key, session: ort.InferenceSession) -> None:
        """The most recently used sessions are kept when idle, up to the bound."""
        self._recent[key] = session
        self._recent.move_to_end(key)
        while len(self._recent) > self._keep_idle:
            self._recent.popitem(last=False)  # still alive while a model uses it


def interface(session: ort.InferenceSession, weights: dict[str, Any]) -> Interface:
    """A session's inputs less the weights fed with each run, and its outputs."""
    inputs = session.get_inputs()
    inputs = [[i.name, i.type, dims(i.shape)] for i in inputs if i.name not in weights]
    return inputs, [[o.name, o.type, dims(o.shape)] for o in session.get_outputs()]


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
    own = tuple(sorted(request.ort_session.items())) + tuple(sorted(request.cuda_options.items()))
    return (weights.weightless_digest, request.provider, *threads, own)


class WithWeights:
    """A shared session as one model sees it: each run is fed that model's weights
    (after the request's inputs, so a request cannot replace a weight)."""

    __slots__ = ("session", "weights")

    def __init__(self, session: ort.InferenceSession, weights: dict[str, np.ndarray]) -> None:
        self.session = session
        self.weights = weights

    def run(self, names: list[str] | None, feeds: dict[str, Any]) -> list[Any]:
        return self.session.run(names, {**feeds, **self.weights})
