"""Prometheus metrics of the control plane, exported at /metrics on its HTTP port."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from edgeplex.proto import edgeplex_control_pb2 as pb


class ControlPlaneMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reports = Counter(
            "edgeplex_cp_reports_total", "Load reports received from agents.", registry=r
        )
        self.report_streams = Gauge(
            "edgeplex_cp_report_streams",
            "Report streams open at this replica: one per agent reporting to it.",
            registry=r,
        )
        self.report_flush_seconds = Histogram(
            "edgeplex_cp_report_flush_seconds",
            "Time to write one batch of reports to Redis.",
            registry=r,
        )
        self.placement_seconds = Histogram(
            "edgeplex_cp_placement_seconds",
            "Time of one placement round (read Redis, place, publish).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10),
            registry=r,
        )
        self.placement_phase_seconds = Counter(
            "edgeplex_cp_placement_phase_seconds",
            "Time placement rounds spent in each phase: read (Redis state into the "
            "placement input), place (the algorithm), publish (desired states and routes).",
            ["phase"],
            registry=r,
        )
        self.placement_version = Gauge(
            "edgeplex_cp_placement_version", "Version of the latest placement.", registry=r
        )
        self.leader = Gauge(
            "edgeplex_cp_leader", "1 while this replica holds the leader lease.", registry=r
        )
        self.site_up = Gauge(
            "edgeplex_cp_site_up",
            "1 while the site's lease holds (it reported within site_lease_s), else 0.",
            ["site", "region"],
            registry=r,
        )
        self.site_desired_behind = Gauge(
            "edgeplex_cp_site_desired_behind",
            "1 while the site's last report names an older desired state than the one "
            "published to it, else 0.",
            ["site"],
            registry=r,
        )
        self.refused_agents = Counter(
            "edgeplex_cp_refused_agent_calls_total",
            "Register or Report calls refused: no, a wrong, or another site's credential.",
            ["code"],
            registry=r,
        )
        self.unknown_demand = Gauge(
            "edgeplex_cp_unknown_model_demand",
            "Requests per second sites report for models the catalog does not hold (kept "
            "out of demand; one number, whatever the names).",
            registry=r,
        )
        self.usage_minutes = Counter(
            "edgeplex_cp_usage_minutes",
            "Usage minutes sites sent, by outcome: stored (added to its hour, or in place "
            "of the same minute sent before), again (sent after its hour was sealed with "
            "it), refused (INVALID_ARGUMENT: not storable).",
            ["outcome"],
            registry=r,
        )
        self.bad_reports = Counter(
            "edgeplex_cp_bad_reports_total",
            "Load reports refused as unusable (a rate that is not finite, a bad name).",
            registry=r,
        )

    def export_sites(
        self,
        sites: list[pb.Site],
        desired: dict[str, int],
        reports: dict[str, pb.LoadReport],
    ) -> None:
        """Per site, after a placement round: up or down, and behind its desired state
        (`desired`: the version of each site's last published state)."""
        for site in sites:
            self.site_up.labels(site=site.site_id, region=site.region).set(1 if site.up else 0)
            published = desired.get(site.site_id)
            report = reports.get(site.site_id)
            applied = report.desired_version if report is not None else 0
            behind = published is not None and applied < published
            self.site_desired_behind.labels(site=site.site_id).set(1 if behind else 0)


METRICS = ControlPlaneMetrics()
