"""The runner process: ONNX Runtime sessions behind a Unix socket.

A runner is forked by the zygote (zygote.py) and never imports gRPC or
asyncio. It connects to the agent, says Hello, then serves frames until the
socket closes, when it exits. Threads:

- the main thread reads frames and routes them;
- one loader thread creates sessions for promotions, one at a time, so the
  memory growth it measures around each creation belongs to that model; it
  keeps the staged weights it has mapped (staged_weights.py); a load that creates
  nothing (shared_graphs.py) is done on the main thread, under the same lock;
- one stager thread does background work that must never delay a promotion:
  cached -> staged (StageModel) and prepacked rebuilds (Prepack); memory it
  measures may overlap a concurrent load, so its readings are approximate;
- each model has `instances` worker threads that run its batches (ORT
  releases the GIL in `run`, so models execute in parallel); a worker whose
  model leaves is parked and serves the next model loaded, so a promotion
  starts no thread;
- replies from any thread go through `_send`, serialised by one lock.

While the runner has nothing to do, its main thread may poll the socket for
the next frame for a short while before it blocks (idle_spin.py).

A load never blocks inference of models already loaded: it runs on the loader
thread, and a model becomes visible to Infer only once its session exists.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgeplex import logs
from edgeplex.agent.runners import framing, ipc, sessions, shm
from edgeplex.agent.runners.crew import Crew, Model
from edgeplex.agent.runners.idle_spin import IdleSpin
from edgeplex.agent.runners.prepack import prepack
from edgeplex.agent.runners.sessions import (
    STAGED_MODEL,
    STAGED_WEIGHTS,
    as_text,
    device_bytes,
    directory_bytes,
    ms_since,
    no_cuda,
    providers,
    reshaped,
    resident_bytes,
    run_samples,
    scrub,
    served_by,
    session_options,
    stage,
    stage_model,
    trim_heap,
    warm_up,
)
from edgeplex.agent.runners.shared_graphs import (
    SharedGraphs,
    WithWeights,
    interface,
    session_for,
)
from edgeplex.agent.runners.staged_weights import StagedWeights, WeightMaps, mappable
from edgeplex.agent.runners.variant_builds import build_variants
from edgeplex.logs import LogFormat

log = logging.getLogger("edgeplex.runner")

WEIGHT_SWEEP_S = 1.0  # how often mappings of deleted staged copies are dropped


class Runner:
    def __init__(self, sock: socket.socket, idle_spin_us: int = 0) -> None:
        self._sock = sock
        self._idle_spin_us = idle_spin_us
        self._loading = False  # the loader thread is creating a session
        self._weight_maps = WeightMaps()  # staged weights kept mapped
        self._graphs = SharedGraphs()  # sessions of weightless graphs
        self._load_lock = threading.Lock()  # held by whichever thread loads (these two)
        self._send_lock = threading.Lock()
        self._models: dict[str, Model] = {}
        self._loads: queue.SimpleQueue = queue.SimpleQueue()
        self._stages: queue.SimpleQueue = queue.SimpleQueue()
        # Odd while the stager works, bumped at each start and end: a load whose
        # memory reading overlapped background work cannot tell its bytes apart.
        self._side_epoch = 0
        self._table_lock = threading.Lock()  # self._models changes from two threads
        self._crew = Crew(self._run)
        self._channel: shm.RunnerChannel | None = None  # shared tensor rings, if mapped

    def _send(self, message: ipc.Message, buffers: list[memoryview] | None = None) -> None:
        with self._send_lock:  # results enter the ring in the order their frames leave
            if buffers and self._channel is not None and isinstance(message, ipc.InferResult):
                buffers = self._channel.send(message, buffers)
            framing.send_frame(self._sock, message, buffers)

    def _attach(self, request: ipc.AttachShm) -> None:
        try:
            mapping = shm.Mapping.attach(request.path, request.request_bytes, request.result_bytes)
        except (OSError, ValueError, ipc.ProtocolError) as exc:
            self._send(ipc.Failure(request.req_id, "internal", f"shared memory: {exc}"))
            return
        self._channel = shm.RunnerChannel(mapping, request.threshold)
        self._send(ipc.ShmAttached(request.req_id))

    def serve(self) -> None:
        threading.Thread(target=self._loader, name="loader", daemon=True).start()
        threading.Thread(target=self._stager, name="stager", daemon=True).start()
        spin = IdleSpin(self._idle_spin_us, self._quiet) if self._idle_spin_us else None
        reader = framing.FrameReader(self._sock, spin=spin)
        while True:
            try:
                message, payload = reader.read()
            except (EOFError, ConnectionError):
                return
            if isinstance(message, ipc.Infer):
                if spin is not None:
                    spin.invited = message.lone
                model = self._models.get(message.model)
                try:
                    payload = self._tensor_bytes(message, payload)
                except ipc.ProtocolError as exc:
                    self._send(ipc.Failure(message.req_id, "internal", str(exc)))
                    continue
                if model is None:
                    self._send(
                        ipc.Failure(
                            message.req_id,
                            "not_loaded",
                            f"model '{message.model}' is not loaded here",
                        )
                    )
                elif model.admit() and not reader.pending:
                    model.execute(self._run, (message, payload))
                else:
                    model.work.put((message, payload))
            elif isinstance(message, ipc.LoadModel):
                if not self._load_at_once(message):
                    self._loads.put((message, payload))  # the payload: its warm-up samples
            elif isinstance(message, ipc.AttachShm):
                self._attach(message)
            elif isinstance(message, (ipc.StageModel, ipc.Prepack, ipc.BuildVariants)):
                self._stages.put(message)  # background work never delays a promotion
            elif isinstance(message, ipc.UnloadModel):
                self._unload(message)
            elif isinstance(message, ipc.SetInstances):
                self._set_instances(message)
            elif isinstance(message, ipc.SetLogLevel):
                logging.getLogger().setLevel(logs.level_of(message.level))
                self._send(ipc.LogLevelSet(message.req_id))
            else:
                raise ipc.ProtocolError(f"runner cannot handle {message.TAG}")

    def _quiet(self) -> bool:
        """Nothing but the next frame to wait for: no batch queued or running, no
        load, no background work (read without locks: a stale answer costs at most
        one poll's budget; the models are copied in one step, since the loader may
        change the table meanwhile)."""
        return (
            not self._loading
            and self._loads.empty()
            and not self._side_epoch % 2
            and self._stages.empty()
            and not any(model.queued for model in tuple(self._models.values()))
        )

    # --- loading --------------------------------------------------------------------------

    def _loader(self) -> None:
        swept = time.monotonic()
        while True:
            try:
                request, payload = self._loads.get(timeout=WEIGHT_SWEEP_S)
            except queue.Empty:
                request = None
            if time.monotonic() - swept >= WEIGHT_SWEEP_S:
                with self._load_lock:
                    self._weight_maps.sweep()  # the agent may have deleted staged copies
                swept = time.monotonic()
            if request is not None:
                with self._load_lock:
                    self._answer_load(request, partial(self._load, request, payload))

    def _load_at_once(self, request: ipc.LoadModel) -> bool:
        """Do here, on the reader thread, a load that creates nothing (its graph has a
        shared session, its weights are mapped: shared_graphs.py), cheaper than waking
        the loader. False, and nothing done, for any other load, one that warms up, or
        while the loader is busy."""
        if request.warm_up or not self._loads.empty() or not self._load_lock.acquire(False):
            return False  # (the lock is taken last: held only past this line)
        try:
            mapped = self._weight_maps.peek(request.staged_dir)
            session = None if mapped is None else self._graphs.find(mapped, request)
            if mapped is None or session is None:
                return False
            self._answer_load(request, partial(self._join, request, mapped, session))
            return True
        finally:
            self._load_lock.release()

    def _answer_load(self, request: ipc.LoadModel, load: Callable[[], ipc.Message]) -> None:
        self._loading = True
        try:
            reply: ipc.Message = load()
        except Exception as exc:
            message = scrub(str(exc), request.path, request.staged_dir)
            reply = ipc.Failure(request.req_id, "load", message)
        finally:
            self._loading = False
        self._send(reply)

    def _stager(self) -> None:
        while True:
            request = self._stages.get()
            self._side_epoch += 1
            try:
                self._side_work(request)
            finally:
                self._side_epoch += 1

    def _side_work(self, request: ipc.StageModel | ipc.Prepack | ipc.BuildVariants) -> None:
        if isinstance(request, ipc.BuildVariants):
            self._send(build_variants(request))
            return
        if isinstance(request, ipc.Prepack):
            try:
                self._send(prepack(request, self._models.get))
            except Exception as exc:  # the thread must outlive any request
                self._send(ipc.Failure(request.req_id, "internal", str(exc)[:500]))
            return
        self._send(stage(request))

    def _load(self, request: ipc.LoadModel, samples: memoryview) -> ipc.ModelLoaded | ipc.Failure:
        stages: dict[str, float] = {}
        staged = Path(request.staged_dir)
        source = "staged" if (staged / STAGED_MODEL).is_file() else "cached"
        if source == "cached":
            level = request.graph_level
            stage_model(Path(request.path), staged, stages, providers(request), level)
        options = session_options(request)
        measure = device_bytes if request.provider == "cuda" else resident_bytes
        epoch = self._side_epoch
        before = 0
        started = time.perf_counter()  # creation includes mapping the weights, when new
        mapped = None
        if mappable(request):
            mapped = self._weight_maps.get(staged, staged / STAGED_MODEL, staged / STAGED_WEIGHTS)
        if mapped is None:
            trim_heap()  # a heap walk (0.1-0.4 ms): only where the reading matters
            before = measure()
            started = time.perf_counter()
        session, feeds = session_for(self._graphs, request, staged, options, mapped)
        stages["create"] = ms_since(started)
        provider = served_by(session)
        if provider != request.provider and not request.cpu_fallback:
            return ipc.Failure(request.req_id, "load", no_cuda(request.model))
        if request.warm_up:
            started = time.perf_counter()
            if request.warmup:
                run_samples(session, feeds, request, samples)
            else:
                warm_up(session, feeds)
            stages["warmup"] = ms_since(started)
        # What the process grew by, but never less than the weights the session reads:
        # a session over the mapped staged copy may grow by nothing measurable when a
        # neighbour released its own memory meanwhile, or when the pages were already
        # resident, yet it holds those weights as long as it lives.
        weights = directory_bytes(staged)
        if mapped is not None:
            # Its weights are the mapping, already resident: nothing to measure.
            grown = weights
        else:
            trim_heap()  # as before `before`: count pages in use, not freed ones kept
            grown = max(measure() - before, weights)
        if request.provider != "cuda" and (epoch % 2 or self._side_epoch != epoch):
            # The stager built a session meanwhile, in this same process: the growth is
            # partly its. A CPU session holds about its weights; the next load of this
            # model measures again.
            grown = weights
        inputs, outputs = interface(session, feeds)
        runs = WithWeights(session, feeds) if feeds else session
        model = Model(request.model, runs, [o[0] for o in outputs], request, weights=mapped)
        if not self._install(model):
            return ipc.Failure(request.req_id, "not_loaded", f"{request.model} left")
        log.debug(
            "%s loaded from the %s tier on %s in %.1f ms (%s)",
            request.model,
            source,
            provider,
            sum(stages.values()),
            ", ".join(f"{stage} {ms:.1f} ms" for stage, ms in stages.items()),
        )
        return ipc.ModelLoaded(
            request.req_id,
            request.model,
            inputs,
            outputs,
            grown,
            sum(stages.values()),
            source,
            stages,
            weights,
            request.prepack_weights,
            provider,
            bool(feeds),
        )

    def _join(
        self, request: ipc.LoadModel, mapped: StagedWeights, session: ort.InferenceSession
    ) -> ipc.ModelLoaded | ipc.Failure:
        """A load onto its graph's shared session: no session, no file, no measuring
        (what it holds is its staged copy, counted when it was mapped)."""
        started = time.perf_counter()
        inputs, outputs = self._graphs.interface(session, mapped.arrays)
        runs = WithWeights(session, mapped.arrays)
        model = Model(request.model, runs, [o[0] for o in outputs], request, weights=mapped)
        if not self._install(model):
            return ipc.Failure(request.req_id, "not_loaded", f"{request.model} left")
        ms = ms_since(started)
        return ipc.ModelLoaded(
            req_id=request.req_id,
            model=request.model,
            inputs=inputs,
            outputs=outputs,
            bytes=mapped.staged_bytes,
            load_ms=ms,
            source="staged",
            stages={"create": ms},
            staged_bytes=mapped.staged_bytes,
            prepacked=False,
            provider="cpu",
            shared=True,
        )

    def _install(self, model: Model) -> bool:
        """Make `model` visible to Infer, in place of its previous session if any;
        False (nothing changed) for a swap whose model has left meanwhile."""
        with self._table_lock:  # an unload on the main thread must not slip in between
            old = self._models.pop(model.name, None)
            if old is None and model.request.swap:
                return False
            if old is not None:
                self._crew.release(old, old.workers)
            for _ in range(model.request.instances):
                self._crew.assign(model)
            self._models[model.name] = model
        return True

    def _set_instances(self, request: ipc.SetInstances) -> None:
        model = self._models.get(request.model)
        if model is not None:
            while model.workers < request.instances:
                self._crew.assign(model)
            self._crew.release(model, model.workers - request.instances)
        count = model.workers if model is not None else 0
        self._send(ipc.InstancesSet(request.req_id, count))

    def _unload(self, request: ipc.UnloadModel) -> None:
        with self._table_lock:
            model = self._models.pop(request.model, None)
        if model is not None:
            self._crew.release(model, model.workers)
        self._send(ipc.Unloaded(request.req_id))

    # --- inference ------------------------------------------------------------------------

    def _tensor_bytes(self, message: ipc.Infer, payload: memoryview) -> memoryview:
        if self._channel is not None:
            return self._channel.received(message, payload)
        if message.at >= 0:
            raise ipc.ProtocolError("tensors in shared memory that was never mapped")
        return payload

    def _run(self, model: Model, message: ipc.Infer, payload: memoryview) -> None:
        try:
            feeds = {
                n: as_text(a) for n, a in framing.unpack_tensors(message.tensors, payload).items()
            }
            shaped = model.request  # config.pbtxt's reshape, if any
            feeds = reshaped(feeds, shaped.reshape_inputs, shaped.batched)
            names = message.outputs or model.output_names
            started = time.perf_counter_ns()
            results = model.session.run(names, feeds)
            compute_ns = model.last_ns = time.perf_counter_ns() - started
            arrays = {n: np.asarray(r) for n, r in zip(names, results, strict=True)}
            arrays = reshaped(arrays, shaped.reshape_outputs, shaped.batched)
            descs, buffers = framing.pack_tensors(arrays)
        except Exception as exc:
            invalid = type(exc).__name__ in ("InvalidArgument", "ProtocolError")
            kind = "invalid" if invalid else "internal"
            self._send(ipc.Failure(message.req_id, kind, str(exc)))
            return
        self._send(ipc.InferResult(message.req_id, compute_ns, descs, model.request.form), buffers)


def main(
    runner_id: str,
    socket_path: str,
    log_level: str,
    log_format: LogFormat,
    idle_spin_us: int = 0,
    pid: int = 0,
    sandbox: dict[str, str] | None = None,
    sandbox_us: dict[str, int] | None = None,
) -> None:
    """Entry point in the forked child; returns when the agent disconnects. `pid` is
    this process as the agent sees it, `sandbox` the layers it runs under."""
    # In its own PID namespace a runner is PID 1, which the kernel spares every signal
    # it has no handler for: a stop must still stop it.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: os._exit(128 + signum))
    logs.configure(logs.level_of(log_level), log_format, runner=runner_id)
    sessions.HOST_PID = pid or os.getpid()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path)
    hello = ipc.Hello(runner_id, pid or os.getpid(), sandbox or {}, sandbox_us or {})
    framing.send_frame(sock, hello)
    Runner(sock, idle_spin_us).serve()
