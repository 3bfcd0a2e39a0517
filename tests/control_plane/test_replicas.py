"""Throughput-aware placement: replicas of hot models, sites' throughput as a limit."""

from __future__ import annotations

from edgeplex.control_plane.demand import compute_per_request
from edgeplex.control_plane.placement import GiB, ModelSpec, PlacementInput, SiteInfo, place
from edgeplex.control_plane.replicas import replicas_wanted
from edgeplex.proto import edgeplex_control_pb2 as pb


def region_of(n: int, capacity: float = 1.0, gib: int = 8) -> tuple[SiteInfo, ...]:
    return tuple(SiteInfo(f"a{i}", "a", gib * GiB, capacity=capacity) for i in range(n))


def holders(result_loaded: dict[str, list[str]], model: str) -> set[str]:
    return {site for site, held in result_loaded.items() if model in held}


def test_the_band_scales_up_at_the_target_and_down_under_the_floor():
    # Load in site-capacities: each replica stays under 0.8 ...
    assert replicas_wanted(0.5, 1.0, 0, 0.8, 0.4) == 1
    assert replicas_wanted(3.0, 1.0, 1, 0.8, 0.4) == 4
    # ... replicas stay while they average at least 0.4 ...
    assert replicas_wanted(2.0, 1.0, 4, 0.8, 0.4) == 4
    # ... and go when they would not, down to what the target needs.
    assert replicas_wanted(1.5, 1.0, 4, 0.8, 0.4) == 2
    assert replicas_wanted(0.0, 1.0, 4, 0.8, 0.4) == 0
    assert replicas_wanted(3.0, 0.0, 1, 0.8, 0.4) == 0  # capacity unknown: memory decides


def test_replicas_scale_up_and_back_down_on_a_load_step():
    """10 ms per request on sites serving 1.0 compute-seconds/s: 50 req/s needs one
    site, 300 req/s four; a dip to 200 req/s keeps four (the band), 50 drops to one,
    the one that held it all along."""
    hot = ModelSpec("hot", 1 * GiB, compute_ms=10.0)
    cold = tuple(ModelSpec(f"c{i}", 1 * GiB, compute_ms=1.0) for i in range(3))
    current: dict[str, frozenset[str]] = {}
    counts = []
    first_holder: set[str] = set()
    for rate in (50.0, 300.0, 300.0, 200.0, 50.0, 50.0):
        demand = {("a", "hot"): rate, **{("a", m.name): 1.0 for m in cold}}
        result = place(
            PlacementInput(
                sites=region_of(6),
                models=(hot, *cold),
                demand=demand,
                latency_ms={},
                current=current,
            )
        )
        held = holders(result.loaded, "hot")
        first_holder = first_holder or held
        counts.append(len(held))
        assert all(holders(result.loaded, m.name) for m in cold)  # the rest stay placed
        current = {site: frozenset(names) for site, names in result.loaded.items()}
    assert counts == [1, 4, 4, 4, 1, 1]
    assert held == first_holder  # scaled down to where it was, moving nothing else


def test_a_replica_goes_where_it_would_not_overload_a_site():
    """Two models of 0.6 site-capacities each: one site could hold both in memory
    (and has the most room), but not serve both, so they go to different sites."""
    sites = (
        SiteInfo("a1", "a", 16 * GiB, capacity=1.0),
        SiteInfo("a2", "a", 4 * GiB, capacity=1.0),
    )
    models = (ModelSpec("x", GiB, compute_ms=6.0), ModelSpec("y", GiB, compute_ms=6.0))
    result = place(
        PlacementInput(
            sites=sites,
            models=models,
            demand={("a", "x"): 100.0, ("a", "y"): 100.0},
            latency_ms={},
        )
    )
    assert holders(result.loaded, "x") and holders(result.loaded, "y")
    assert holders(result.loaded, "x") != holders(result.loaded, "y")
    # Without throughput figures, memory alone decides: both at the roomiest site.
    blind = place(
        PlacementInput(
            sites=tuple(SiteInfo(s.site_id, s.region, s.device_bytes) for s in sites),
            models=tuple(ModelSpec(m.name, m.size_bytes) for m in models),
            demand={("a", "x"): 100.0, ("a", "y"): 100.0},
            latency_ms={},
        )
    )
    assert blind.loaded["a1"] == ["x", "y"]


def test_compute_per_request_splits_a_sites_busy_time_by_rate_and_latency():
    report = pb.LoadReport(
        site_id="a1",
        models=[
            pb.ModelLoad(name="x", rate_by_region={"a": 100.0}, p50_ms=4.0),
            pb.ModelLoad(name="y", rate_by_region={"a": 20.0, "b": 30.0}, p50_ms=8.0),
        ],
        devices=[pb.DeviceLoad(utilization=0.8)],
    )
    compute = compute_per_request([report])
    # busy 0.8 over rate x p50 = 400 + 400: each model half, i.e. 0.4 s/s.
    assert abs(compute["x"] - 1000 * 0.4 / 100) < 1e-9
    assert abs(compute["y"] - 1000 * 0.4 / 50) < 1e-9
    idle = pb.LoadReport(site_id="a2", models=report.models, devices=[pb.DeviceLoad()])
    assert compute_per_request([idle]) == {}
