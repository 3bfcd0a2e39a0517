"""Placement's staged tier: the models each site keeps pre-optimized in host RAM.

Called only by `placement.place`, with the placed sets.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgeplex.control_plane.placement import SiteInfo
    from edgeplex.control_plane.placement import _Problem as Problem


STAGED_KEEP = 1.5  # a staged model gives way only to one this many times denser


def staged_models(
    p: Problem,
    sites: list[SiteInfo],
    holds: list[set[int]],
    current: Mapping[str, Collection[str]] | None = None,
) -> dict[str, list[str]]:
    """Models a site should keep pre-optimized in host RAM: the next best for its
    region that it does not load, so a shift in demand promotes from RAM.

    What a site has staged counts STAGED_KEEP times its density: staging costs a
    download and an optimisation pass, and without this the tail of the ranking
    (hundreds of models with near-equal demand) reshuffled a few hundred staged
    models at every site every round as the demand estimate moved."""
    staged: dict[str, list[str]] = {}
    by_region: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    names = np.array([m.name for m in p.models], dtype=object)
    name_rank = np.empty(len(names), dtype=np.int64)  # each model's place in name order
    name_rank[np.argsort(names, kind="stable")] = np.arange(len(names))
    current = current or {}
    n_m = len(names)
    for i, s in enumerate(sites):
        staged[s.site_id] = []
        if not s.up or s.draining or s.cordoned:
            continue
        r = p.region_ix[s.region]
        if r not in by_region:
            density = np.einsum("rm,rm->m", p.value, p.w[:, r, :]) / p.size
            density[~p.allowed[r]] = 0.0
            order = np.argsort(-density, kind="stable")
            by_region[r] = order[density[order] > 0][:4096], density
        ranked, density = by_region[r]
        candidate = np.zeros(n_m, dtype=bool)
        candidate[ranked[: len(holds[i]) + 512]] = True
        score = density
        kept = _indices(p.model_ix, current.get(s.site_id, ()))
        if len(kept):
            kept = kept[density[kept] > 0]
            candidate[kept] = True
            score = density.copy()
            score[kept] *= STAGED_KEEP
        if holds[i]:
            candidate[np.fromiter(holds[i], dtype=np.int64, count=len(holds[i]))] = False
        found = np.flatnonzero(candidate)
        order = found[np.argsort(-score[found], kind="stable")]
        take = order[np.cumsum(p.size[order]) <= budget_of(s)]
        staged[s.site_id] = names[take[np.argsort(name_rank[take])]].tolist()
    return staged


def budget_of(site: SiteInfo) -> float:
    """Host bytes a site stages into: its reported host budget, else twice its device's."""
    return float(site.host_bytes) if site.host_bytes else 2.0 * site.device_bytes


def _indices(index: dict[str, int], names: Collection[str]) -> np.ndarray:
    """The model indices of `names`, those not in the catalog left out."""
    if not names:
        return np.empty(0, dtype=np.int64)
    try:
        found = operator.itemgetter(*names)(index)  # one C loop: a thousand sites of 700
    except KeyError:
        found = [index[n] for n in names if n in index]
    return np.array(found if isinstance(found, tuple | list) else [found], dtype=np.int64)
