"""Variant builds, asked of the shared runner: the effect behind `Effects.build_variants`.

The runner quantizes a model into the forms asked for and checks each against
the model's variant guard (runners/variant_builds.py); this sends the request,
waits for the answer, logs each form's outcome and returns the reports. A
build cut short (runner lost, agent closing) reports every form unusable with
the reason, so the owner never waits on it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from edgeplex.agent.catalog.forms import VariantReport
from edgeplex.agent.observability.metrics import METRICS
from edgeplex.agent.oip.errors import RunnerLost, ServeError
from edgeplex.agent.residency.state import SHARED_RUNNER, ModelRecord
from edgeplex.agent.runners import ipc
from edgeplex.agent.runners.supervisor import RunnerPool

if TYPE_CHECKING:  # the top of the agent: for annotations only, never at run time
    from edgeplex.agent.config import AgentSettings

log = logging.getLogger("edgeplex.agent.residency")


async def build_variants(
    pool: RunnerPool, settings: AgentSettings, record: ModelRecord, forms: list[str]
) -> list[VariantReport]:
    config = record.config
    message = ipc.BuildVariants(
        pool.next_req_id(),
        str(record.key),
        str(record.source.path),
        record.source.digest,  # the runner hashes the file when the scan did not
        str(settings.variant_dir or settings.model_repo / ".variants"),
        forms,
        config.calibration.model_dump(),
        config.variant_guard.model_dump(),
    )
    reports: list[VariantReport] = []
    started = time.perf_counter()
    try:
        runner = pool.get(SHARED_RUNNER)
        await runner.ensure_ready()
        reply, _ = await runner.call(message)
        if isinstance(reply, ipc.VariantsBuilt):
            reports = [VariantReport.model_validate(r) for r in reply.reports]
        else:
            reason = getattr(reply, "message", "failed")
            reports = [VariantReport(form=f, reason=reason) for f in forms]
    except (RunnerLost, ServeError) as exc:
        reports = [VariantReport(form=f, reason=f"build interrupted: {exc}") for f in forms]
    METRICS.variant_build_duration.observe(time.perf_counter() - started)
    for report in reports:
        log.log(
            logging.INFO if report.usable else logging.WARNING,
            "model %s: variant %s %s%s",
            record.key,
            report.form,
            "usable" if report.usable else "kept out: ",
            report.reason,
        )
    return reports
