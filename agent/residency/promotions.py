"""What each promotion reports: the status's `last_promotion` of every model and
the promotion metrics.

Under over-commit a promotion happens hundreds of times a second, so the
metric children each promotion updates are looked up once per label value
and kept, rather than found again through the metrics' label locks.
"""

from __future__ import annotations

import logging
from typing import Any

from edgeplex.agent.catalog.forms import ORIGINAL
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.residency.state import ModelKey, ModelRecord
from edgeplex.agent.runners import ipc

log = logging.getLogger("edgeplex.agent.residency")


class Promotions:
    def __init__(self, provider: str) -> None:
        self._provider = provider  # the one the runners were asked for
        self.last: dict[ModelKey, dict[str, object]] = {}
        self._children: dict[tuple[str, str], Any] = {}

    def record(self, record: ModelRecord, reply: ipc.ModelLoaded, form: str) -> None:
        """A load finished: remember how, and count it."""
        self.last[record.key] = {
            "source": reply.source,
            "stages_ms": {k: round(v, 3) for k, v in reply.stages.items()},
            "load_ms": round(reply.load_ms, 3),
            "form": form or "original",
            "provider": reply.provider,
            "session": "shared" if reply.shared else "own",
        }
        fallback = reply.provider != self._provider
        if fallback:
            log.warning("model %s runs on the CPU: CUDA cannot run it here", record.key)
        self._child("cpu_fallback", record.name).set(int(fallback))
        self._child("promotions", reply.source).inc()
        self._child("promotion_duration", reply.source).observe(reply.load_ms / 1000)
        for stage, ms in reply.stages.items():
            self._child("promotion_stage_duration", stage).observe(ms / 1000)
        self._child("model_memory", record.name).set(reply.bytes)
        if record.variants:
            for each in (ORIGINAL, *record.variants):
                held = reply.bytes if each == form else 0
                METRICS.variant_bytes.labels(model=record.name, variant=each or "original").set(
                    held
                )

    def _child(self, metric: str, value: str) -> Any:
        """The child of a metric with one label, for `value` (kept once found)."""
        child = self._children.get((metric, value))
        if child is None:
            child = self._children[metric, value] = getattr(METRICS, metric).labels(value)
        return child
