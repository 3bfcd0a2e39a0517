"""What the simulator runs: a fleet (regions, round trips, sites) and a catalog
(models with size, load cost and compute per request), from YAML/CSV files or
from the standard fleet's generator.

Fleet file (YAML):

    regions:
      - {name: eu, utc_offset_h: 1}
      - {name: us, utc_offset_h: -5}
    rtt_ms: {"eu,us": 90}          # round trips between regions
    sites:                         # groups of identical sites, one GPU each
      - {region: eu, count: 10, gpu_memory: 24GiB, concurrency: 16}

`concurrency` is a site's throughput profile: how many requests' worth of
compute (each `compute_ms` long) its GPU completes in parallel, batching
included; a site is saturated when its requests/s times their compute time
reaches it.

Catalog file (YAML list, or CSV with a header): `name, size_bytes, load_s,
compute_ms, slo_ms`. `load_s` is the time to promote the model onto the GPU
from host memory (bench/swap_in.py measures it on a real box).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from edgeplex.sizes import parse_size

MB = 1000**2
GiB = 1024**3


class RegionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    utc_offset_h: float = 0.0


class SiteGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    region: str
    count: int = Field(1, ge=0)
    gpu_memory: int = 24 * GiB
    # The box's RAM for the staged tier: the models it holds ready to promote, those
    # on its GPU included (the agent keeps their staged copy).
    host_memory: int = 64 * GiB
    concurrency: float = Field(16.0, gt=0)

    @field_validator("gpu_memory", "host_memory", mode="before")
    @classmethod
    def _size(cls, v: int | str) -> int:
        return parse_size(v)


class FleetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    regions: list[RegionSpec]
    rtt_ms: dict[str, float] = Field(default_factory=dict)  # "a,b" -> round trip
    sites: list[SiteGroup]

    def rtt(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        found = self.rtt_ms.get(f"{a},{b}", self.rtt_ms.get(f"{b},{a}"))
        return math.inf if found is None else found

    def scaled(self, factor: float) -> FleetSpec:
        """The same fleet with every site group scaled (at least one site a region)."""
        groups = [
            g.model_copy(update={"count": max(0, round(g.count * factor))}) for g in self.sites
        ]
        for region in {g.region for g in self.sites}:
            mine = [g for g in groups if g.region == region]
            if mine and sum(g.count for g in mine) == 0:
                mine[0].count = 1
        return self.model_copy(update={"sites": groups})

    def less_one(self, region: str) -> FleetSpec | None:
        """The same fleet with one site fewer in `region` (from its largest group), or
        None when the region is down to one site."""
        mine = [g for g in self.sites if g.region == region]
        if sum(g.count for g in mine) <= 1:
            return None
        largest = max(mine, key=lambda g: g.count)
        groups = [
            g.model_copy(update={"count": g.count - 1}) if g is largest else g for g in self.sites
        ]
        return self.model_copy(update={"sites": groups})

    def more_one(self, region: str) -> FleetSpec:
        """The same fleet with one site more in `region` (in its largest group)."""
        largest = max((g for g in self.sites if g.region == region), key=lambda g: g.count)
        groups = [
            g.model_copy(update={"count": g.count + 1}) if g is largest else g for g in self.sites
        ]
        return self.model_copy(update={"sites": groups})

    @property
    def gpus(self) -> int:
        return sum(g.count for g in self.sites)

    def per_region(self) -> dict[str, int]:
        """Sites (one GPU each) per region, in the regions' order."""
        return {
            r.name: sum(g.count for g in self.sites if g.region == r.name) for r in self.regions
        }


def load_fleet(path: Path) -> FleetSpec:
    return FleetSpec.model_validate(yaml.safe_load(path.read_text()))


@dataclass(frozen=True)
class Catalog:
    names: list[str]
    size_bytes: np.ndarray  # [M] int64
    load_s: np.ndarray  # [M]
    compute_ms: np.ndarray  # [M]
    slo_ms: np.ndarray  # [M]

    def __len__(self) -> int:
        return len(self.names)

    def rows(self) -> list[dict[str, float | str]]:
        return [
            {
                "name": n,
                "size_bytes": int(self.size_bytes[i]),
                "load_s": float(self.load_s[i]),
                "compute_ms": float(self.compute_ms[i]),
                "slo_ms": float(self.slo_ms[i]),
            }
            for i, n in enumerate(self.names)
        ]


