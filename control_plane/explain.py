"""Why a model is, or is not, at each site: `edgeplex admin placement explain MODEL`.

A pure function of the same input and result that placement used.
"""

from __future__ import annotations

from edgeplex.control_plane.demand import Demand
from edgeplex.control_plane.placement import PlacementInput, PlacementResult, latency


def explain(
    inp: PlacementInput,
    result: PlacementResult,
    model: str,
    observed: Demand | None = None,
    forecast: Demand | None = None,
) -> list[str]:
    spec = next((m for m in inp.models if m.name == model), None)
    if spec is None:
        return [f"{model}: not in the catalog, or not READY (only verified models are placed)"]
    demand = {r: rate for (r, m), rate in inp.demand.items() if m == model and rate > 0}
    total = sum(demand.values())
    holders = [s for s in inp.sites if model in result.loaded.get(s.site_id, ())]
    lines = [
        f"{model}: {spec.size_bytes} bytes, slo {spec.slo_ms:g} ms, min replicas "
        f"{spec.min_replicas}, demand {total:.3g} req/s"
        + (
            " (" + ", ".join(f"{r} {v:.3g}" for r, v in sorted(demand.items())) + ")"
            if demand
            else ""
        ),
        f"loaded at {len(holders)} site(s)",
    ]
    if observed is not None or forecast is not None:
        regions = sorted({r for r, m in (observed or {}) | (forecast or {}) if m == model})
        for r in regions:
            seen = (observed or {}).get((r, model), 0.0)
            ahead = (forecast or {}).get((r, model), 0.0)
            lines.append(f"demand from {r}: observed {seen:.3g} req/s, forecast {ahead:.3g} req/s")
    held_regions = {s.region for s in holders}
    sizes = {m.name: m.size_bytes for m in inp.models}
    for site in inp.sites:
        sid = site.site_id
        used = sum(sizes.get(name, 0) for name in result.loaded.get(sid, ()))
        if model in result.loaded.get(sid, ()):
            why = "pinned everywhere" if spec.pin else "loaded"
            if demand.get(site.region):
                why += f": serves {demand[site.region]:.3g} req/s from its own region"
            elif spec.min_replicas:
                why += ": keeps the minimum replica count"
        elif not site.up:
            why = "not placed: the site is down"
        elif site.draining:
            why = "not placed: the site is draining"
        elif spec.regions and site.region not in spec.regions:
            allowed = ", ".join(sorted(spec.regions))
            why = f"not placed: region {site.region} is not allowed ({allowed})"
        elif site.cordoned:
            why = "not placed: the site is cordoned (keeps only what it had)"
        elif spec.size_bytes > site.device_bytes:
            why = f"not placed: larger than the site's device budget ({site.device_bytes} bytes)"
        elif site.region in held_regions:
            why = f"not placed: another site in {site.region} holds it"
        elif not any(latency(inp, r, site.region) < spec.slo_ms for r in demand):
            why = "not placed: no demand within its SLO of this site"
        else:
            why = (
                f"not placed: device budget used by models worth more per byte "
                f"({used} of {site.device_bytes} bytes)"
            )
        if model in result.staged.get(sid, ()):
            why += "; staged in host RAM"
        lines.append(f"{sid} ({site.region}): {why}")
    return lines
