"""CUDA's driver API, the little of it CUDA shared memory needs: open a client's
IPC handle (the 64 bytes `cudaIpcGetMemHandle` gives) into this process, copy
between that device memory and host memory, close it. Loaded from the driver's
own libcuda.so.1 on first use, through ctypes: no CUDA runtime or toolkit is
needed, and a machine without a driver answers `Unavailable` with the reason.

Every call makes the device's primary context current on the calling thread
first (the one the runtime API shares), so any thread may call.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any

import numpy as np

HANDLE_BYTES = 64  # sizeof(CUipcMemHandle) == sizeof(cudaIpcMemHandle_t)
_LAZY_ENABLE_PEER_ACCESS = 0x1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, as Triton opens them


class Unavailable(Exception):
    """CUDA's driver cannot be used here (not installed, no device, or it failed)."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


_P, _U64, _SIZE = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [ctypes.c_uint],
    "cuDeviceGetCount": [ctypes.POINTER(ctypes.c_int)],
    "cuDeviceGet": [ctypes.POINTER(ctypes.c_int), ctypes.c_int],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_P), ctypes.c_int],
    "cuCtxSetCurrent": [_P],
    "cuIpcOpenMemHandle_v2": [ctypes.POINTER(_U64), _Handle, ctypes.c_uint],
    "cuIpcOpenMemHandle": [ctypes.POINTER(_U64), _Handle, ctypes.c_uint],
    "cuIpcCloseMemHandle": [_U64],
    "cuIpcGetMemHandle": [ctypes.POINTER(_Handle), _U64],
    "cuMemcpyDtoH_v2": [_P, _U64, _SIZE],
    "cuMemcpyHtoD_v2": [_U64, _P, _SIZE],
    "cuMemAlloc_v2": [ctypes.POINTER(_U64), _SIZE],
    "cuMemFree_v2": [_U64],
    "cuGetErrorString": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
}


class Driver:
    """libcuda.so.1, initialised once; `contexts` holds each device's primary context."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise Unavailable(f"CUDA's driver library cannot be loaded: {exc}") from None
        for name, argtypes in _SIGNATURES.items():
            with contextlib.suppress(AttributeError):  # a _v2 entry point: see _call
                getattr(self._lib, name).argtypes = argtypes
        self._call("cuInit", 0)
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def open_handle(self, handle: bytes, device_id: int) -> int:
        """The device address a client's IPC handle stands for, opened here."""
        if len(handle) != HANDLE_BYTES:
            raise ValueError(f"a CUDA IPC handle is {HANDLE_BYTES} bytes, not {len(handle)}")
        self._current(device_id)
        pointer = ctypes.c_uint64()
        raw = _Handle(handle)
        self._call("cuIpcOpenMemHandle_v2", ctypes.byref(pointer), raw, _LAZY_ENABLE_PEER_ACCESS)
        return pointer.value

    def close_handle(self, pointer: int, device_id: int) -> None:
        self._current(device_id)
        self._call("cuIpcCloseMemHandle", ctypes.c_uint64(pointer))

    def to_host(self, pointer: int, size: int, device_id: int) -> bytearray:
        """`size` bytes from device memory at `pointer`, copied into host memory."""
        out = bytearray(size)
        if size:
            self._current(device_id)
            target = ctypes.addressof((ctypes.c_char * size).from_buffer(out))
            self._call("cuMemcpyDtoH_v2", target, pointer, size)
        return out

    def to_device(self, pointer: int, data: Any, device_id: int) -> None:
        """Host bytes (any buffer) copied to device memory at `pointer`."""
        source = np.frombuffer(data, np.uint8)  # read-only buffers too, without a copy
        if not source.nbytes:
            return
        self._current(device_id)
        self._call("cuMemcpyHtoD_v2", pointer, source.ctypes.data, source.nbytes)

    # --- for clients of the extension (tests, benchmarks): memory to share ---------------

    def allocate(self, size: int, device_id: int) -> int:
        self._current(device_id)
        pointer = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(size))
        return pointer.value

    def free(self, pointer: int, device_id: int) -> None:
        self._current(device_id)
        self._call("cuMemFree_v2", ctypes.c_uint64(pointer))

    def ipc_handle(self, pointer: int, device_id: int) -> bytes:
        self._current(device_id)
        handle = _Handle()
        self._call("cuIpcGetMemHandle", ctypes.byref(handle), ctypes.c_uint64(pointer))
        return ctypes.string_at(ctypes.addressof(handle), HANDLE_BYTES)

    # --- the plumbing ---------------------------------------------------------------------

    def _current(self, device_id: int) -> None:
        with self._lock:
            context = self._contexts.get(device_id)
            if context is None:
                if not 0 <= device_id < self.device_count():
                    raise ValueError(f"there is no CUDA device {device_id} on this machine")
                device, context = ctypes.c_int(), ctypes.c_void_p()
                self._call("cuDeviceGet", ctypes.byref(device), device_id)
                self._call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device.value)
                self._contexts[device_id] = context
        self._call("cuCtxSetCurrent", context)

    def _call(self, name: str, *args: Any) -> None:
        try:
            function = getattr(self._lib, name)
        except AttributeError:  # a driver older than the _v2 entry point
            function = getattr(self._lib, name.removesuffix("_v2"))
        result = function(*args)
        if result != 0:
            text = ctypes.c_char_p()
            self._lib.cuGetErrorString(result, ctypes.byref(text))
            reason = text.value.decode() if text.value else "unknown error"
            raise Unavailable(f"{name} failed: {reason} (CUresult {result})")


_driver: Driver | None = None
_failure = ""
_once = threading.Lock()


def driver() -> Driver:
    """This process's driver, loaded on first use; Unavailable (the same reason each
    time) where it cannot be."""
    global _driver, _failure
    with _once:
        if _driver is None and not _failure:
            try:
                _driver = Driver()
            except Unavailable as exc:
                _failure = str(exc)
        if _driver is None:
            raise Unavailable(_failure)
        return _driver
