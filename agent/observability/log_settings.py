"""Triton's logging extension: the agent's log settings, read and changed while it
runs (HTTP `/v2/logging`, gRPC `LogSettings`).

Triton's toggles map onto the agent's one log level, which nests: a verbose level
above 0 logs DEBUG, else `log_info` INFO, else `log_warnings` WARNING, else
`log_errors` ERROR, else nothing. The toggles read back as they were set. Where the
log goes and its format are the agent's start-up settings (`--log-format`, the
service manager's journal): `log_file` stays "" and `log_format` "default", and a
change to either is refused. Runners log at the agent's level: a change reaches
those serving at once, and those that start later start with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from edgeplex.agent.oip.errors import InvalidInput

TOGGLES = ("log_info", "log_warnings", "log_errors")
FIXED = {"log_file": "", "log_format": "default"}  # set at start, not here


class LogSettings:
    def __init__(
        self,
        logger: logging.Logger | None = None,
        on_level: Callable[[int], None] | None = None,
    ) -> None:
        """`on_level`: told each new level (the runners log at it too)."""
        self._logger = logger or logging.getLogger()
        self._on_level = on_level
        level = self._logger.level
        self._values: dict[str, Any] = {
            "log_info": level <= logging.INFO,
            "log_warnings": level <= logging.WARNING,
            "log_errors": level <= logging.ERROR,
            "log_verbose_level": 1 if level <= logging.DEBUG else 0,
        }

    def view(self) -> dict[str, Any]:
        """Every setting, as Triton lists them."""
        return {"log_file": FIXED["log_file"], **self._values, "log_format": FIXED["log_format"]}

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply `changes` (all checked before any is applied) and return every
        setting. InvalidInput names a setting that is unknown, of the wrong type, or
        fixed at start."""
        for key, value in changes.items():
            if key in TOGGLES:
                if not isinstance(value, bool):
                    raise InvalidInput(f"log settings: '{key}' must be true or false")
            elif key == "log_verbose_level":
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise InvalidInput(
                        "log settings: 'log_verbose_level' must be a non-negative integer"
                    )
            elif key in FIXED:
                if value != FIXED[key]:
                    raise InvalidInput(
                        f"log settings: '{key}' is set when the agent starts (--log-format, "
                        "and the service manager's journal), not here"
                    )
            else:
                raise InvalidInput(f"log settings: no setting '{key}'")
        self._values.update((k, v) for k, v in changes.items() if k not in FIXED)
        level = self._level()
        self._logger.setLevel(level)
        if self._on_level is not None:
            self._on_level(level)
        return self.view()

    def _level(self) -> int:
        values = self._values
        if values["log_verbose_level"] > 0:
            return logging.DEBUG
        for key, level in zip(TOGGLES, (logging.INFO, logging.WARNING, logging.ERROR), strict=True):
            if values[key]:
                return level
        return logging.CRITICAL + 10  # nothing