def catalog_from_rows(rows: list[dict[str, object]]) -> Catalog:
    def col(key: str, default: float | None = None) -> np.ndarray:
        values = []
        for row in rows:
            value = row.get(key, default)
            if value is None or value == "":
                raise ValueError(f"catalog: model {row.get('name')!r} has no {key}")
            values.append(float(parse_size(value)) if key == "size_bytes" else float(value))  # type: ignore[arg-type]
        return np.array(values)

    return Catalog(
        names=[str(r["name"]) for r in rows],
        size_bytes=col("size_bytes").astype(np.int64),
        load_s=col("load_s"),
        compute_ms=col("compute_ms"),
        slo_ms=col("slo_ms", 100.0),
    )


def load_catalog(path: Path) -> Catalog:
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            return catalog_from_rows(list(csv.DictReader(f)))
    data = yaml.safe_load(path.read_text())
    return catalog_from_rows(data["models"] if isinstance(data, dict) else data)


def write_catalog(catalog: Catalog, path: Path) -> None:
    path.write_text(yaml.safe_dump({"models": catalog.rows()}, sort_keys=False))


# --- the standard fleet ---------------------------------------------------------------------


@dataclass(frozen=True)
class StandardKnobs:
    """The standard fleet and catalog; the report prints these."""

    regions: int = 5
    sites: int = 100
    gpu_memory: int = 24 * GiB
    host_memory: int = 64 * GiB
    concurrency: float = 16.0
    models: int = 1000
    size_min_bytes: int = 10 * MB
    size_max_bytes: int = 2000 * MB
    compute_min_ms: float = 1.0
    compute_max_ms: float = 50.0
    slo_ms: float = 100.0
    # Promotion from host memory: a fixed session cost plus the copy, as
    # bench/swap_in.py measures (2 GB/s is a conservative PCIe figure).
    load_fixed_s: float = 0.2
    load_bytes_per_s: float = 2e9


REGION_NAMES = ("us-west", "us-east", "eu", "asia", "oceania")
REGION_OFFSETS_H = (-8.0, -5.0, 1.0, 8.0, 10.0)
# Round trips between the standard regions (ms), 20-200.
STANDARD_RTT = {
    "us-west,us-east": 60, "us-west,eu": 140, "us-west,asia": 120, "us-west,oceania": 150,
    "us-east,eu": 80, "us-east,asia": 200, "us-east,oceania": 200,
    "eu,asia": 170, "eu,oceania": 200, "asia,oceania": 20,
}  # fmt: skip


def standard_fleet(k: StandardKnobs = StandardKnobs()) -> FleetSpec:
    names = REGION_NAMES[: k.regions] if k.regions <= 5 else [f"r{i}" for i in range(k.regions)]
    offsets = [REGION_OFFSETS_H[i % 5] for i in range(len(names))]
    per = [k.sites // k.regions + (1 if i < k.sites % k.regions else 0) for i in range(k.regions)]
    rtt = {key: float(v) for key, v in STANDARD_RTT.items()}
    if k.regions > 5:
        rtt = {f"{a},{b}": 20.0 + 180.0 * abs(i - j) / k.regions
               for i, a in enumerate(names) for j, b in enumerate(names) if i < j}  # fmt: skip
    return FleetSpec(
        regions=[RegionSpec(name=n, utc_offset_h=o) for n, o in zip(names, offsets, strict=True)],
        rtt_ms=rtt,
        sites=[
            SiteGroup(
                region=n,
                count=c,
                gpu_memory=k.gpu_memory,
                host_memory=k.host_memory,
                concurrency=k.concurrency,
            )
            for n, c in zip(names, per, strict=True)
        ],
    )


def standard_catalog(k: StandardKnobs = StandardKnobs(), seed: int = 0) -> Catalog:
    rng = np.random.default_rng(seed)
    n = k.models
    size = np.exp(rng.uniform(math.log(k.size_min_bytes), math.log(k.size_max_bytes), n))
    compute = np.exp(rng.uniform(math.log(k.compute_min_ms), math.log(k.compute_max_ms), n))
    return Catalog(
        names=[f"m{i:04d}" for i in range(n)],
        size_bytes=size.astype(np.int64),
        load_s=k.load_fixed_s + size / k.load_bytes_per_s,
        compute_ms=compute,
        slo_ms=np.full(n, k.slo_ms),
    )
