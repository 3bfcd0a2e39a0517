"""A model config as parsed (config.pbtxt or its JSON): each field a list of its
values, since a field may repeat, and the one value a field that does not repeat
gives (the last one set, as protobuf's text format keeps it)."""

from __future__ import annotations

from typing import Any

Message = dict[str, list[Any]]  # a field may repeat: every value is a list


def one(message: Message, key: str, default: Any) -> Any:
    """The value of the field `key`: its last one, or `default` when it is not set."""
    values = message.get(key, [])
    return values[-1] if values else default
