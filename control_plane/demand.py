"""Demand: the region x model matrix placement optimises, from agents' load reports.

Pure functions. Each report carries, per model, the request rate by origin
region over the agent's last interval; the fleet's current demand is the sum
over live sites, and the matrix placement reads is its exponentially weighted
moving average, so one noisy interval does not move models around.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable

from edgeplex.names import valid_name
from edgeplex.proto import edgeplex_control_pb2 as pb

Demand = dict[tuple[str, str], float]  # (origin region, model) -> requests/s

# A first call at a site that holds a model nowhere (AgentService.LookupModel)
# stands for this much demand from its region until reports carry the real
# rate (`hint_ttl_s`): enough for placement to keep the model where it is
# being loaded.
HINT_RATE = 1.0


def hint_ttl_s(report_interval_s: float, placement_interval_s: float) -> float:
    """How long a hint stands: a few reports, and a round to act on them."""
    return 3 * report_interval_s + placement_interval_s


MAX_MODELS_PER_REPORT = 10_000


def report_problem(report: pb.LoadReport) -> str:
    """What makes a load report unusable ("" when nothing does): names that are not
    names, and rates, latencies or utilisations that are not finite and non-negative
    (an `inf` would stick in the demand average for good)."""
    if len(report.models) > MAX_MODELS_PER_REPORT:
        return f"models: {len(report.models)} entries, at most {MAX_MODELS_PER_REPORT}"
    for model in report.models:
        if not valid_name(model.name):
            return f"models: {model.name[:64]!r} is not a model name"
        for region, rate in model.rate_by_region.items():
            if not valid_name(region):
                return f"models[{model.name}].rate_by_region: {region[:64]!r} is not a region"
            if not (math.isfinite(rate) and rate >= 0):
                return f"models[{model.name}].rate_by_region[{region}]: {rate} is not a rate"
        for what, value in (("p50_ms", model.p50_ms), ("p99_ms", model.p99_ms)):
            if not (math.isfinite(value) and value >= 0):
                return f"models[{model.name}].{what}: {value} is not a latency"
    for device in report.devices:
        if not (math.isfinite(device.utilization) and 0 <= device.utilization <= 1.5):
            return f"devices[{device.index}].utilization: {device.utilization} is not a share"
    return ""


def current_demand(
    reports: Iterable[pb.LoadReport], known: Container[str] | None = None
) -> tuple[Demand, float]:
    """The fleet's demand now from `reports`, counting only models in `known` (the
    catalog); returns it and the rate of requests for models it does not know, which
    is counted apart (one number, whatever the names)."""
    out: Demand = {}
    unknown = 0.0
    for report in reports:
        for model in report.models:
            for region, rate in model.rate_by_region.items():
                if not (rate > 0 and math.isfinite(rate)):
                    continue
                if known is not None and model.name not in known:
                    unknown += rate
                    continue
                key = (region, model.name)
                out[key] = out.get(key, 0.0) + rate
    return out, unknown


def ewma(previous: Demand, now: Demand, dt_s: float, half_life_s: float) -> Demand:
    """Blend `now` into `previous` with weight 1 - 0.5**(dt/half_life). Entries that
    decay below 1e-3 requests/s are dropped."""
    if not previous:
        return dict(now)
    alpha = 1.0 - math.pow(0.5, max(dt_s, 0.0) / half_life_s)
    out: Demand = {}
    for key in previous.keys() | now.keys():
        value = (1 - alpha) * previous.get(key, 0.0) + alpha * now.get(key, 0.0)
        if value >= 1e-3:
            out[key] = value
    return out


def with_hints(demand: Demand, hints: Iterable[tuple[str, str, str]]) -> Demand:
    """`demand` with each hinted (site, region, model) at least HINT_RATE."""
    out = dict(demand)
    for _site, region, model in hints:
        out[(region, model)] = max(out.get((region, model), 0.0), HINT_RATE)
    return out


def compute_per_request(reports: Iterable[pb.LoadReport]) -> dict[str, float]:
    """Milliseconds of a site's busy time one request of each model takes.

    A site reports its device's busy share and, per model, its rate and p50
    latency; the busy share is split between models in proportion to rate x
    p50, so a model's compute is busy_share x p50 / sum(rate x p50). Averaged
    over sites, weighted by rate. Placement sizes replicas from it against a
    site capacity of 1.0 (a fully busy device).
    """
    sums: dict[str, list[float]] = {}  # name -> [rate-weighted compute, rate]
    for report in reports:
        busy = max((d.utilization for d in report.devices), default=0.0)
        work = [(m, sum(m.rate_by_region.values())) for m in report.models]
        total = sum(rate * m.p50_ms for m, rate in work)
        if busy <= 0 or total <= 0:
            continue
        for m, rate in work:
            if rate > 0 and m.p50_ms > 0:
                acc = sums.setdefault(m.name, [0.0, 0.0])
                acc[0] += rate * 1000.0 * busy * m.p50_ms / total
                acc[1] += rate
    return {name: weighted / rate for name, (weighted, rate) in sums.items()}
