"""Which layer of the runner sandbox keeps CUDA from a runner, on a GPU machine.

    python bench/cuda_sandbox_probe.py [--json out.json] [--audit]

As the zygote does: onnxruntime imported, nothing CUDA started; then, per probe, a
child cloned into new namespaces applies a subset of the layers (sandbox.py) with
the view an agent with `execution_provider: cuda` gives its runners, and opens a
CUDA session on a small model and runs it. Probes: no layer, each layer added in
order, and every layer but one. `--audit` adds a child with every layer and a
seccomp filter that logs instead of denying, then prints what the kernel logged
(where the kernel has an audit log). `--agent` then starts an agent on the same
model and prints its status and sandbox report. `--views` instead applies the
namespaces and the mount view only, the view widened one way at a time (the whole
/dev, /run, /etc, /var, every other top-level folder, all of them), and has each
child call cuInit and say what it saw: which view CUDA needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgeplex.agent.catalog import demo
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.runners import ipc, sandbox, seccomp, sessions
from edgeplex.agent.runners.view import runner_view

TIMEOUT_S = 15  # per child: a CUDA session here takes a few seconds
UID, GID = os.geteuid(), os.getegid()  # read here: a cloned child sees itself unmapped


class Partial(sandbox.Sandbox):
    """The sandbox with only the named layers applied; the others report 'skipped'."""

    def __init__(self, request: ipc.SpawnRunner, enabled: set[str], program: bytes | None):
        super().__init__(request, UID, GID, program)
        self.enabled = enabled

    def _layer(self, name, step):  # type: ignore[no-untyped-def]
        if name in self.enabled:
            super()._layer(name, step)
        else:
            self.layers[name] = "skipped"


def run_cuda(model: str) -> dict[str, object]:
    sessions._preload_cuda()  # as the runner does, before its first CUDA session
    started = time.perf_counter()
    session = ort.InferenceSession(
        model, providers=[("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
    )
    name = session.get_inputs()[0].name
    width = session.get_inputs()[0].shape[1]
    session.run(None, {name: np.ones((1, width), np.float32)})
    return {"provider": session.get_providers()[0], "session_s": time.perf_counter() - started}


def cuinit_seen() -> dict[str, object]:
    """cuInit's result in this child, and what the child sees of the driver."""
    seen: dict[str, object] = {"cuinit": sandbox.cuda_init()}
    seen["provider"] = "CUDAExecutionProvider" if seen["cuinit"] == "0" else ""
    looks = {  # what the child may see (landlock may refuse a listing)
        "libcuda": lambda: sorted({line.split()[-1] for line in
                                   Path("/proc/self/maps").read_text().splitlines()
                                   if "libcuda" in line}),
        "dev": lambda: sorted(os.listdir("/dev")),
        "proc_driver": lambda: os.path.exists("/proc/driver/nvidia/params"),
        "top": lambda: sorted(os.listdir("/")),
    }  # fmt: skip
    for name, look in looks.items():
        try:
            seen[name] = look()
        except OSError as exc:
            seen[name] = f"{type(exc).__name__}: {exc.strerror}"
    return seen


WIDER = {  # view name: (extra read-only paths, extra device paths)
    "as is": ([], []),
    "+ /dev": ([], ["/dev"]),
    "+ /run": (["/run"], []),
    "+ /etc": (["/etc"], []),
    "+ /var": (["/var"], []),
    "+ the rest": (["/opt", "/home", "/root", "/srv", "/mnt", "/media", "/boot"], []),
    "+ all": (["/run", "/etc", "/var", "/opt", "/home", "/root", "/srv", "/mnt"], ["/dev"]),
}


def probe_views(
    request: ipc.SpawnRunner, model: str, only: str | None = None
) -> list[dict[str, object]]:
    rows = []
    for label, (read_only, devices) in WIDER.items():
        if only and label != only:
            continue
        wider = dataclasses.replace(
            request, read_only=[*request.read_only, *read_only],
            devices=[*request.devices, *devices],
        )  # fmt: skip
        result = probe(wider, {"namespaces", "mount_view"}, model, None, cuinit_seen)
        rows.append({"probe": "view " + label, **result})
        print(f"view {label:<12} cuInit={result.get('cuinit')} {result.get('error', '')}")
        print(f"   libcuda={result.get('libcuda')} proc_driver={result.get('proc_driver')}")
        print(f"   dev={result.get('dev')}", flush=True)
    return rows


