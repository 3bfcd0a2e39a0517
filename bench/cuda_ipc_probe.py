"""Whether CUDA IPC works between two processes on this machine, without the agent.

    python bench/cuda_ipc_probe.py [--torch]

This process allocates device memory, writes a pattern into it and takes its IPC
handle; a second process (a new interpreter) opens the handle and reads the
pattern back. Prints each step's outcome and what the kernel allows the processes
(capabilities, ptrace scope, seccomp mode): the driver may pass an IPC handle's
memory as a file descriptor taken from the other process, which containers with
a default seccomp profile or without ptrace rights refuse. `--torch` also shares a
CUDA tensor between two processes with torch.multiprocessing (CUDA IPC by a
known-good user of it), where torch is installed.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

from edgeplex.agent.frontdoor import cuda_ipc

CHILD = """
import base64, sys
from edgeplex.agent.frontdoor import cuda_ipc
driver = cuda_ipc.driver()
pointer = driver.open_handle(base64.b64decode(sys.argv[1]), 0)
print(bytes(driver.to_host(pointer, 16, 0)).hex())
driver.close_handle(pointer, 0)
"""


def kernel_facts() -> dict[str, str]:
    facts = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":")[0]
        if key in ("CapEff", "CapBnd", "Seccomp", "NoNewPrivs"):
            facts[key] = line.split(":", 1)[1].strip()
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    facts["ptrace_scope"] = scope.read_text().strip() if scope.exists() else "no yama"
    return facts


def torch_child(queue, answers) -> None:  # type: ignore[no-untyped-def]
    answers.put(float(queue.get().sum().item()))


def torch_ipc() -> str:
    """What a child read of a CUDA tensor shared by torch.multiprocessing."""
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        return "no torch"
    context = mp.get_context("spawn")
    queue, answers = context.Queue(), context.Queue()
    child = context.Process(target=torch_child, args=(queue, answers))
    child.start()
    tensor = torch.arange(16.0, device="cuda")
    queue.put(tensor)
    try:
        return f"sum {answers.get(timeout=60)} (want {float(tensor.sum().item())})"
    except Exception as exc:  # the child died: its traceback went to stderr
        return f"failed: {type(exc).__name__} {exc}"
    finally:
        child.join(10)


def main() -> None:
    report: dict[str, object] = {"kernel": kernel_facts()}
    if "--torch" in sys.argv:
        report["torch"] = torch_ipc()
    driver = cuda_ipc.driver()
    pointer = driver.allocate(1 << 20, 0)
    pattern = bytes(range(16))
    driver.to_device(pointer, pattern, 0)
    report["round_trip_here"] = bytes(driver.to_host(pointer, 16, 0)) == pattern
    handle = driver.ipc_handle(pointer, 0)
    report["handle"] = handle.hex()
    child = subprocess.run(
        [sys.executable, "-c", CHILD, base64.b64encode(handle).decode()],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    report["child_rc"] = child.returncode
    report["child_read"] = child.stdout.strip()
    report["child_error"] = child.stderr.strip()[-800:]
    report["works"] = child.stdout.strip() == pattern.hex()
    driver.free(pointer, 0)
    print(json.dumps(report, indent=2))
    sys.exit(0 if report["works"] else 1)


if __name__ == "__main__":
    main()
