"""Whether CUDA initialises in a child made the ways a runner could be made.

    python bench/cuda_clone_probe.py

Each child calls cuInit(0) from libcuda and prints its result (0 is success),
after being made by: os.fork(); a raw clone(2) with no namespace; a raw clone
into each namespace alone and all of them (as sandbox.clone does); and os.fork()
followed by unshare(2) of each namespace. No layer of the sandbox is applied, and
nothing but the standard library is needed (any Python on the GPU machine runs it).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

NS = {
    "user": 0x10000000,
    "mount": 0x00020000,
    "pid": 0x20000000,
    "net": 0x40000000,
    "ipc": 0x08000000,
}
ALL = sum(NS.values())
SIGCHLD = 17


def in_child() -> None:
    """cuInit, and the device nodes opened by hand; one line; exit."""
    opened = []
    for node in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"):
        try:
            os.close(os.open(node, os.O_RDWR))
            opened.append(f"{node}:ok")
        except OSError as exc:
            opened.append(f"{node}:{exc.strerror}")
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        result = cuda.cuInit(0)
    except OSError as exc:
        result = f"no libcuda: {exc}"
    print(f"    cuInit={result} pid={os.getpid()} {' '.join(opened)}", flush=True)
    os._exit(0)


def map_ids(uid: int, gid: int) -> None:
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


CHILD_SETTID = 0x01000000
TID_OFFSET = 0x2D0  # offsetof(struct pthread, tid), glibc on x86_64


def tid_slot() -> int:
    """Where glibc keeps this thread's tid (fork's CLONE_CHILD_SETTID target)."""
    libc = ctypes.CDLL(None, use_errno=True)
    base = ctypes.c_ulong()
    libc.syscall(158, 0x1003, ctypes.byref(base))  # arch_prctl(ARCH_GET_FS)
    return base.value + TID_OFFSET


def raw_clone(flags: int, settid: bool = False) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.syscall.argtypes = [ctypes.c_long] * 6
    ctid = tid_slot() if settid else 0
    pid = libc.syscall(56, flags | SIGCHLD | (CHILD_SETTID if settid else 0), 0, 0, ctid, 0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone")
    return int(pid)


def unshare(flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare")


def run(label: str, make) -> None:  # type: ignore[no-untyped-def]
    print(label, flush=True)
    uid, gid = os.geteuid(), os.getegid()
    try:
        pid, then = make()
    except OSError as exc:
        print(f"    could not: {exc}", flush=True)
        return
    if pid == 0:
        try:
            then(uid, gid)
            in_child()
        finally:
            os._exit(1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("    timed out", flush=True)


def new_proc(uid: int, gid: int) -> None:
    map_ids(uid, gid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    if libc.mount(None, b"/", None, 16384 | (1 << 18), None) != 0:  # MS_REC | MS_PRIVATE
        raise OSError(ctypes.get_errno(), "mount private")
    if libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) != 0:
        raise OSError(ctypes.get_errno(), "mount proc")


def as_pid_2(uid: int, gid: int, proc: bool = False) -> None:
    """This child (pid 1 of its namespace) forks the one that calls cuInit, and reaps."""
    (new_proc if proc else map_ids)(uid, gid)
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        os._exit(0)


def proc_pid_2(uid: int, gid: int) -> None:
    as_pid_2(uid, gid, proc=True)


def main() -> None:
    def nothing(uid: int, gid: int) -> None:
        pass

    def mapped(uid: int, gid: int) -> None:
        map_ids(uid, gid)

    slot = ctypes.c_int.from_address(tid_slot()).value
    print(f"glibc's tid slot holds {slot}; gettid() is {threading.get_native_id()}")
    run("fork", lambda: (os.fork(), nothing))
    run("raw clone, no namespace", lambda: (raw_clone(0), nothing))
    for name, flag in NS.items():
        after = mapped if name == "user" else nothing
        run(f"raw clone, {name} namespace", lambda f=flag, a=after: (raw_clone(f), a))
    run("raw clone, all (as sandbox.clone)", lambda: (raw_clone(ALL), mapped))
    run("raw clone, all, CLONE_CHILD_SETTID", lambda: (raw_clone(ALL, settid=True), mapped))
    run("raw clone, none, CLONE_CHILD_SETTID", lambda: (raw_clone(0, settid=True), nothing))
    pid_ns = NS["user"] | NS["mount"] | NS["pid"]
    run("raw clone, pid namespace, new /proc", lambda: (raw_clone(pid_ns), new_proc))
    run("raw clone, pid namespace, as its pid 2", lambda: (raw_clone(pid_ns), as_pid_2))
    run("raw clone, pid ns, new /proc, as its pid 2", lambda: (raw_clone(pid_ns), proc_pid_2))
    for name, flag in NS.items():
        if name == "pid":
            continue  # unshare(NEWPID) moves only the children

        def fork_unshare(f: int = flag, user: bool = name == "user"):  # type: ignore[no-untyped-def]
            pid = os.fork()
            if pid == 0:

                def then(uid: int, gid: int) -> None:
                    unshare(f)
                    if user:
                        map_ids(uid, gid)

                return 0, then
            return pid, nothing

        run(f"fork + unshare {name}", fork_unshare)
    sys.exit(0)


if __name__ == "__main__":
    main()