def probe(
    request: ipc.SpawnRunner,
    enabled: set[str],
    model: str,
    program: bytes | None,
    check: Callable[[], dict[str, object]] | None = None,
) -> dict:
    read, write = os.pipe()
    pid, no_namespaces = sandbox.clone_or_fork()
    if pid == 0:  # the child: layers, then CUDA; one JSON line back
        os.close(read)
        result: dict[str, object] = {}
        try:
            result["layers"] = Partial(request, enabled, program).apply(no_namespaces)
            result.update(check() if check else run_cuda(model))
        except BaseException as exc:
            result["error"] = f"{type(exc).__name__}: {exc}"
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + TIMEOUT_S
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        status = None
    with os.fdopen(read, "rb") as pipe:
        report = pipe.read()
    try:
        result = json.loads(report)
    except ValueError:
        code = "timed out" if status is None else os.waitstatus_to_exitcode(status)
        result = {"error": f"the child died before reporting (exit {code})"}
    ok = result.get("provider") == "CUDAExecutionProvider"
    result["cuda"] = ok
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--audit", action="store_true")
    parser.add_argument("--agent", action="store_true", help="and ask an agent")
    parser.add_argument("--views", action="store_true", help="vary the mount view instead")
    parser.add_argument("--only", help="with --views: this view alone (a name in WIDER)")
    parser.add_argument("--cuinit", action="store_true", help="each child calls cuInit only")
    parser.add_argument("--rows", help="only the probes named, comma-separated ('up to seccomp')")
    args = parser.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="edgeplex-cuda-probe-"))
    demo.make_mlp(repo / "mlp", width=256, layers=2, in_width=64, config="")
    model = str(repo / "mlp" / "1" / "model.onnx")
    staging = repo / ".staged"
    staging.mkdir()
    settings = AgentSettings(model_repo=repo, runner={"execution_provider": "cuda"})
    view = runner_view(settings, staging)
    request = ipc.SpawnRunner(
        "probe", "", "INFO", 0, sandbox="best_effort", read_only=view.read_only,
        writable=view.writable, devices=view.devices, hidden=view.hidden,
        max_open_files=settings.runner.max_open_files,
    )  # fmt: skip
    print("devices:", view.devices, "seccomp:", seccomp.available() or "available", flush=True)
    program = seccomp.compile_filter() if not seccomp.available() else None
    if args.views:
        rows = probe_views(request, model, args.only)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    layers = list(sandbox.LAYERS)
    probes = [("none", set())]
    probes += [("up to " + name, set(layers[: i + 1])) for i, name in enumerate(layers)]
    probes += [("all but " + name, set(layers) - {name}) for name in layers]
    if args.rows:
        probes = [(label, enabled) for label, enabled in probes if label in args.rows.split(",")]
    rows = []
    for label, enabled in probes:
        result = probe(request, enabled, model, program, cuinit_seen if args.cuinit else None)
        rows.append({"probe": label, **result})
        print(f"{label:<22} cuda={result['cuda']!s:<5} {result.get('error', '')}", flush=True)
    if args.audit and program is not None:
        logged = probe(
            request, set(layers), model, seccomp.compile_filter(log_only=True),
            cuinit_seen if args.cuinit else None,
        )  # fmt: skip
        rows.append({"probe": "all, seccomp logging", **logged})
        print("all, seccomp logging: cuda =", logged["cuda"], logged.get("error", ""))
        dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
        calls = sorted({line.split("syscall=")[1].split()[0] for line in dmesg.splitlines()
                        if "syscall=" in line})  # fmt: skip
        print("kernel log, calls the filter would deny:", calls or "none logged")
        rows.append({"probe": "denied calls (audit)", "calls": calls})
    if args.agent:  # what an agent says of the same model, sandbox as configured
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import Agent

        agent = Agent(repo, runner__execution_provider="cuda", load_models_at_start="true")
        try:
            model_status = agent.status()["mlp"]
            memory = json.loads(agent.get("/edgeplex/v1/memory")[1])
        finally:
            agent.stop()
        rows.append({"probe": "agent", "status": model_status, "memory": memory})
        print("agent:", json.dumps(model_status)[:1500])
        print("agent sandbox:", json.dumps(memory.get("sandbox", memory))[:1500])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    sys.exit(0 if all(r.get("cuda") for r in rows if "cuda" in r) else 1)


if __name__ == "__main__":
    main()
