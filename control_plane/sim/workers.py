"""The study's runs side by side: each in a forked worker process, its result handed
back through a private folder as JSON and NumPy arrays (no pickle crosses a process).

A run is a function of the study, which the worker has from the fork; what comes
back is a dict of parts, each an `Outcome`, a `FleetSpec` or plain JSON. With one
worker the runs go one after another in this process, and the results are the same:
every run is a pure function of the study, so neither the order nor the process
changes a figure.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import tempfile
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import numpy as np

from edgeplex.control_plane.sim.engine import Outcome, Timeline
from edgeplex.control_plane.sim.report import as_json
from edgeplex.control_plane.sim.spec import FleetSpec

Parts = dict[str, object]
Run = Callable[[], Parts]
# What to run once a run has finished: its name and parts in, more runs out.
Then = Callable[[str, Parts], dict[str, Run]]


def run_side_by_side(
    runs: dict[str, Run], workers: int, then: Then | None = None
) -> dict[str, Parts]:
    """Every run's parts by name, `workers` of them at a time (in the order given,
    so put the longest first)."""
    queue = list(runs.items())
    done: dict[str, Parts] = {}
    if workers <= 1:
        while queue:
            name, run = queue.pop(0)
            done[name] = run()
            queue += (then(name, done[name]) if then else {}).items()
        return done
    fork = multiprocessing.get_context("fork")  # the study is inherited, never sent
    running: dict[int, tuple[str, multiprocessing.process.BaseProcess, Path]] = {}
    with tempfile.TemporaryDirectory(prefix="edgeplex-study-") as scratch:
        try:
            while queue or running:
                while queue and len(running) < workers:
                    name, run = queue.pop(0)
                    folder = Path(scratch) / name
                    folder.mkdir()
                    worker: multiprocessing.process.BaseProcess = fork.Process(
                        target=_run_into, args=(run, folder), name=f"study-{name}", daemon=True
                    )
                    worker.start()
                    running[worker.sentinel] = (name, worker, folder)
                finished = set(multiprocessing.connection.wait(list(running)))
                for sentinel in [key for key in running if key in finished]:
                    name, worker, folder = running.pop(sentinel)
                    worker.join()
                    if worker.exitcode != 0:
                        raise RuntimeError(
                            f"the study's run {name!r} failed (exit code {worker.exitcode}); "
                            "its error is printed above"
                        )
                    done[name] = load(folder)
                    queue += (then(name, done[name]) if then else {}).items()
        finally:
            for _, left, _ in running.values():
                left.terminate()
                left.join()
    return done


def _run_into(run: Run, folder: Path) -> None:
    save(run(), folder)


def save(parts: Parts, folder: Path) -> None:
    """`parts` written into `folder`: an Outcome as JSON and an .npz of its timeline,
    a FleetSpec as its JSON, anything else as JSON."""
    plain: dict[str, object] = {}
    for name, value in parts.items():
        if isinstance(value, Outcome):
            scalars = {f.name: getattr(value, f.name) for f in fields(value)}
            del scalars["timeline"]
            (folder / f"{name}.outcome.json").write_text(json.dumps(scalars, default=as_json))
            np.savez(folder / f"{name}.timeline.npz", **_arrays(value.timeline))  # type: ignore[arg-type]
        elif isinstance(value, FleetSpec):
            (folder / f"{name}.fleet.json").write_text(value.model_dump_json())
        else:
            plain[name] = value
    (folder / "parts.json").write_text(json.dumps(plain, default=as_json))


def load(folder: Path) -> Parts:
    """What `save` wrote into `folder`."""
    parts: Parts = json.loads((folder / "parts.json").read_text())
    for path in folder.glob("*.fleet.json"):
        parts[path.name.removesuffix(".fleet.json")] = FleetSpec.model_validate_json(
            path.read_text()
        )
    for path in folder.glob("*.outcome.json"):
        name = path.name.removesuffix(".outcome.json")
        with np.load(folder / f"{name}.timeline.npz", allow_pickle=False) as arrays:
            timeline = _timeline(arrays)
        parts[name] = Outcome(**json.loads(path.read_text()), timeline=timeline)
    return parts


def _arrays(timeline: Timeline) -> dict[str, np.ndarray]:
    """Each per-step list as one array (steps first); an empty list as no rows."""
    out = {"start_min": np.array(timeline.start_min)}
    for f in fields(timeline):
        rows = getattr(timeline, f.name)
        if isinstance(rows, list):
            out[f.name] = np.array(rows) if rows else np.empty((0,))
    return out


def _timeline(arrays: np.lib.npyio.NpzFile) -> Timeline:
    values: dict[str, object] = {"start_min": int(arrays["start_min"])}
    for f in fields(Timeline):
        if f.name != "start_min":
            array = arrays[f.name]
            values[f.name] = list(array) if array.ndim > 1 else array.tolist()
    return Timeline(**values)  # type: ignore[arg-type]
