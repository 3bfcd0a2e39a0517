"""deploy/prometheus and deploy/grafana: they parse, and every metric they name is
one the agent or the control plane exports."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from edgeplex.agent.observability.metrics import METRICS as AGENT
from edgeplex.agent.observability.triton_metrics import NAMES as TRITON
from edgeplex.control_plane.metrics import METRICS as CONTROL_PLANE
from tests.conftest import ROOT

METRIC = re.compile(r"\b((?:edgeplex|nv)_[a-z0-9_]+)")


def exported() -> set[str]:
    names = set(TRITON)
    for registry in (AGENT.registry, CONTROL_PLANE.registry):
        for family in registry.collect():
            if family.type == "counter":
                names.add(f"{family.name}_total")
            elif family.type == "histogram":
                names |= {f"{family.name}_{s}" for s in ("bucket", "sum", "count")}
            else:
                names.add(family.name)
    return names


def expressions() -> list[tuple[str, str]]:
    out = []
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            assert rule.keys() >= {"alert", "expr", "labels", "annotations"}, rule
            out.append((f"alert {rule['alert']}", rule["expr"]))
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"] and board["panels"], path
        for panel in board["panels"]:
            for target in panel["targets"]:
                out.append((f"{path.name}: {panel['title']}", target["expr"]))
    return out


def test_the_scrape_config_loads_the_alerts() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"edgeplex-agent", "edgeplex-control-plane"}


@pytest.mark.parametrize(("where", "expr"), expressions(), ids=lambda v: str(v)[:60])
def test_every_metric_named_exists(where: str, expr: str) -> None:
    names = set(METRIC.findall(expr))
    assert names, (where, expr)
    missing = names - exported()
    assert not missing, (where, missing)


def test_gpu_gauges_render_as_triton_names_them() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from edgeplex.agent.observability.triton_metrics import render_gpus

    assert render_gpus([]) == ""  # no NVML or no GPU: nothing, not zeros
    text = render_gpus([("GPU-1234", 0.25, 3 << 30, 141 << 30)])
    assert 'nv_gpu_utilization{gpu_uuid="GPU-1234"} 0.25' in text
    assert f'nv_gpu_memory_total_bytes{{gpu_uuid="GPU-1234"}} {141 << 30}' in text
    assert {f.name for f in text_string_to_metric_families(text)} == {
        "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
    }  # fmt: skip
