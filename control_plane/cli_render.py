"""Plain-text views of the admin API's replies (`edgeplex admin` without --json)."""

from __future__ import annotations

import time
from typing import Any

from google.protobuf.json_format import MessageToJson


def render(reply: Any) -> str:
    """Plain-text views of the replies; --json gives every field."""
    kind = type(reply).__name__
    if kind == "ListModelsResponse":
        rows: list[tuple[str, ...]] = [
            ("NAME", "STATE", "BYTES", "SLO_MS", "MIN", "REGIONS", "REASON")
        ]
        for m in reply.models:
            rows.append(
                (
                    m.name,
                    m.state,
                    str(m.size_bytes),
                    f"{m.slo_ms:g}",
                    str(m.min_replicas),
                    ",".join(m.regions) or "*",
                    m.reason,
                )
            )
        return table(rows)
    if kind == "ListSitesResponse":
        rows = [("SITE", "REGION", "ADDRESS", "UP", "FLAGS", "LOADED")]
        for s in reply.sites:
            flags = ",".join(
                f for f, on in (("cordoned", s.cordoned), ("draining", s.draining)) if on
            )
            rows.append(
                (
                    s.site_id,
                    s.region,
                    s.address,
                    "yes" if s.up else "no",
                    flags or "-",
                    " ".join(s.loaded),
                )
            )
        return table(rows)
    if kind == "ListTenantsResponse":
        rows = [("TENANT", "RATE/S", "BURST", "CONCURRENCY", "WEIGHT", "MODELS", "KEYS")]
        for t in reply.tenants:
            rows.append(
                (
                    t.name,
                    f"{t.rate:g}" if t.HasField("rate") else "-",
                    str(t.burst) if t.HasField("burst") else "-",
                    str(t.concurrency) if t.HasField("concurrency") else "-",
                    f"{t.weight:g}",
                    ",".join(t.models) or "*",
                    str(len(t.keys)),
                )
            )
        return table(rows)
    if kind == "UsageTable":
        rows = [("TENANT", "KEY", "REQUESTS", "FAILURES", "BYTES_IN", "BYTES_OUT", "COMPUTE_S",
                 "COLD", "DEVICE_GB_S")]  # fmt: skip
        for u in reply.rows:
            rows.append(
                (u.tenant, u.key, str(u.requests), str(u.failures), str(u.bytes_in),
                 str(u.bytes_out), f"{u.compute_s:.3f}", str(u.cold_starts),
                 f"{u.device_byte_seconds / 1e9:.3f}")
            )  # fmt: skip
        return table(rows)
    if kind == "Placement":
        lines = [
            f"version {reply.version}  leader {reply.leader}  served within SLO "
            f"{reply.served_fraction:.1%}  objective {reply.objective:.4g}"
        ]
        for sp in reply.sites:
            lines.append(
                f"{sp.site_id}: loaded [{' '.join(sp.loaded)}] staged [{' '.join(sp.staged)}]"
            )
        return "\n".join(lines)
    if kind == "ListBatchesResponse":
        rows = [("JOB", "MODEL", "STATE", "ITEMS", "SHARDS DONE", "FAILED", "CREATED")]
        for j in reply.jobs:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.created_at))
            done = f"{j.shards_done}/{j.shards}" if j.state == "RUNNING" else str(j.shards)
            rows.append(
                (j.job_id, j.model, j.state, str(j.items), done, str(j.items_failed), created)
            )
        return table(rows)
    if kind == "BatchJob":
        lines = [
            f"{reply.job_id}: {reply.state}, model {reply.model}, {reply.items} items, "
            f"{reply.shards_done}/{reply.shards} shards done, {reply.items_failed} failed"
        ]
        for shard in reply.shard_states:
            lines.append(
                f"  shard {shard.index}: {shard.state} {shard.site_id} (attempts {shard.attempts})"
            )
        return "\n".join(lines)
    if kind == "PlacementExplanation":
        return "\n".join(reply.lines)
    if kind == "ModelDetail":
        m = reply.model
        lines = [
            f"{m.name} v{m.version}: {m.state}" + (f" ({m.reason})" if m.reason else ""),
            f"  artifact {m.artifact_uri}",
            f"  sha256 {m.sha256}",
            f"  bytes {m.size_bytes}",
            f"  slo {m.slo_ms:g} ms, min replicas {m.min_replicas}, priority {m.priority}, "
            f"pin {str(m.pin).lower()}, regions {','.join(m.regions) or '*'}",
        ]
        if m.variants:
            lines.append(f"  variants {','.join(m.variants)}, quality {m.quality or 'exact'}")
        for s in reply.sites:
            lines.append(
                f"  {s.site_id}: {s.tier} {s.state} {s.rate:.3g} req/s"
                + (f" as {s.variant}" if s.variant else "")
                + (f" ({s.reason})" if s.reason else "")
            )
            for form, guard in sorted(s.variant_guard.items()):
                lines.append(f"    {form}: {guard}")
        return "\n".join(lines)
    return MessageToJson(reply, preserving_proto_field_name=True)


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def wait_for_batch(job: Any, poll: Any, every_s: float = 0.5) -> Any:
    """A progress bar over the job's shards (on stderr) until it ends; returns the
    job as it ended."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True, console=Console(stderr=True)) as progress:
        bar = progress.add_task(f"{job.job_id} shards", total=job.shards)
        while job.state == "RUNNING":
            time.sleep(every_s)
            job = poll()
            progress.update(bar, completed=job.shards_done)
    return job
