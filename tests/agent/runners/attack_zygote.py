"""A zygote whose runners run an attack instead of serving (tests only).

Everything up to the runner's first line is the real zygote's: the clone into
namespaces, the sandbox, the memory group. Then, where a runner would start
serving, this one tries what a model that took over its runner would try and
reports each outcome as JSON over the runner socket (AF_UNIX, which it may use).

    python attack_zygote.py --fd N --sandbox required --secret PATH... --readonly PATH
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

from edgeplex.agent.runners import runner, zygote


def attempt(action: Callable[[], object]) -> str:
    try:
        outcome = action()
    except OSError as exc:
        return f"refused: {exc.strerror or exc}"
    return f"allowed: {outcome!r}"[:200]


def attack(secrets: list[str], readonly: str) -> dict[str, str]:
    def fork() -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        return pid

    def unshare() -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return 0

    def write_model() -> int:
        with open(os.path.join(readonly, "planted.onnx"), "w") as f:
            return f.write("x")

    outcomes = {
        "inet_socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
        "inet6_socket": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
        "netlink_socket": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)),
        "exec_shell": attempt(lambda: os.execv("/bin/sh", ["sh", "-c", "exit 0"])),
        "fork": attempt(fork),
        "unshare": attempt(unshare),
        "write_model": attempt(write_model),
        "pids_visible": attempt(lambda: sorted(p for p in os.listdir("/proc") if p.isdigit())),
    }
    for path in secrets:
        outcomes[f"read {path}"] = attempt(lambda p=path: len(Path(p).read_bytes()))  # type: ignore[misc]
        outcomes[f"list {os.path.dirname(path)}"] = attempt(
            lambda p=path: os.listdir(os.path.dirname(p))  # type: ignore[misc]
        )
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--sandbox", default="required")
    parser.add_argument("--secret", action="append", default=[])
    parser.add_argument("--readonly", required=True)
    args = parser.parse_args()

    def report(runner_id: str, socket_path: str, *_: object, **__: object) -> None:
        outcomes = attack(args.secret, args.readonly)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(socket_path)
            sock.sendall(json.dumps(outcomes).encode())

    runner.main = report  # type: ignore[assignment]
    zygote.die_with_parent()
    control = socket.socket(fileno=args.fd)
    process = zygote.Zygote(control, args.sandbox)
    process.report_sandbox(args.sandbox)
    process.serve()


if __name__ == "__main__":
    main()
