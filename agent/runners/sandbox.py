"""The runner sandbox: what a runner process can see and do, set up in the child
between the zygote's clone and the runner's first frame.

A model's graph is code the operator did not write, run by a native library; the
sandbox assumes it may take over its runner and limits what it then reaches.
Layers, in the order they are applied, each reported (Hello.sandbox) and none
assumed:

  namespaces    the clone itself makes new user, mount, PID, IPC and network
                namespaces: no other process to see or signal, no route anywhere
                (the network namespace has only `lo`, down), ids mapped 1:1;
  mount_view    a new root holding only what the runner needs: the system's and
                Python's libraries and the model paths read-only, the staged tier,
                the shared rings and the variant store writable, a private /proc,
                /tmp and a few /dev nodes; secrets under a bound path are masked;
  capabilities  every capability dropped (the user namespace gave it all of them);
  rlimits       no core dumps, bounded open files (and RLIMIT_AS where it is the
                memory limit);
  no_new_privs  nothing it could ever exec gains privileges;
  landlock      the same paths again, enforced by the kernel even if the view were
                escaped; no TCP, no abstract sockets or signals outside (landlock.py);
  seccomp       a system-call allow-list: no exec, no fork, no socket but AF_UNIX,
                no ptrace, mount, bpf, keyctl (seccomp.py).

The memory cgroup is the seventh wall, set by the zygote before the child runs
(limits.py makes the group). Everything here runs in the zygote or its child,
single-threaded; see docs/security.md for what a hostile model can still reach.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterable

from edgeplex.agent.runners import ipc, landlock, seccomp

LAYERS = (
    "namespaces",
    "mount_view",
    "capabilities",
    "rlimits",
    "no_new_privs",
    "landlock",
    "seccomp",
)
ON = "on"

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_NAMESPACES = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWNET
_SIGCHLD = 17
_SYSCALLS = {"x86_64": (56, 155, 126), "aarch64": (220, 41, 91)}  # clone, pivot_root, capset

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MS_KEPT = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC | 1024 | 2048 | 4096  # + atime flags
_MNT_DETACH = 2
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24

SYSTEM_PATHS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")
DEV_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
CPU_TOPOLOGY = "/sys/devices/system/cpu"  # what ORT reads to size its thread pools
EX_CONFIG = 78  # a runner that `required` could not sandbox exits with this


class SandboxError(Exception):
    pass


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


def _numbers() -> tuple[int, int, int]:
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise SandboxError(f"no namespaces on {platform.machine()} (unknown system calls)")
    return numbers


def clone() -> int:
    """fork(), but the child starts in new user, mount, PID, IPC and network
    namespaces (PID 1 in its own). Returns 0 in the child, its pid in the parent;
    OSError where the host forbids it (no user namespaces, a seccomp profile).

    A raw clone does not run Python's fork hooks: only a single-threaded process (the
    zygote) may call it, and the child must only set up and run the runner."""
    number = _numbers()[0]
    libc = _libc()
    pid = libc.syscall(number, _NAMESPACES | _SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"clone into new namespaces: {os.strerror(code)}")
    return int(pid)


def clone_or_fork() -> tuple[int, str]:
    """clone() where the host allows new namespaces and ids can be mapped into them,
    else a plain fork: (the pid as fork returns it, "" or why the child has no
    namespaces of its own)."""
    refused = namespaces_refused()
    if refused:
        return os.fork(), refused
    try:
        return clone(), ""
    except (OSError, SandboxError) as exc:
        return os.fork(), str(exc)


_refused: str | None = None  # why a runner cannot have namespaces here, once known


def namespaces_refused() -> str:
    """ "" when a cloned child can map its ids into its new user namespace, else why
    not, found once with a child that tries. A host may allow the clone yet refuse
    the mapping (root without CAP_SETFCAP, as in many containers): a child left in
    new namespaces without its ids has no mount view, and a PID namespace that still
    sees the host's /proc, which CUDA's driver cannot initialise in."""
    global _refused
    if _refused is None:
        uid, gid = os.geteuid(), os.getegid()  # read before the clone maps them
        try:
            said = _in_child(lambda _: _map_ids(uid, gid), lambda: (clone(), ""))
        except (OSError, SandboxError) as exc:
            said = str(exc)
        _refused = f"ids cannot be mapped into a user namespace: {said}" if said else ""
    return _refused


def _map_ids(uid: int, gid: int) -> str:
    """Map `uid` and `gid` 1:1 into this new user namespace (a process may map only
    its own ids there), groups denied: "" once done, else why not."""
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as exc:
        return str(exc) or type(exc).__name__
    return ""


class Sandbox:
    """Applies the layers to this child process, per its SpawnRunner request."""

    def __init__(
        self, request: ipc.SpawnRunner, uid: int, gid: int, seccomp_program: bytes | None = None
    ) -> None:
        self.request = request
        self.seccomp_program = seccomp_program  # compiled by the zygote, once
        self._uid, self._gid = uid, gid  # the zygote's, read before the clone
        self._libc = _libc()
        self.layers: dict[str, str] = {}
        self.timings_us: dict[str, int] = {}  # what each layer took to apply

    # --- the paths ----------------------------------------------------------------------

    def read_only(self) -> list[str]:
        python = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]
        python += [p for p in sys.path if p and os.path.isdir(p)]
        paths = [*SYSTEM_PATHS, *SYSTEM_FILES, *python, *self.request.read_only]
        return _outermost(p for p in paths if os.path.lexists(p))

    def writable(self) -> list[str]:
        return [p for p in dict.fromkeys(self.request.writable) if os.path.exists(p)]

    # --- the layers ---------------------------------------------------------------------

    def apply(self, no_namespaces: str) -> dict[str, str]:
        """Apply every layer it can; returns {layer: "on" or why not}. `no_namespaces`
        says why the clone made none ("" when it did). With `required`, raises
        SandboxError at the first layer missing."""
        self.layers = {}
        # Resolved before the view replaces the root they are resolved against.
        self._ro, self._rw = self.read_only(), self.writable()
        self._sources = {p: os.path.realpath(p) for p in (*self._ro, *self._rw)}
        self._layer("namespaces", lambda: no_namespaces or self._map_ids())
        if self.layers["namespaces"] == ON:
            self._layer("mount_view", self._build_view)
            self._layer("capabilities", self._drop_capabilities)
        else:
            self.layers["mount_view"] = "needs the namespaces"
            self.layers["capabilities"] = "none held (no user namespace)"
            if os.geteuid() == 0:
                self.layers["capabilities"] = "the agent runs as root without namespaces"
        self._layer("rlimits", self._rlimits)
        self._layer("no_new_privs", self._no_new_privs)
        self._layer("landlock", self._landlock)
        self._layer("seccomp", lambda: seccomp.install(self.seccomp_program))
        return self.layers

    def _layer(self, name: str, step: Callable[[], object]) -> None:
        started = time.perf_counter_ns()
        try:
            outcome = step()
            self.layers[name] = outcome if isinstance(outcome, str) and outcome else ON
        except (OSError, SandboxError, landlock.Unavailable, seccomp.Unavailable) as exc:
            self.layers[name] = str(exc) or type(exc).__name__
        self.timings_us[name] = (time.perf_counter_ns() - started) // 1000
        if self.request.sandbox == "required" and self.layers[name] != ON:
            raise SandboxError(f"runner.sandbox is required, but {name}: {self.layers[name]}")

    def _map_ids(self) -> str:
        """Map the zygote's uid and gid 1:1 into the new user namespace."""
        refused = _map_ids(self._uid, self._gid)
        if refused:
            raise SandboxError(f"ids cannot be mapped into a user namespace: {refused}")
        return ""

    def _build_view(self) -> None:
        """pivot_root into a tmpfs holding only the binds (bubblewrap's two steps: the
        tmpfs first becomes the root with the old one under it, so every source, /tmp's
        included, stays reachable while the view is built; then the view alone)."""
        libc = self._libc
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
        base = "/tmp" if os.path.isdir("/tmp") else "/dev"
        _mount(libc, "tmpfs", base, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
        os.chdir(base)
        os.mkdir("new")
        os.mkdir("old")
        self._pivot(".", "old")
        new = "/new"
        _mount(libc, new, new, None, _MS_BIND | _MS_REC)
        # A private /tmp and /dev/shm first (CUDA's runtime uses the latter): binds of
        # paths under the host's go on top of them.
        for private in ("/tmp", "/dev/shm"):
            os.makedirs(new + private)
            flags = _MS_NOSUID | _MS_NODEV
            _mount(libc, "tmpfs", new + private, "tmpfs", flags, "mode=1777,size=64m")
        for path in self._ro:
            self._bind(path, new + path, writable=False)
        for path in self._rw:
            self._bind(path, new + path, writable=True)
        devices = [*DEV_NODES, *self.request.devices]
        for node in devices:
            if os.path.exists("/old" + node):
                self._bind(node, new + node, writable=True)
        if os.path.isdir("/old" + CPU_TOPOLOGY):
            self._bind(CPU_TOPOLOGY, new + CPU_TOPOLOGY, writable=False)
        os.makedirs(new + "/proc", exist_ok=True)
        _mount(libc, "proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        self._mask(new)
        os.chdir(new)
        self._pivot(".", ".")
        _umount(libc, ".", _MNT_DETACH)
        os.chdir("/")
        # The view's own skeleton (the tmpfs the binds hang from) is read-only too.
        _mount(libc, "/", "/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)

    def _bind(self, path: str, target: str, writable: bool) -> None:
        if path in SYSTEM_PATHS and os.path.islink("/old" + path):  # /lib -> usr/lib
            source = "/old" + path
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(source), target)
            return
        source = "/old" + self._sources.get(path, os.path.realpath(path))
        if os.path.isdir(source):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if not os.path.lexists(target):
                os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
        _mount(self._libc, source, target, None, _MS_BIND | _MS_REC)
        if not writable:
            kept = os.statvfs(target).f_flag & _MS_KEPT
            flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | kept
            _mount(self._libc, None, target, None, flags)

    def _mask(self, new: str) -> None:
        """Hide secrets that lie under a bound path: an empty read-only tmpfs over a
        directory, the empty file /.masked over a file."""
        empty = new + "/.masked"
        os.close(os.open(empty, os.O_CREAT | os.O_WRONLY, 0o400))
        for path in self.request.hidden:
            target = new + path
            if not os.path.lexists(target):
                continue
            if os.path.isdir(target):
                _mount(self._libc, "tmpfs", target, "tmpfs", _MS_RDONLY | _MS_NOSUID, "size=4k")
            else:
                _mount(self._libc, empty, target, None, _MS_BIND)
                flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
                _mount(self._libc, None, target, None, flags)

    def _pivot(self, new_root: str, put_old: str) -> None:
        if self._libc.syscall(_numbers()[1], new_root.encode(), put_old.encode()) < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"pivot_root: {os.strerror(code)}")

    def _drop_capabilities(self) -> None:
        for cap in range(64):
            dropped = self._libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0
            if not dropped and ctypes.get_errno() == errno.EINVAL:
                break  # past the last capability this kernel has
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2: none
        if self._libc.syscall(_numbers()[2], header, data) < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"capset: {os.strerror(code)}")

    def _rlimits(self) -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.request.max_open_files:
            n = self.request.max_open_files
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
        if self.request.rlimit_as:
            limit = self.request.rlimit_as
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    def _no_new_privs(self) -> None:
        if self._libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")

    def _landlock(self) -> str:
        rw = landlock.all_fs_rights(landlock.abi())
        paths = [(p, landlock.READ_ONLY) for p in self._ro]
        paths += [(p, rw) for p in self._rw]
        paths += [(p, rw) for p in (*DEV_NODES, *self.request.devices)]
        if self.layers.get("mount_view") == ON:  # private ones; never the host's
            paths += [("/tmp", rw), ("/dev/shm", rw)]
        paths += [("/proc", landlock.READ_ONLY), (CPU_TOPOLOGY, landlock.READ_ONLY)]
        if self.request.devices:  # a CUDA runner
            paths.append(("/proc/self/task", landlock.THREAD_NAMES))
        version = landlock.restrict(paths)
        return ON if version >= 4 else f"on (ABI {version}: files only, TCP not covered)"


