"""The placement engine: a pure function, tested without processes or sockets."""

from __future__ import annotations

import itertools
import random

import pytest

from edgeplex.control_plane.demand import current_demand, ewma, report_problem
from edgeplex.control_plane.explain import explain
from edgeplex.control_plane.placement import (
    GiB,
    ModelSpec,
    PlacementInput,
    SiteInfo,
    evaluate,
    place,
)
from edgeplex.proto import edgeplex_control_pb2 as pb

LAT = {("a", "b"): 30.0, ("b", "c"): 30.0, ("a", "c"): 80.0}


def sites(*specs: tuple[str, str, int]) -> tuple[SiteInfo, ...]:
    return tuple(SiteInfo(sid, region, cap * GiB) for sid, region, cap in specs)


def models(n: int, size_gib: float = 1.0, **kw) -> tuple[ModelSpec, ...]:
    return tuple(ModelSpec(f"m{i}", int(size_gib * GiB), **kw) for i in range(n))


def test_demand_is_served_in_its_own_region():
    inp = PlacementInput(
        sites=sites(("a1", "a", 2), ("b1", "b", 2)),
        models=models(3, slo_ms=100),
        demand={("a", "m0"): 10.0, ("b", "m1"): 5.0},
        latency_ms=LAT,
    )
    result = place(inp)
    assert "m0" in result.loaded["a1"] and "m1" in result.loaded["b1"]
    assert "m2" not in result.loaded["a1"] + result.loaded["b1"]  # no demand, no placement
    assert result.served_fraction == 1.0


def test_capacity_is_never_exceeded_and_the_most_valuable_models_win():
    inp = PlacementInput(
        sites=sites(("a1", "a", 3)),
        models=models(10),
        demand={("a", f"m{i}"): float(10 - i) for i in range(10)},
        latency_ms={},
    )
    result = place(inp)
    assert sorted(result.loaded["a1"]) == ["m0", "m1", "m2"]


def test_nearest_region_serves_when_the_own_region_is_full():
    inp = PlacementInput(
        sites=sites(("a1", "a", 1), ("b1", "b", 2), ("c1", "c", 2)),
        models=models(2, slo_ms=100),
        demand={("a", "m0"): 10.0, ("a", "m1"): 9.0},
        latency_ms=LAT,
    )
    result = place(inp)
    assert result.loaded["a1"] == ["m0"]
    assert "m1" in result.loaded["b1"]  # 30 ms away beats 80 ms away
    assert "m1" not in result.loaded["c1"]


def test_beyond_the_slo_a_remote_region_does_not_count():
    inp = PlacementInput(
        sites=sites(("a1", "a", 1), ("c1", "c", 2)),
        models=models(2, slo_ms=50),  # a <-> c is 80 ms
        demand={("a", "m0"): 10.0, ("a", "m1"): 9.0},
        latency_ms=LAT,
    )
    result = place(inp)
    assert result.loaded["c1"] == []
    assert result.served_fraction == pytest.approx(10 / 19)


def test_down_draining_and_cordoned_sites():
    base = sites(("a1", "a", 4), ("a2", "a", 4), ("a3", "a", 4))
    inp = PlacementInput(
        sites=(
            base[0],
            SiteInfo("a2", "a", 4 * GiB, up=False),
            SiteInfo("a3", "a", 4 * GiB, cordoned=True),
        ),
        models=models(6),
        demand={("a", f"m{i}"): 1.0 for i in range(6)},
        latency_ms={},
        current={"a3": frozenset({"m5"}), "a2": frozenset({"m4"})},
        churn_cost=0.0,
    )
    result = place(inp)
    assert result.loaded["a2"] == []  # down
    assert result.loaded["a3"] == ["m5"]  # cordoned: keeps what it had, nothing new
    assert len(result.loaded["a1"]) == 4
    drained = PlacementInput(
        sites=(SiteInfo("a1", "a", 4 * GiB, draining=True),),
        models=models(2),
        demand={("a", "m0"): 1.0},
        latency_ms={},
        current={"a1": frozenset({"m0"})},
    )
    assert place(drained).loaded["a1"] == []


