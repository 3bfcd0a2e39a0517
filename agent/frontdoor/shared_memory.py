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

CUDA shared memory (`/v2/cudasharedmemory/...`) answers that it is not supported
on an agent whose runners use the CPU; unregistering nothing succeeds there, as
Triton's examples expect.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
        return "CUDA shared memory is not supported yet: use system shared memory"
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
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap  # from the page the region's offset lies in
    base: int  # where the region starts in `mapping`

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}  # fmt: skip


class SharedMemory:
    """The regions registered with this agent, by name."""

    def __init__(self, settings: SharedMemorySettings) -> None:
        self.settings = settings
        self._regions: dict[str, Region] = {}

    @property
    def registered(self) -> bool:
        """Whether any region is registered (else a request has none to name)."""
        return bool(self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        settings = self.settings
        if not settings.enabled:
            raise NotSupported("system shared memory is turned off (shared_memory.enabled)")
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' already in manager")
        if offset < 0 or byte_size <= 0:
            raise InvalidInput(f"shared memory region '{name}': offset and byte_size must be >= 0")
        if not key.startswith(settings.key_prefix) or key.startswith(RESERVED):
            raise InvalidInput(
                f"shared memory region '{name}': key '{key}' is not under the prefix this "
                f"agent allows ('{settings.key_prefix}', not '{RESERVED}*')"
            )
        stem = key[1:] if key.startswith("/") else key
        if not stem or "/" in stem or stem in (".", ".."):
            raise InvalidInput(f"shared memory region '{name}': '{key}' is not a POSIX shm key")
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
        mapping, base = _map(os.path.join(SHM_DIR, stem), name, key, offset, byte_size)
        self._regions[name] = Region(name, key, offset, byte_size, mapping, base)

    def unregister(self, name: str = "") -> None:
        """One region, or every one with no name; a name not registered is no error."""
        names = [name] if name else list(self._regions)
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                with contextlib.suppress(BufferError):  # a request still reads it: GC closes
                    region.mapping.close()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if not name:
            return [r.status() for r in self._regions.values()]
        region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    def read(self, ref: Ref, tensor: str) -> memoryview:
        """The bytes of input `tensor` where `ref` says (a view, not a copy)."""
        region = self._checked(ref, tensor, "input")
        start = region.base + ref.offset
        return memoryview(region.mapping)[start : start + ref.byte_size]

    def write(self, ref: Ref, tensor: str, data: memoryview) -> None:
        """Output `tensor`'s bytes into its place; the place must hold them all."""
        region = self._checked(ref, tensor, "output")
        if len(data) > ref.byte_size:
            raise InvalidInput(
                f"shared memory size specified with the request for output '{tensor}' "
                f"({ref.byte_size} bytes) should be at least {len(data)} bytes to hold the "
                "results"
            )
        start = region.base + ref.offset
        region.mapping[start : start + len(data)] = data

    def _checked(self, ref: Ref, tensor: str, what: str) -> Region:
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
    """A gRPC parameters map (InferParameter values) as plain values."""
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
