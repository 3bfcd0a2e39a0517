"""Names shared by every role: models, regions and sites.

A name is safe to use as a path component, a URL segment, an MQTT topic level
and a Redis key part: letters, digits, `_`, `.` and `-`, starting with a letter
or digit, at most 128 characters, and never `..`.
"""

from __future__ import annotations

import re

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def valid_name(name: str) -> bool:
    return bool(NAME.match(name)) and ".." not in name


# The smaller forms a model may declare (`variants`), as the agent builds them and the
# control plane's catalog accepts them.
VARIANT_FORMS: tuple[str, ...] = ("int8", "fp16")
