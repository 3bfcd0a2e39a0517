"""Prometheus metrics of the control plane, exported at /metrics on its HTTP port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControlPlaneMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reports = Counter(
            "edgeplex_cp_reports_total", "Load reports received from agents.", registry=r
        )
        self.report_flush_seconds = Histogram(
            "edgeplex_cp_report_flush_seconds",
            "Time to write one batch of reports to Redis.",
            registry=r,
        )
        self.placement_seconds = Histogram(
            "edgeplex_cp_placement_seconds",
            "Time of one placement round (read Redis, place, publish).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=r,
        )
        self.placement_version = Gauge(
            "edgeplex_cp_placement_version", "Version of the latest placement.", registry=r
        )
        self.leader = Gauge(
            "edgeplex_cp_leader", "1 while this replica holds the leader lease.", registry=r
        )
        self.refused_agents = Counter(
            "edgeplex_cp_refused_agent_calls_total",
            "Register or Report calls refused: no, a wrong, or another site's credential.",
            ["code"],
            registry=r,
        )


METRICS = ControlPlaneMetrics()
