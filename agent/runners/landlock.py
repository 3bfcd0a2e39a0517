"""Landlock, the runner's second wall: file access limited to the paths of its mount
view even if something escaped the view, TCP bind and connect denied (ABI 4+), and
abstract Unix sockets and signals scoped to the runner itself (ABI 6+).

Raw system calls through ctypes (their numbers are the same on every architecture).
Called only in a runner child after fork, single-threaded, after no_new_privs.
"""

from __future__ import annotations

import ctypes
import os

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

# Filesystem rights by ABI version (bit i is right i of the kernel's list).
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_FS = (1 << 13) - 1  # execute .. make_sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1

READ_ONLY = EXECUTE | READ_FILE | READ_DIR
# A process's own /proc/self/task: CUDA's driver names the threads it starts by
# writing their `comm` files there, and fails to initialise if it cannot.
THREAD_NAMES = READ_ONLY | WRITE_FILE | _TRUNCATE


class Unavailable(Exception):
    pass


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or it is disabled)."""
    version = _libc().syscall(_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return max(0, int(version))


def all_fs_rights(version: int) -> int:
    rights = _ABI1_FS
    if version >= 2:
        rights |= _REFER
    if version >= 3:
        rights |= _TRUNCATE
    if version >= 5:
        rights |= _IOCTL_DEV
    return rights


def restrict(paths: list[tuple[str, int]]) -> int:
    """Restrict this process (and the threads it starts) to `paths`, each with its
    rights (READ_ONLY, or all_fs_rights(abi) for writable ones); paths that do not
    exist are skipped. Returns the ABI version used."""
    version = abi()
    if version < 1:
        raise Unavailable("the kernel has no Landlock (or it is disabled)")
    libc = _libc()
    handled = all_fs_rights(version)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if version >= 4:
        attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP
        size = 16
    if version >= 6:
        attr.scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL
        size = 24
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise Unavailable(f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    try:
        for path, rights in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(path):  # a file takes only file rights
                    rights &= EXECUTE | WRITE_FILE | READ_FILE | _TRUNCATE | _IOCTL_DEV
                rule = _PathBeneath(rights & handled, fd)
                if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    raise Unavailable(
                        f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}"
                    )
            finally:
                os.close(fd)
        if libc.syscall(_RESTRICT_SELF, ruleset, 0):
            raise Unavailable(f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)
    return version
