"""Byte sizes as people write them ("64MiB", "1.5G", "4096"), for every setting of
either role that takes bytes."""

from __future__ import annotations

KiB = 1024
MiB = 1024 * 1024

_SUFFIXES = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}


def parse_size(value: int | str) -> int:
    """'64MiB', '1.5G', '4096' -> bytes (binary multiples)."""
    if isinstance(value, int):
        return value
    text = value.strip().lower().replace(" ", "")
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    suffix = text[len(number) :]
    if suffix not in _SUFFIXES or not number:
        raise ValueError(f"not a size: {value!r} (use e.g. 512MiB, 2G, 1048576)")
    return int(float(number) * _SUFFIXES[suffix])