def probe(request: ipc.SpawnRunner, seccomp_program: bytes | None = None) -> dict[str, str]:
    """What this host gives a runner: a child is cloned, applies every layer, reports
    and exits. Run by the zygote at start (single-threaded, like every clone)."""
    uid, gid = os.geteuid(), os.getegid()  # read before the clone maps them

    def confined(no_namespaces: str) -> str:
        return json.dumps(Sandbox(request, uid, gid, seccomp_program).apply(no_namespaces))

    try:
        layers = json.loads(_in_child(confined, clone_or_fork))
    except ValueError:
        layers = {}
    return {name: layers.get(name, "the probe died before reporting") for name in LAYERS}


def probe_cuda(request: ipc.SpawnRunner, seccomp_program: bytes | None = None) -> str:
    """ON when CUDA works in a runner sandboxed as `request` says as far as it works
    outside (the driver initialises; ONNX Runtime creates its CUDA provider, where it
    can outside), or CUDA's driver cannot initialise here at all (then the sandbox
    takes nothing from it); else why not. Every try is a child: the zygote itself
    never touches CUDA, or its forks would inherit a driver that does not survive
    fork()."""
    outside = _in_child(lambda _: cuda_init(), lambda: (os.fork(), ""))
    if outside != "0":
        return ON
    provider_outside = _in_child(lambda _: cuda_provider(), lambda: (os.fork(), "")) == "0"
    uid, gid = os.geteuid(), os.getegid()  # read before the clone maps them

    def confined(no_namespaces: str) -> str:
        Sandbox(request, uid, gid, seccomp_program).apply(no_namespaces)
        init = cuda_init()
        if init != "0":
            return f"CUDA's driver does not initialise inside the sandbox (cuInit: {init})"
        if provider_outside and (why := cuda_provider()) != "0":
            return f"ONNX Runtime's CUDA provider cannot start inside the sandbox ({why})"
        return ON

    inside = _in_child(confined, clone_or_fork)
    return inside or "CUDA's probe died inside the sandbox"


