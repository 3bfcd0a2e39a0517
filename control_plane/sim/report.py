"""The simulator's report: `report.json` for machines, `report.html` with PNG
plots for people (demand per region, GPUs in use, a residency heat map, cold
starts and the forwarded share). Plots need matplotlib (the `sim` extra);
without it the HTML says so and the JSON is complete."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from edgeplex.control_plane.sim.engine import Outcome

GOALS = (
    ("served_in_region_within_slo", "served within SLO from its own region", ">=", 0.95),
    ("gpus_vs_lower_bound", "GPUs against the lower bound (no placement needs fewer)", "<=", 1.3),
    (
        "gpus_below_best_baseline",
        "GPUs saved against the better of per-site LRU and static",
        ">=",
        0.2,
    ),
    ("churn_per_hour", "placement churn (share of models moved per hour)", "<=", 0.05),
    # Forecasting earns its keep: fewer GPUs than reactive for the target, or more
    # served in region on the same GPUs (by at least a tenth of a point)...
    (
        "forecast_gain",
        "forecasting: GPUs fewer than reactive's, or points more served on equal GPUs",
        ">=",
        0.1,
    ),
    # ... and fewer requests at a region's peak onset finding no holder there yet:
    # for a model placement put in their region within the hour after. (The rest
    # of the misses at peak onset are for models no placement held in the region
    # then; `misses_peak_onset` counts them all.)
    (
        "peak_onset_placed_late_cut",
        "requests at peak onset finding their model not yet placed in their region, "
        "cut against reactive",
        ">=",
        0.05,
    ),
)


def goals(report: dict[str, object]) -> list[dict[str, object]]:
    """The standard goals, checked on the `forecast` strategy."""
    f: dict = report["forecast"]  # type: ignore[assignment]
    floor: dict = report["lower_bound"]  # type: ignore[assignment]
    baselines = [report[k]["gpus"] for k in ("lru", "static")]  # type: ignore[index]
    best = min((g for g in baselines if g is not None), default=None)
    equal: dict = report["equal_size"]  # type: ignore[assignment]
    reactive_onset = equal["reactive"]["placed_late_peak_onset"]
    forecast_onset = equal["forecast"]["placed_late_peak_onset"]
    reactive_gpus = report["reactive"]["gpus"]  # type: ignore[index]
    more_served = 100 * (
        equal["forecast"]["served_in_region_within_slo"]
        - equal["reactive"]["served_in_region_within_slo"]
    )
    values = {
        "served_in_region_within_slo": f["served_in_region_within_slo"],
        "gpus_vs_lower_bound": (f["gpus"] or float("inf")) / max(floor["gpus"], 1),
        "gpus_below_best_baseline": (
            1.0 - f["gpus"] / best if f["gpus"] is not None and best else 0.0
        ),
        "churn_per_hour": f["churn_per_hour"],
        "forecast_gain": (
            reactive_gpus - f["gpus"]
            if reactive_gpus is not None and f["gpus"] is not None and reactive_gpus != f["gpus"]
            else more_served
        ),
        "peak_onset_placed_late_cut": (
            1 - forecast_onset / reactive_onset if reactive_onset else 0.0
        ),
    }
    out = []
    for key, text, op, bound in GOALS:
        v = values[key]
        met = {">=": v >= bound, "<=": v <= bound, "==": v == bound}[op]  # type: ignore[operator]
        out.append({"goal": text, "value": v, "bound": f"{op} {bound}", "met": bool(met)})
    return out


def write(report: dict[str, object], out_dir: Path, step_min: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes: dict[str, Outcome] = report.pop("_timelines")  # type: ignore[assignment]
    report["goals"] = goals(report)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=as_json) + "\n")
    plots = _plots(outcomes, out_dir, step_min, report)
    (out_dir / "report.html").write_text(_html(report, plots))


def as_json(value: object) -> object:
    """`json.dumps`' default for the simulator's values: a NumPy scalar as its number."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def _plots(
    outcomes: dict[str, Outcome], out_dir: Path, step_min: int, report: dict[str, object]
) -> list[tuple[str, str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    hours = lambda n: np.arange(n) * step_min / 60.0  # noqa: E731
    made: list[tuple[str, str]] = []

    def save(fig, name: str, title: str) -> None:  # type: ignore[no-untyped-def]
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=90)
        plt.close(fig)
        made.append((name, title))

    forecast = outcomes["forecast"].timeline
    regions = report["config"]["regions"]  # type: ignore[index]
    demand = np.array(forecast.demand_rps)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    for r, name in enumerate(regions):
        ax.plot(hours(len(demand)), demand[:, r], label=name, lw=0.8)
    ax.set(xlabel="hour", ylabel="requests/s", title="Demand per region")
    ax.legend(ncol=len(regions), fontsize=8)
    save(fig, "demand.png", "Demand per region")

    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name, outcome in outcomes.items():
        g = outcome.timeline.gpus_in_use
        ax.plot(hours(len(g)), g, label=f"{name} ({outcome.gpus} GPUs)", lw=0.8)
    ax.set(xlabel="hour", ylabel="GPUs serving", title="GPUs in use")
    ax.legend(fontsize=8)
    save(fig, "gpus.png", "GPUs in use")

    holders = np.array(forecast.holders)  # [steps, models]
    top = np.argsort(-holders.sum(axis=0))[:60]
    fig, ax = plt.subplots(figsize=(10, 4))
    image = ax.imshow(holders[:, top].T, aspect="auto", interpolation="nearest", cmap="viridis",
                      extent=(0, len(holders) * step_min / 60.0, len(top), 0))  # fmt: skip
    fig.colorbar(image, ax=ax, label="sites holding")
    ax.set(xlabel="hour", ylabel="model (most resident first)",
           title="Residency heat map (forecast)")  # fmt: skip
    save(fig, "residency.png", "Residency heat map")

    fig, ax = plt.subplots(figsize=(10, 3.5))
    per_hour = max(1, 60 // step_min)
    for name, outcome in outcomes.items():
        c = np.array(outcome.timeline.cold_starts)
        n = len(c) // per_hour
        ax.plot(np.arange(n), c[: n * per_hour].reshape(n, per_hour).sum(axis=1), label=name)
    ax.set(xlabel="hour", ylabel="cold starts per hour", title="Cold starts", yscale="symlog")
    ax.legend(fontsize=8)
    save(fig, "cold_starts.png", "Cold starts")

    fig, ax = plt.subplots(figsize=(10, 3.5))
    for name in ("reactive", "forecast"):
        f = outcomes[name].timeline.forwarded_share
        ax.plot(hours(len(f)), np.array(f) * 100, label=name, lw=0.8)
    ax.set(xlabel="hour", ylabel="% of requests", title="Forwarded share")
    ax.legend(fontsize=8)
    save(fig, "forwarded.png", "Forwarded share")
    return made


def _fmt(value: object) -> str:
    if value is None:
        return "not reached"
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


def _html(report: dict[str, object], plots: list[tuple[str, str]]) -> str:
    columns = ("gpus", "served_in_region_within_slo", "forwarded", "cold_starts",
               "cold_starts_peak_onset", "misses_peak_onset", "placed_late_peak_onset",
               "churn_per_hour",
               "on_demand_churn_per_hour", "bytes_moved", "bytes_downloaded")  # fmt: skip
    rows = "".join(
        f"<tr><th>{name}</th>"
        + "".join(f"<td>{_fmt(report[name].get(c))}</td>" for c in columns)  # type: ignore[attr-defined]
        + "</tr>"
        for name in ("lower_bound", "dedicated", "lru", "static", "reactive", "forecast")
    )
    goal_rows = "".join(
        f"<tr><td>{html.escape(g['goal'])}</td><td>{_fmt(g['value'])}</td>"  # type: ignore[index]
        f"<td>{html.escape(g['bound'])}</td><td>{'met' if g['met'] else 'NOT met'}</td></tr>"  # type: ignore[index]
        for g in report["goals"]  # type: ignore[attr-defined]
    )
    images = (
        "".join(
            f'<h2>{html.escape(title)}</h2><img src="{name}" alt="{html.escape(title)}">'
            for name, title in plots
        )
        or "<p>Plots need matplotlib: <code>pip install 'edgeplex[sim]'</code>.</p>"
    )
    config = html.escape(json.dumps(report["config"], indent=2))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>edgeplex fleet simulation</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
img{{max-width:100%}}</style></head><body>
<h1>GPUs saved</h1>
<p>Each strategy on the smallest fleet that serves its target share of requests
within SLO from their own region (one GPU per site).</p>
<table><tr><th>strategy</th>{"".join(f"<th>{c}</th>" for c in columns)}</tr>{rows}</table>
<h2>Goals (forecast)</h2>
<table><tr><th>goal</th><th>value</th><th>bound</th><th></th></tr>{goal_rows}</table>
{images}
<h2>How it was run</h2><pre>{config}</pre>
<p>Runtime: {report.get("runtime_s", 0):.0f} s.</p>
</body></html>
"""
