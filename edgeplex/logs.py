"""How the processes log: text lines (the default) or one JSON object per line
(`--log-format json`, for a log pipeline), on stderr."""

from __future__ import annotations

import logging
from typing import Literal

LogFormat = Literal["text", "json"]
FIELDS = "%(asctime)s %(name)s %(levelname)s %(message)s"


def level_of(text: str) -> int | str:
    """A level as a runner is told it: a level's name, or its number ("60": above
    CRITICAL, nothing logged)."""
    return int(text) if text.isdigit() else text


def configure(level: str | int, fmt: LogFormat = "text", **static: str) -> None:
    """Set the root logger up once per process. `static` fields (say, a runner's
    id) go into every JSON record, and before the logger name in text."""
    handler = logging.StreamHandler()
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(
                FIELDS,
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                static_fields=dict(static),
            )
        )
    else:
        tags = "".join(f"{k}[{v}] " for k, v in static.items())
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {tags}%(name)s %(levelname)s %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