def cuda_init() -> str:
    """cuInit(0) from the driver's libcuda: "0" on success, else its error code or why
    the driver is missing."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA driver (libcuda.so.1)"
    return str(driver.cuInit(0))


# One Identity node of one float, serialized (onnx.helper made it): the smallest
# model ONNX Runtime will make a session of.
_PROBE_MODEL = base64.b64decode(
    "CAgSADo7ChAKAXgSAXkiCElkZW50aXR5EgVwcm9iZVoPCgF4EgoKCAgBEgQKAggBYg8KAXkSCgoICAESBAoCCAFCBAoAEA0="
)


def cuda_provider() -> str:
    """ "0" when ONNX Runtime makes a session on its CUDA provider here (what a runner
    needs past cuInit: CUDA's libraries loaded, a context made), else why not."""
    try:
        import onnxruntime as ort

        from edgeplex.agent.runners import sessions

        sessions._preload_cuda()
        session = ort.InferenceSession(_PROBE_MODEL, providers=["CUDAExecutionProvider"])
    except Exception as exc:  # anything it raises is the answer
        return f"{type(exc).__name__}: {exc}"[:300]
    if session.get_providers()[0] != "CUDAExecutionProvider":
        return "the session fell back to the CPU"
    return "0"


def _in_child(work: Callable[[str], str], make: Callable[[], tuple[int, str]]) -> str:
    """`work(no_namespaces)` run in a child made by `make` (clone_or_fork or fork):
    what it returned, or "" if it died first."""
    read, write = os.pipe()
    pid, no_namespaces = make()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            os.write(write, work(no_namespaces).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    return said.decode(errors="replace")


def _outermost(paths: Iterable[str]) -> list[str]:
    """Normalised absolute paths, without any that lies inside another one."""
    out: list[str] = []
    for path in sorted({os.path.normpath(os.path.abspath(p)) for p in paths}):
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in out):
            out.append(path)
    return out


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _mount(
    libc: ctypes.CDLL,
    source: str | None,
    target: str,
    fstype: str | None,
    flags: int,
    data: str | None = None,
) -> None:
    def b(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    if libc.mount(b(source), b(target), b(fstype), flags, b(data)) < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source or ''} on {target}: {os.strerror(code)}")


def _umount(libc: ctypes.CDLL, target: str, flags: int) -> None:
    if libc.umount2(target.encode(), flags) < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"umount {target}: {os.strerror(code)}")
