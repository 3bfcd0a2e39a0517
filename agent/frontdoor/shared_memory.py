"""Triton's system shared-memory extension: a client on this machine registers a
POSIX shared-memory region (a key such as "/input_simple", an offset and a size)
under a name, then names it in a request's input or output parameters
(`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`), so
the tensors never travel through the socket.

The agent maps each region once, at registration, read-write. What a client may
register is bounded: keys under `shared_memory.key_prefix` only, never the agent's
own (its staged tier and runner rings, named `/edgeplex-*`), regular files only
(no link followed), at most `shared_memory.max_regions` regions and
`shared_memory.max_bytes` in all. Registration, and any request that names a
region, is for clients on this machine: loopback, or the admin token
(auth.Access.LOCAL). The runners never see a region: the agent copies an input
into the batch it sends them, and an output out of their reply, as for any
request.

CUDA shared memory (`/v2/cudasharedmemory/...`) works on an agent whose runners
use CUDA: a client registers the IPC handle of device memory it allocated
(`cudaIpcGetMemHandle`), the agent opens it once through the driver
(cuda_ipc.py) and copies an input out of it, and an output into it, over PCIe:
the tensor still never crosses the socket. The same caps count CUDA regions. On
an agent whose runners use the CPU registration answers that it is not
supported, and unregistering nothing succeeds, as Triton's examples expect.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgeplex.agent.frontdoor import cuda_ipc
from edgeplex.agent.frontdoor.auth import Access, Credentials
from edgeplex.agent.frontdoor.settings import SharedMemorySettings
from edgeplex.agent.oip.errors import AlreadyExists, InvalidInput, NotFound, NotSupported

SHM_DIR = "/dev/shm"
RESERVED = "/edgeplex-"  # the agent's own mappings
REGION, OFFSET = "shared_memory_region", "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"


def cuda_not_supported(gpu: bool) -> str:
    """Why CUDA shared memory cannot be registered on this agent."""
    if gpu:
        try:
            cuda_ipc.driver()
        except cuda_ipc.Unavailable as exc:
            return f"CUDA shared memory is not available: {exc}"
        return ""
    return (
        "CUDA shared memory is not supported: this agent's runners use the CPU "
        "(use system shared memory)"
    )


@dataclass(frozen=True)
class Ref:
    """A tensor's place in a region, as a request names it."""

    region: str
    offset: int
    byte_size: int


@dataclass
class Region:
    """A POSIX shared-memory region, mapped here."""

    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap  # from the page the region's offset lies in
    base: int  # where the region starts in `mapping`
    cuda = False

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}  # fmt: skip

    def read(self, offset: int, size: int) -> memoryview:
        start = self.base + offset
        return memoryview(self.mapping)[start : start + size]

    def write(self, offset: int, data: memoryview) -> None:
        start = self.base + offset
        self.mapping[start : start + len(data)] = data

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a request still reads it: GC closes it
            self.mapping.close()


@dataclass
class CudaRegion:
    """A client's device memory, opened here from its CUDA IPC handle."""

    name: str
    device_id: int
    byte_size: int
    pointer: int  # the device address the handle opened at
    cuda = True

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> memoryview:
        return memoryview(cuda_ipc.driver().to_host(self.pointer + offset, size, self.device_id))

    def write(self, offset: int, data: memoryview) -> None:
        cuda_ipc.driver().to_device(self.pointer + offset, data, self.device_id)

    def close(self) -> None:
        with contextlib.suppress(cuda_ipc.Unavailable):  # the client's process has gone
            cuda_ipc.driver().close_handle(self.pointer, self.device_id)


