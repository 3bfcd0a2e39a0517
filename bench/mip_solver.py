"""Exact placement by MIP (OR-Tools SCIP), for bench/placement_quality.py.

Runs in its own virtual environment (OR-Tools pins an older protobuf than
edgeplex's generated code needs), so it reads a JSON instance and writes a
JSON answer and imports nothing from edgeplex. Same objective as
edgeplex.control_plane.placement:

    max  sum_{r,m,R} value[r,m] * w[r,R,m] * z[r,m,R]  -  sum_{s,m} churn[s,m] * x[s,m]
    s.t. sum_R z[r,m,R] <= 1                      (each demand served once)
         z[r,m,R] <= sum_{s in R} x[s,m]           (only from regions holding m)
         sum_m size[m] * x[s,m] <= cap[s]          (device budget)
         sum_s x[s,m] >= min_replicas[m]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ortools.linear_solver import pywraplp


def main() -> None:
    data = json.loads(Path(sys.argv[1]).read_text())
    regions, sites, models = data["regions"], data["sites"], data["models"]
    value, w, churn = data["value"], data["w"], data["churn"]  # [r][m], [r][R][m], [s][m]
    solver = pywraplp.Solver.CreateSolver("SCIP")
    solver.SetTimeLimit(int(data.get("time_limit_s", 60) * 1000))
    n_r, n_m = len(regions), len(models)
    x = [[solver.BoolVar(f"x{s}_{m}") for m in range(n_m)] for s in range(len(sites))]
    by_region = [[s for s, site in enumerate(sites) if site["region"] == r] for r in range(n_r)]
    objective = solver.Objective()
    for r in range(n_r):
        for m in range(n_m):
            if value[r][m] <= 0:
                continue
            zs = []
            for R in range(n_r):
                if w[r][R][m] <= 0 or not by_region[R]:
                    continue
                z = solver.NumVar(0, 1, f"z{r}_{m}_{R}")
                zs.append(z)
                objective.SetCoefficient(z, value[r][m] * w[r][R][m])
                link = solver.Constraint(-solver.infinity(), 0)
                link.SetCoefficient(z, 1)
                for s in by_region[R]:
                    link.SetCoefficient(x[s][m], -1)
            if zs:
                once = solver.Constraint(0, 1)
                for z in zs:
                    once.SetCoefficient(z, 1)
    for s, site in enumerate(sites):
        cap = solver.Constraint(0, site["cap"])
        for m in range(n_m):
            cap.SetCoefficient(x[s][m], models[m]["size"])
            objective.SetCoefficient(x[s][m], -churn[s][m])
    for m, model in enumerate(models):
        if model["min_replicas"]:
            c = solver.Constraint(min(model["min_replicas"], len(sites)), solver.infinity())
            for s in range(len(sites)):
                c.SetCoefficient(x[s][m], 1)
    objective.SetMaximization()
    status = solver.Solve()
    loaded = {
        site["id"]: [models[m]["name"] for m in range(n_m) if x[s][m].solution_value() > 0.5]
        for s, site in enumerate(sites)
    }
    answer = json.dumps(
        {
            "optimal": status == pywraplp.Solver.OPTIMAL,
            "objective": solver.Objective().Value(),
            "bound": solver.Objective().BestBound(),
            "loaded": loaded,
            "seconds": solver.wall_time() / 1000,
        }
    )
    Path(sys.argv[2]).write_text(answer)


if __name__ == "__main__":
    main()
