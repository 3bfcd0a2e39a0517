"""Placement's staged tier: the models each site keeps pre-optimized in host RAM.

Called only by `placement.place`, with the placed sets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgeplex.control_plane.placement import SiteInfo
    from edgeplex.control_plane.placement import _Problem as Problem


def staged_models(p: Problem, sites: list[SiteInfo], holds: list[set[int]]) -> dict[str, list[str]]:
    """Models a site should keep pre-optimized in host RAM: the next best for its
    region that it does not load, so a shift in demand promotes from RAM."""
    staged: dict[str, list[str]] = {}
    order_by_region: dict[int, np.ndarray] = {}
    names = np.array([m.name for m in p.models], dtype=object)
    for i, s in enumerate(sites):
        staged[s.site_id] = []
        if not s.up or s.draining or s.cordoned:
            continue
        r = p.region_ix[s.region]
        if r not in order_by_region:
            density = np.einsum("rm,rm->m", p.value, p.w[:, r, :]) / p.size
            order = np.argsort(-density, kind="stable")
            order = order[p.allowed[r, order] & (density[order] > 0)]
            order_by_region[r] = order[:4096]
        budget = float(s.host_bytes) if s.host_bytes else 2.0 * s.device_bytes
        order = order_by_region[r][: len(holds[i]) + 512]
        order = order[~np.isin(order, list(holds[i]))]
        take = order[np.cumsum(p.size[order]) <= budget]
        staged[s.site_id] = sorted(names[take].tolist())
    return staged