class SharedMemory:
    """The regions registered with this agent, system and CUDA, by name (one name
    space, as Triton's)."""

    def __init__(self, settings: SharedMemorySettings, gpu: bool = False) -> None:
        self.settings = settings
        self.gpu = gpu  # runners use CUDA: CUDA regions may be registered
        self._regions: dict[str, Region | CudaRegion] = {}

    @property
    def registered(self) -> bool:
        """Whether any region is registered (else a request has none to name)."""
        return bool(self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        settings = self.settings
        self._admit(name, offset, byte_size, "system")
        if not key.startswith(settings.key_prefix) or key.startswith(RESERVED):
            raise InvalidInput(
                f"shared memory region '{name}': key '{key}' is not under the prefix this "
                f"agent allows ('{settings.key_prefix}', not '{RESERVED}*')"
            )
        stem = key[1:] if key.startswith("/") else key
        if not stem or "/" in stem or stem in (".", ".."):
            raise InvalidInput(f"shared memory region '{name}': '{key}' is not a POSIX shm key")
        mapping, base = _map(os.path.join(SHM_DIR, stem), name, key, offset, byte_size)
        self._regions[name] = Region(name, key, offset, byte_size, mapping, base)

    def register_cuda(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        """A client's device memory, by the IPC handle of its allocation's start."""
        reason = cuda_not_supported(self.gpu)
        if reason:
            raise NotSupported(reason)
        self._admit(name, 0, byte_size, "cuda")
        if len(handle) != cuda_ipc.HANDLE_BYTES:
            raise InvalidInput(
                f"cuda shared memory region '{name}': raw_handle is {len(handle)} bytes, "
                f"a CUDA IPC handle {cuda_ipc.HANDLE_BYTES}"
            )
        try:
            pointer = cuda_ipc.driver().open_handle(handle, device_id)
        except (ValueError, cuda_ipc.Unavailable) as exc:
            raise InvalidInput(
                f"failed to register CUDA shared memory region '{name}': {exc}"
            ) from None
        self._regions[name] = CudaRegion(name, device_id, byte_size, pointer)

    def unregister(self, name: str = "", cuda: bool = False) -> None:
        """One region of the kind, or every one of it with no name; a name not
        registered is no error."""
        names = [name] if name else list(self._regions)
        for each in names:
            region = self._regions.get(each)
            if region is not None and region.cuda == cuda:
                del self._regions[each]
                region.close()

    def status(self, name: str = "", cuda: bool = False) -> list[dict[str, Any]]:
        if not name:
            return [r.status() for r in self._regions.values() if r.cuda == cuda]
        region = self._regions.get(name)
        if region is None or region.cuda != cuda:
            kind = "cuda" if cuda else "system"
            raise NotFound(f"Unable to find {kind} shared memory region: '{name}'")
        return [region.status()]

    def read(self, ref: Ref, tensor: str) -> memoryview:
        """The bytes of input `tensor` where `ref` says (a view of a system region, a
        copy out of a CUDA one)."""
        return self._checked(ref, tensor, "input").read(ref.offset, ref.byte_size)

    def write(self, ref: Ref, tensor: str, data: memoryview) -> None:
        """Output `tensor`'s bytes into its place; the place must hold them all."""
        region = self._checked(ref, tensor, "output")
        if len(data) > ref.byte_size:
            raise InvalidInput(
                f"shared memory size specified with the request for output '{tensor}' "
                f"({ref.byte_size} bytes) should be at least {len(data)} bytes to hold the "
                "results"
            )
        region.write(ref.offset, data)

    def _admit(self, name: str, offset: int, byte_size: int, kind: str) -> None:
        """The checks every registration passes first: turned on, named, new, sized,
        within the caps."""
        settings = self.settings
        if not settings.enabled:
            raise NotSupported("shared memory is turned off (shared_memory.enabled)")
        if not name:
            raise InvalidInput(f"a {kind} shared memory region needs a name")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if offset < 0 or byte_size <= 0:
            raise InvalidInput(f"shared memory region '{name}': offset and byte_size must be >= 0")
        if len(self._regions) >= settings.max_regions:
            raise InvalidInput(
                f"shared memory region '{name}': {settings.max_regions} regions are registered "
                "already (shared_memory.max_regions)"
            )
        held = sum(r.byte_size for r in self._regions.values())
        if held + byte_size > settings.max_bytes:
            raise InvalidInput(
                f"shared memory region '{name}': {byte_size} bytes more would pass "
                f"shared_memory.max_bytes ({settings.max_bytes})"
            )

    def _checked(self, ref: Ref, tensor: str, what: str) -> Region | CudaRegion:
        region = self._regions.get(ref.region)
        if region is None:
            raise InvalidInput(
                f"{what} '{tensor}': Unable to find system shared memory region: '{ref.region}'"
            )
        if ref.offset < 0 or ref.byte_size < 0 or ref.offset + ref.byte_size > region.byte_size:
            raise InvalidInput(
                f"{what} '{tensor}': {ref.byte_size} bytes at offset {ref.offset} do not fit "
                f"shared memory region '{ref.region}' of {region.byte_size} bytes"
            )
        return region


class ClientRegions:
    """The regions as one request's client may use them: the first use checks that
    the client is on this machine or holds the admin token (auth.Access.LOCAL)."""

    __slots__ = ("_allowed", "_authorization", "_credentials", "_peer", "memory")

    def __init__(
        self, memory: SharedMemory, credentials: Credentials, authorization: str | None, peer: str
    ) -> None:
        self.memory = memory
        self._credentials, self._authorization, self._peer = credentials, authorization, peer
        self._allowed = False

    def read(self, ref: Ref, tensor: str) -> memoryview:
        self._allow()
        return self.memory.read(ref, tensor)

    def write(self, ref: Ref, tensor: str, data: memoryview) -> None:
        self._allow()
        self.memory.write(ref, tensor, data)

    def _allow(self) -> None:
        if not self._allowed:
            what = "shared memory in a request"
            self._credentials.check(Access.LOCAL, self._authorization, what, self._peer)
            self._allowed = True


def ref_of(params: Mapping[str, Any], tensor: str) -> Ref | None:
    """The shared-memory place a tensor's parameters name, or None."""
    region = params.get(REGION)
    if region is None:
        return None
    size, offset = params.get(BYTE_SIZE), params.get(OFFSET, 0)
    if not isinstance(region, str) or not _count(size) or not _count(offset):
        raise InvalidInput(
            f"'{tensor}': {REGION} needs a string, {BYTE_SIZE} and {OFFSET} non-negative integers"
        )
    return Ref(region, int(offset), int(size))  # type: ignore[arg-type]  # checked above


def grpc_params(parameters: Any) -> dict[str, Any]:
    """A gRPC parameters map (InferParameter values, or any message's with the same
    `parameter_choice`: log settings) as plain values."""
    return {k: getattr(v, v.WhichOneof("parameter_choice") or "string_param")
            for k, v in parameters.items()}  # fmt: skip


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _map(path: str, name: str, key: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
    """The region mapped read-write, only the pages it spans (mmap's offset must be
    page-aligned), and where it starts in the mapping."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidInput(
            f"Unable to open shared memory region: '{key}' ({name}): {exc.strerror}"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"shared memory region '{name}': '{key}' is not a regular file")
        if offset + byte_size > info.st_size:
            raise InvalidInput(
                f"shared memory region '{name}': {byte_size} bytes at offset {offset} pass the "
                f"end of '{key}' ({info.st_size} bytes)"
            )
        base = offset % mmap.ALLOCATIONGRANULARITY
        access = mmap.PROT_READ | mmap.PROT_WRITE
        mapping = mmap.mmap(fd, base + byte_size, mmap.MAP_SHARED, access, offset=offset - base)
        return mapping, base
    finally:
        os.close(fd)