def test_min_replicas_allowed_regions_and_pins():
    inp = PlacementInput(
        sites=sites(("a1", "a", 4), ("b1", "b", 4), ("c1", "c", 4)),
        models=(
            ModelSpec("replicated", GiB, min_replicas=3),
            ModelSpec("eu_only", GiB, regions=frozenset({"b"})),
            ModelSpec("vad", GiB // 8, pin=True),
        ),
        demand={("a", "eu_only"): 100.0},
        latency_ms=LAT,
    )
    result = place(inp)
    for sid in ("a1", "b1", "c1"):
        assert "replicated" in result.loaded[sid]
        assert "vad" in result.loaded[sid]
    assert "eu_only" not in result.loaded["a1"] and "eu_only" in result.loaded["b1"]
    lines = explain(inp, result, "eu_only")
    assert any(line.startswith("a1 (a): not placed: region a is not allowed") for line in lines)


def test_churn_cost_keeps_a_placement_that_is_almost_as_good():
    inp = PlacementInput(
        sites=sites(("a1", "a", 1)),
        models=models(2),
        demand={("a", "m0"): 1.0, ("a", "m1"): 1.2},
        latency_ms={},
        current={"a1": frozenset({"m0"})},
        churn_cost=1.0,
    )
    assert place(inp).loaded["a1"] == ["m0"]  # gaining 0.2 req/s does not pay for 1 GiB
    shifted = PlacementInput(**{**inp.__dict__, "demand": {("a", "m0"): 1.0, ("a", "m1"): 5.0}})
    assert place(shifted).loaded["a1"] == ["m1"]


def test_a_staged_model_gives_way_only_to_one_clearly_worth_more():
    """The staged tier's tail (many models of near-equal demand) does not reshuffle
    as the demand estimate wobbles: each change would be a download at the site."""
    rng = random.Random(11)
    base = {("a", f"m{j}"): 1.0 + rng.random() * 0.01 for j in range(30)}
    inp = PlacementInput(
        sites=(SiteInfo("a1", "a", 2 * GiB, host_bytes=10 * GiB),),
        models=models(30),
        demand=base,
        latency_ms={},
    )
    first = place(inp)
    assert len(first.staged["a1"]) == 10
    wobbled = {k: v * (1 + rng.uniform(-0.1, 0.1)) for k, v in base.items()}
    staged = {"a1": frozenset(first.staged["a1"])}
    again = PlacementInput(**{**inp.__dict__, "demand": wobbled, "current_staged": staged})
    assert place(again).staged["a1"] == first.staged["a1"]
    fresh = place(PlacementInput(**{**inp.__dict__, "demand": wobbled}))
    assert fresh.staged["a1"] != first.staged["a1"]  # without what is staged, it reshuffles
    outsider = next(f"m{j}" for j in range(30) if f"m{j}" not in first.staged["a1"]
                    and f"m{j}" not in first.loaded["a1"])  # fmt: skip
    surged = {**wobbled, ("a", outsider): 3.0}
    moved = place(PlacementInput(**{**inp.__dict__, "demand": surged, "current_staged": staged}))
    assert outsider in moved.staged["a1"] + moved.loaded["a1"]


def test_placement_is_deterministic_and_reports_its_objective():
    rng = random.Random(7)
    inp = PlacementInput(
        sites=tuple(SiteInfo(f"s{i}", "abc"[i % 3], rng.randint(2, 6) * GiB) for i in range(9)),
        models=tuple(ModelSpec(f"m{j}", rng.randint(1, 3) * GiB // 2) for j in range(40)),
        demand={(r, f"m{j}"): rng.random() * 10 for r in "abc" for j in range(40)},
        latency_ms=LAT,
    )
    first, second = place(inp), place(inp)
    assert first == second
    assert first.objective == pytest.approx(evaluate(inp, first.loaded))
    for s in inp.sites:
        used = sum(m.size_bytes for m in inp.models if m.name in first.loaded[s.site_id])
        assert used <= s.device_bytes
        assert not set(first.staged[s.site_id]) & set(first.loaded[s.site_id])


def test_greedy_is_close_to_exhaustive_search_on_tiny_instances():
    rng = random.Random(3)
    for _ in range(20):
        inp = PlacementInput(
            sites=(SiteInfo("a1", "a", 3 * GiB), SiteInfo("b1", "b", 2 * GiB)),
            models=tuple(ModelSpec(f"m{j}", rng.choice([1, 2]) * GiB) for j in range(5)),
            demand={(r, f"m{j}"): rng.random() for r in "ab" for j in range(5)},
            latency_ms={("a", "b"): 30.0},
            churn_cost=0.0,
        )
        best = 0.0
        names = [m.name for m in inp.models]
        for ka in range(4):
            for sa in itertools.combinations(names, ka):
                for kb in range(3):
                    for sb in itertools.combinations(names, kb):
                        loaded = {"a1": list(sa), "b1": list(sb)}
                        sizes = {m.name: m.size_bytes for m in inp.models}
                        if (
                            sum(sizes[n] for n in sa) > 3 * GiB
                            or sum(sizes[n] for n in sb) > 2 * GiB
                        ):
                            continue
                        best = max(best, evaluate(inp, loaded))
        assert place(inp).objective >= 0.95 * best


def test_demand_from_reports_and_its_ewma():
    report = pb.LoadReport(
        site_id="a1",
        models=[pb.ModelLoad(name="m0", rate_by_region={"a": 4.0, "b": 1.0})],
    )
    other = pb.LoadReport(site_id="a2", models=[pb.ModelLoad(name="m0", rate_by_region={"a": 2.0})])
    now, unknown = current_demand([report, other])
    assert now == {("a", "m0"): 6.0, ("b", "m0"): 1.0} and unknown == 0
    made_up = pb.LoadReport(models=[pb.ModelLoad(name="zz", rate_by_region={"a": 9.0})])
    assert current_demand([report, made_up], known={"m0"}) == (
        {("a", "m0"): 4.0, ("b", "m0"): 1.0},
        9.0,
    )
    blended = ewma({("a", "m0"): 0.0, ("c", "m1"): 1.0}, now, dt_s=10, half_life_s=10)
    assert blended[("a", "m0")] == pytest.approx(3.0)
    assert blended[("c", "m1")] == pytest.approx(0.5)


def test_reports_with_rates_that_are_not_rates_are_refused():
    def problem(**model: object) -> str:
        return report_problem(pb.LoadReport(models=[pb.ModelLoad(name="m0", **model)]))

    assert problem(rate_by_region={"a": 1.0}, p50_ms=2.0) == ""
    assert "is not a rate" in problem(rate_by_region={"a": float("inf")})
    assert "is not a rate" in problem(rate_by_region={"a": float("nan")})
    assert "is not a rate" in problem(rate_by_region={"a": -1.0})
    assert "is not a region" in problem(rate_by_region={"../a": 1.0})
    assert "is not a latency" in problem(p99_ms=float("inf"))
    bad_name = pb.LoadReport(models=[pb.ModelLoad(name="../m")])
    assert "is not a model name" in report_problem(bad_name)


def test_an_empty_fleet_or_catalog_places_nothing():
    """A control plane's first round often runs before any site has joined."""
    model = ModelSpec(name="m", size_bytes=GiB)
    site = SiteInfo(site_id="s", region="a", device_bytes=4 * GiB)
    for sites, models in (((), (model,)), ((site,), ()), ((), ())):
        inp = PlacementInput(sites=sites, models=models, demand={("a", "m"): 1.0}, latency_ms={})
        result = place(inp)
        assert all(not loaded for loaded in result.loaded.values())


def test_a_site_running_a_model_as_a_variant_counts_the_variants_bytes():
    """A site that runs m0 as its INT8 copy (a quarter of the bytes) has room for
    another model beside it; the site that runs it as shipped does not."""
    inp = PlacementInput(
        sites=sites(("a1", "a", 2), ("b1", "b", 2)),
        models=(
            ModelSpec("m0", int(1.5 * GiB), site_bytes=(("a1", int(0.4 * GiB)),)),
            ModelSpec("m1", GiB),
        ),
        demand={("a", "m0"): 10.0, ("a", "m1"): 5.0, ("b", "m0"): 10.0, ("b", "m1"): 5.0},
        latency_ms={},
    )
    result = place(inp)
    assert sorted(result.loaded["a1"]) == ["m0", "m1"]
    assert result.loaded["b1"] == ["m0"]
