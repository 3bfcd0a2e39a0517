"""Undoing gzip and deflate, never past a cap: both doors' compressed requests
(HTTP's Content-Encoding, gRPC's grpc-encoding) go through `inflate`."""

from __future__ import annotations

import zlib

ENCODINGS = ("gzip", "deflate")


class TooLarge(ValueError):
    """The data decompresses past the cap (a small message may hold a large one)."""


class Corrupt(ValueError):
    """The data does not decompress, or is cut short. Its text reads after "is":
    "not valid gzip: ...", "truncated gzip"."""


def inflate(data: bytes | memoryview, encoding: str, limit: int) -> bytes:
    """`data` compressed with `encoding` (gzip or deflate), decompressed to at most
    `limit` bytes: no more than limit + 1 bytes are ever made."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise Corrupt(f"not valid {encoding}: {exc}") from None
    if len(out) > limit:
        raise TooLarge(f"decompresses past {limit} bytes")
    if not inflater.eof:
        raise Corrupt(f"truncated {encoding}")
    return out
