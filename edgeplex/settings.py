"""What every process's settings share: flags over environment over a YAML file,
the state directory, and the Markdown reference tables docs/configuration.md is
generated from."""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, YamlConfigSettingsSource

_config_file: ContextVar[Path | None] = ContextVar("edgeplex_config_file", default=None)

S = TypeVar("S", bound="FileSettings")


# Where artifacts may come from: the same three settings on agents (fleet.*) and
# the control plane; edgeplex.artifacts.FetchPolicy.of() reads them.
ArtifactSchemes = Annotated[
    list[Literal["https", "http"]],
    Field(
        description="Network schemes artifact URIs may use. file:// is governed by "
        "artifact_file_roots; a redirect to another scheme is refused."
    ),
]
ArtifactFileRoots = Annotated[
    list[Path],
    Field(
        description="Directories file:// artifact URIs may point under. Empty: no file:// "
        "artifacts."
    ),
]
ArtifactDeadline = Annotated[
    float, Field(gt=0, description="Longest one artifact download may take in all.")
]


def state_dir() -> Path:
    """Where a process keeps its keys and tokens: $STATE_DIRECTORY (systemd's
    StateDirectory=), else $XDG_STATE_HOME/edgeplex or ~/.local/state/edgeplex."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "edgeplex"


class FileSettings(BaseSettings):
    """Base of the processes' settings. Precedence, highest first: flags (init
    arguments), environment variables, the YAML file given to `load`."""

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):  # type: ignore[override]
        sources = [init_settings, env_settings]
        if _config_file.get() is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=_config_file.get()))
        return tuple(sources)

    @classmethod
    def load(cls: type[S], config_file: Path | None = None, **overrides: Any) -> S:
        """Settings from flags (`overrides`; None means not given), env and the YAML file."""
        if config_file is not None and not config_file.is_file():
            raise FileNotFoundError(f"config file not found: {config_file.name}")
        token = _config_file.set(config_file)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        finally:
            _config_file.reset(token)


def render_tables(classes: tuple[tuple[type[BaseModel], str], ...]) -> str:
    """One Markdown table per settings class: field, default, description."""

    def default(field: Any) -> str:
        if field.default_factory is not None:
            factory = field.default_factory
            if isinstance(factory, type) and issubclass(factory, BaseModel):
                return "(see below)"
            return "`{}`" if factory is dict else "(computed)"
        value = field.default
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return str(value).lower()
        return f"`{value}`"

    lines: list[str] = []
    for cls, prefix in classes:
        lines += [f"### {cls.__name__}", "", "| field | default | meaning |", "| --- | --- | --- |"]
        for name, field in cls.model_fields.items():
            lines.append(f"| `{prefix}{name}` | {default(field)} | {field.description} |")
        lines.append("")
    return "\n".join(lines)
