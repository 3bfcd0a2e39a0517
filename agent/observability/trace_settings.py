"""Triton's trace extension: which requests become spans, read and changed while the
agent runs (HTTP `/v2[/models/<m>]/trace/setting`, gRPC `TraceSetting`).

edgeplex traces as Triton's OpenTelemetry mode does (`trace_mode` reads
"opentelemetry"): a traced request is one SERVER span, exported over OTLP to the
agent's `otlp_endpoint` (tracing.py); there is no trace file. The settings, for
the agent and for each model that sets its own:

- `trace_level`: ["OFF"], or ["TIMESTAMPS"] (each span's start and end). TENSORS
  is refused: a span carries no tensors.
- `trace_rate`: one trace is started here for every `trace_rate` requests.
- `trace_count`: how many traces are still to be started (-1: no limit); it counts
  down, and at 0 no more start until it is set again.
- `log_frequency`: read back as set; spans leave in the exporter's batches.
- `trace_file`, `trace_mode`: "" and "opentelemetry", fixed.

A caller's sampled `traceparent` is followed, outside the rate and the count: the
request is its span's child wherever the level is not OFF. A trace started here
carries its decision on (the sampled flag of the traceparent a forward sends).
The level starts at TIMESTAMPS and the rate at 1 (every request) when
`otlp_endpoint` is set, and at OFF otherwise, where it stays: there is nowhere
to send spans. A model's setting given as null (an empty value over gRPC) goes
back to the agent's; the agent's goes back to its start.

Values are strings, as Triton's; every change is checked before any is applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeplex.agent.oip.errors import InvalidInput

LEVELS = ("OFF", "TIMESTAMPS")
FIXED = {"trace_file": "", "trace_mode": "opentelemetry"}


@dataclass
class Sampler:
    """The effective settings of one scope (the agent, or a model with its own), and
    the requests it has seen."""

    level: str
    rate: int
    count: int  # traces still to start; -1 no limit
    log_frequency: int
    seen: int = 0

    def start(self) -> bool:
        """Whether a request that brings no trace starts one here."""
        if self.level == "OFF" or self.count == 0:
            return False
        self.seen += 1
        if self.seen % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        return True

    def view(self) -> dict[str, Any]:
        return {
            "trace_level": [self.level],
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            **FIXED,
        }


class TraceSettings:
    def __init__(self, exporting: bool = False) -> None:
        self.exporting = exporting
        self._start = {
            "trace_level": "TIMESTAMPS" if exporting else "OFF",
            "trace_rate": 1,
            "trace_count": -1,
            "log_frequency": 0,
        }
        self._agent = dict(self._start)
        self._models: dict[str, dict[str, Any]] = {}  # what each model sets itself
        self._global = self._sampler(self._agent)
        self._samplers: dict[str, Sampler] = {}  # models with settings of their own

    def of(self, model: str) -> Sampler:
        """The sampler a request for `model` is traced by."""
        return self._samplers.get(model, self._global)

    def view(self, model: str | None = None) -> dict[str, Any]:
        """Every setting, as Triton lists them: the agent's, or those `model` runs by."""
        return (self.of(model) if model is not None else self._global).view()

    def update(self, changes: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """Apply `changes` to the agent's settings or to `model`'s (a value None goes
        back to the agent's, or to the start) and return every setting of that
        scope. InvalidInput names a setting that is unknown, fixed, or out of range."""
        parsed = {key: _parse(key, value, self.exporting) for key, value in changes.items()}
        if model is None:
            for key, value in parsed.items():
                if key not in FIXED:
                    self._agent[key] = self._start[key] if value is None else value
            self._global = self._sampler(self._agent)
            for name in self._samplers:  # those they do not set follow the agent's
                self._samplers[name] = self._sampler({**self._agent, **self._models[name]})
        else:
            own = self._models.setdefault(model, {})
            for key, value in parsed.items():
                if key in FIXED:
                    continue
                if value is None:
                    own.pop(key, None)
                else:
                    own[key] = value
            if own:
                self._samplers[model] = self._sampler({**self._agent, **own})
            else:
                self._models.pop(model)
                self._samplers.pop(model, None)
        return self.view(model)

    @staticmethod
    def _sampler(values: dict[str, Any]) -> Sampler:
        return Sampler(
            values["trace_level"],
            values["trace_rate"],
            values["trace_count"],
            values["log_frequency"],
        )


def _parse(key: str, value: Any, exporting: bool) -> Any:
    """One setting's value as given (a string, or a list of one, as Triton's clients
    send them; None to clear), checked."""
    if value is None or value == []:
        return None
    if isinstance(value, list):
        if len(value) != 1 or not isinstance(value[0], str):
            raise InvalidInput(f"trace settings: '{key}' takes one value")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidInput(f"trace settings: '{key}' must be a string")
    text = str(value).strip()
    if key in FIXED:
        if text != FIXED[key]:
            why = "a span goes to otlp_endpoint" if key == "trace_file" else "set at start"
            raise InvalidInput(f"trace settings: '{key}' is {FIXED[key]!r} ({why})")
        return text
    if key == "trace_level":
        level = text.upper()
        if level == "TENSORS":
            raise InvalidInput("trace settings: trace_level TENSORS is not supported (a span "
                               "carries no tensors): use TIMESTAMPS")  # fmt: skip
        if level not in LEVELS:
            raise InvalidInput(f"trace settings: trace_level must be one of {', '.join(LEVELS)}")
        if level != "OFF" and not exporting:
            raise InvalidInput(
                "trace settings: trace_level TIMESTAMPS needs the agent's otlp_endpoint "
                "(where spans go), which is not set"
            )
        return level
    least = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}.get(key)
    if least is None:
        raise InvalidInput(f"trace settings: no setting '{key}'")
    try:
        number = int(text)
    except ValueError:
        number = least - 1
    if not least <= number < 2**31:
        raise InvalidInput(f"trace settings: '{key}' must be an integer from {least}")
    return number
