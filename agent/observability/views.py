"""What the agent's status pages show: each model's state, memory by tier, and a
model's forms (the variant serving, each variant's guard figures)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from edgeplex.agent.batching.queues import Queues
from edgeplex.agent.batching.sequences import Sequences
from edgeplex.agent.catalog.forms import report_dict
from edgeplex.agent.residency.owner import Residency
from edgeplex.agent.residency.promotions import Promotions
from edgeplex.agent.residency.state import ModelRecord, Phase
from edgeplex.agent.runners.supervisor import RunnerPool

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.config import AgentSettings


def status(
    residency: Residency,
    queues: Queues,
    runners: RunnerPool,
    promotions: Promotions,
    sequences: Sequences,
) -> list[dict[str, Any]]:
    out = []
    for e in residency.records():
        # (a model that left keeps its queue, paused, for its next promotion)
        serving = e.phase in (Phase.READY, Phase.DRAINING, Phase.RECOVERING)
        queue = queues.get(e.key) if serving else None
        out.append(
            {
                "name": e.name,
                "version": e.version,
                "state": e.public_state(),
                "phase": str(e.phase),
                "intent": str(e.intent),
                "reason": e.reason,
                "runner": e.runner_id,
                "runner_pid": runners.pid_of(e.runner_id),
                "memory_bytes": e.device_bytes,
                "tier": str(e.tier),
                "staged_bytes": e.staged_bytes,
                "leases": e.leases,
                "waiting": len(e.waiters),
                "last_promotion": promotions.last.get(e.key, {}),
                "max_batch_size": e.max_batch_size,
                "instances": queue.instances if queue else 0,
                "prepacked": e.prepacked if e.phase == Phase.READY else None,
                "queue_depth": queue.depth if queue else 0,
                "isolation": e.config.isolation if e.source.config else None,
                "priority": e.config.priority if e.source.config else None,
                "pinned": e.pinned,
                "placed": e.placed,  # the fleet's desired state loads it here
                "hot": e.hot,
                "warnings": list(e.source.warnings),
            }
            | forms(e)
            | sequence_slots(e, sequences)
        )
    return out


def sequence_slots(record: ModelRecord, sequences: Sequences) -> dict[str, Any]:
    """A stateful model's sequences: those live (each holding a slot), the slots, and
    the STARTs waiting in the backlog for one."""
    spec = record.source.sequence
    if spec is None or record.source.config is None:
        return {}
    live, waiting = sequences.counts(record.name, record.version)
    slots = spec.slots(record.max_batch_size, record.config.instance_count)
    return {"sequences": {"live": live, "slots": slots, "waiting": waiting}}


def memory(settings: AgentSettings, residency: Residency, runners: RunnerPool) -> dict[str, Any]:
    s = settings
    return {
        "policy": s.eviction_policy,
        "runner_memory_limits": runners.limiter.mechanism,
        "sandbox": runners.sandbox_status(),
        "pending_loads": residency.ledger.pending_loads(),
        "tiers": {
            "loaded": {
                "bytes": residency.device_bytes(),
                "budget": s.device_memory_budget,
            },
            "staged": {
                "bytes": residency.ledger.host_bytes(),
                "budget": s.host_memory_budget,
            },
            "cached": {
                "bytes": disk_bytes(residency.records()),
                "budget": s.disk_cache_budget,
            },
        },
    }


def disk_bytes(records: list[ModelRecord]) -> int:
    """What the models' files take on disk (the cached tier)."""
    total = 0
    for record in records:
        with contextlib.suppress(OSError):
            total += record.source.path.stat().st_size
    return total


def forms(record: ModelRecord) -> dict[str, Any]:
    """The form serving now, and each built variant's guard figures (or why it is kept
    out); empty for a model without variants."""
    if not record.variants:
        return {}
    return {
        "form": record.form or "original",
        "quality": record.config.quality,
        "staged_variant_bytes": record.staged_variant_bytes,
        "measured_bytes": {f or "original": min(m) for f, m in record.measured.items() if m},
        "variants": {form: report_dict(v) for form, v in record.variants.items()},
    }
