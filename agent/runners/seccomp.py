"""The runner's system-call allow-list, loaded with libseccomp (through ctypes).

What a runner needs: memory, threads, files under its mount view, its Unix socket to
the agent, futexes, time, signals to itself. What it never gets: a new process
(fork, execve), a socket of any family but AF_UNIX, a new namespace, ptrace, mount,
bpf, keyctl, kernel modules, perf, reboot and the like. A denied call fails with
EPERM (the runner sees an error, the kernel logs nothing); clone3 fails with ENOSYS
so glibc falls back to clone, whose flags the filter can read.

Called only in a runner child after fork, single-threaded, after no_new_privs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_ACT_ALLOW = 0x7FFF0000
_ACT_LOG = 0x7FFC0000
_CMP_NE = 1
_CMP_EQ = 4
_CMP_MASKED_EQ = 7

_TIOCSTI = 0x5412
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = (
    0x00020000  # NEWNS
    | 0x02000000  # NEWCGROUP
    | 0x04000000  # NEWUTS
    | 0x08000000  # NEWIPC
    | 0x10000000  # NEWUSER
    | 0x20000000  # NEWPID
    | 0x40000000  # NEWNET
    | 0x00000080  # NEWTIME
)

# Every call below was seen in runners serving, staging, prepacking and building
# variants (strace of the test suite), plus their close relatives (the 32-bit-free
# x86_64 and aarch64 names; unknown names on an architecture are skipped). bind and
# listen: CUDA's driver binds an abstract Unix socket at cuInit (sockets are AF_UNIX
# only; the runner's network namespace has its own abstract names, and Landlock
# scopes them to the runner from ABI 6).
ALLOWED = frozenset(
    """
    read write readv writev pread64 pwrite64 preadv pwritev preadv2 pwritev2
    open openat openat2 close close_range creat lseek dup dup2 dup3 fcntl flock
    stat fstat lstat newfstatat statx statfs fstatfs access faccessat faccessat2
    readlink readlinkat getdents64 getcwd chdir fchdir
    mkdir mkdirat rmdir unlink unlinkat rename renameat renameat2 link linkat
    symlink symlinkat chmod fchmod fchmodat ftruncate truncate fallocate fsync
    fdatasync sync_file_range fadvise64 readahead utimensat futimesat
    mmap munmap mremap mprotect madvise mincore msync brk mlock munlock mlock2
    get_mempolicy set_mempolicy mbind membarrier memfd_create
    futex futex_waitv set_robust_list get_robust_list rseq set_tid_address
    exit exit_group wait4 waitid
    sched_yield sched_getaffinity sched_setaffinity sched_getparam sched_getscheduler
    sched_setscheduler sched_get_priority_max sched_get_priority_min getpriority
    setpriority nanosleep clock_nanosleep clock_gettime clock_getres gettimeofday time
    getpid getppid gettid getuid geteuid getgid getegid getgroups getresuid getresgid
    getpgrp getpgid getsid getrlimit prlimit64 getrusage times sysinfo uname
    rt_sigaction rt_sigprocmask rt_sigreturn rt_sigpending rt_sigtimedwait
    rt_sigsuspend sigaltstack kill tgkill tkill restart_syscall pause alarm
    setitimer getitimer timer_create timer_settime timer_gettime timer_delete
    timer_getoverrun timerfd_create timerfd_settime timerfd_gettime
    poll ppoll select pselect6 epoll_create epoll_create1 epoll_ctl epoll_wait
    epoll_pwait epoll_pwait2 eventfd eventfd2 pipe pipe2
    sendto recvfrom sendmsg recvmsg sendmmsg recvmmsg shutdown getsockname
    getpeername getsockopt setsockopt connect
    bind listen accept accept4
    getrandom prctl arch_prctl capget umask
    inotify_init inotify_init1 inotify_add_watch inotify_rm_watch
    """.split()  # noqa: SIM905 (a list of names reads best as words)
)

# Denied with ENOSYS rather than EPERM: glibc then takes its older path.
FALLBACK = ("clone3",)


class Unavailable(Exception):
    pass


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise Unavailable(f"libseccomp not found ({exc})") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_void_p,
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def available() -> str:
    """'' when a filter can be loaded here, else why not."""
    try:
        _library()
    except Unavailable as exc:
        return str(exc)
    return ""


def compile_filter(log_only: bool = False) -> bytes:
    """The allow-list as a BPF program for this architecture (libseccomp builds it in
    a few milliseconds: the zygote does it once, and each runner only loads it).
    `log_only` makes one that logs what it would deny instead (for building the list:
    the kernel's audit log names each call)."""
    lib = _library()
    default = _ACT_LOG if log_only else _errno_action(errno.EPERM)
    ctx = lib.seccomp_init(default)
    if not ctx:
        raise Unavailable("seccomp_init failed")
    try:

        def rule(name: str, action: int, *cmps: tuple[int, int, int, int]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return  # not a call on this architecture
            array = (_ArgCmp * max(1, len(cmps)))(*(_ArgCmp(*c) for c in cmps))
            rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), array)
            if rc < 0:
                raise Unavailable(f"cannot add a rule for {name}: {os.strerror(-rc)}")

        for name in sorted(ALLOWED):
            rule(name, _ACT_ALLOW)
        for name in FALLBACK:
            rule(name, _errno_action(errno.ENOSYS))
        # Threads only: CLONE_THREAD set and no namespace flag (no fork, no unshare).
        mask = _CLONE_THREAD | _CLONE_NAMESPACES
        rule("clone", _ACT_ALLOW, (0, _CMP_MASKED_EQ, mask, _CLONE_THREAD))
        # Any ioctl but pushing input into a terminal (TIOCSTI).
        rule("ioctl", _ACT_ALLOW, (1, _CMP_NE, _TIOCSTI, 0))
        for name in ("socket", "socketpair"):
            rule(name, _ACT_ALLOW, (0, _CMP_EQ, socket.AF_UNIX, 0))
        fd = os.memfd_create("edgeplex-seccomp")
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc < 0:
                raise Unavailable(f"seccomp_export_bpf failed: {os.strerror(-rc)}")
            program = os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    if not program or len(program) % 8:
        raise Unavailable("libseccomp exported no filter")
    return program


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(program: bytes | None = None) -> None:
    """Load `program` (compile_filter's; built here when None) into this process, which
    has no_new_privs set; every thread it starts later inherits it."""
    program = program or compile_filter()
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        code = ctypes.get_errno()
        raise Unavailable(f"prctl(PR_SET_SECCOMP): {os.strerror(code)}")
