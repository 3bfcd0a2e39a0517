"""Names and versions shared by every role, and the one way to build a path of them.

A name (model, region, site) is safe to use as a path component, a URL segment,
an MQTT topic level and a Redis key part: letters, digits, `_`, `.` and `-`,
starting with a letter or digit, at most 128 characters, and never `..`. A model
version is a positive decimal integer as Triton numbers them (`1`, `12`; no sign,
no leading zero, at most 18 digits). Every entry point checks both with these
functions (the admin API, desired state, on-demand installs, repository scans),
and a path under a root is built only by `path_under`.
"""

from __future__ import annotations

import re
from pathlib import Path

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
VERSION = re.compile(r"^[1-9][0-9]{0,17}$")
NAME_RULE = "letters, digits, '_.-', starting with a letter or digit, at most 128, no '..'"
VERSION_RULE = "a positive whole number such as 1 or 12"


def valid_name(name: str) -> bool:
    return bool(NAME.match(name)) and ".." not in name


def valid_version(version: str) -> bool:
    return bool(VERSION.match(version))


def path_under(root: Path, name: str, *rest: str) -> Path:
    """`root/name/rest...` for a valid model name and valid versions or fixed parts
    (each a single, valid component); ValueError naming the fault otherwise, or if
    the result (symlinks resolved) would leave `root`."""
    if not valid_name(name):
        raise ValueError(f"invalid model name {name[:64]!r}: {NAME_RULE}")
    for part in rest:
        if not part or "/" in part or "\\" in part or part in (".", "..") or "\0" in part:
            raise ValueError(f"invalid path component {part[:64]!r}")
    path = root.joinpath(name, *rest)
    base = root.resolve()
    if not path.resolve().is_relative_to(base):
        raise ValueError(f"{name}/{'/'.join(rest)} leaves {root}")
    return path


# The smaller forms a model may declare (`variants`), as the agent builds them and the
# control plane's catalog accepts them.
VARIANT_FORMS: tuple[str, ...] = ("int8", "fp16")
