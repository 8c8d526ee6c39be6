"""Perseus (SOSP '24): one locked SM clock per pipeline instruction, chosen by the time–cost
tradeoff on the 1F1B DAG (``lowtime``'s Phillips–Dessouky solver, 1 ms unit, exponential cost
model) to remove energy bloat off the critical path.

On a backend it first profiles every (stage, forward/backward) over the clock grid, then solves;
every solver step becomes a plan. :func:`profile_frontier` runs the same solver on an external
Zeus-format profile (``kareus perseus``).
"""

from __future__ import annotations

from collections.abc import Hashable

import pandas as pd

from kareus.frontier import pareto_indices
from kareus.plan import IterationPlan
from kareus.plugins import Problem
from kareus.profiling import clock_tradeoff_plans, profile_to_options
from kareus.tradeoff import evaluate_on_options, solve


class Perseus:
    """Perseus on the problem's backend (clock per instruction, no overlap)."""

    name = "perseus"

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        return clock_tradeoff_plans(problem, nanobatched=False, label="perseus")


def profile_frontier(profile: pd.DataFrame, stages: int, microbatches: int,
                     static_power_w: float, *, unit_time_s: float = 1e-3,
                     prefilter: str = "raw", all_iterations: bool = False) -> list[dict]:
    """Perseus on a Zeus-format profile: every solver step replayed on the profile.

    Returns point records (``time_s``, ``energy_j``, solver ``iteration``, ``quant_time``,
    ``cost`` and the per-stage ``frequencies`` in 1F1B order): all steps in solver order with
    ``all_iterations``, else the Pareto-optimal ones sorted by time.
    """
    options = profile_to_options(profile)
    points = []
    for step in solve(options, stages, microbatches, static_power_w, unit_time_s=unit_time_s,
                      prefilter=prefilter):  # type: ignore[arg-type]
        t, e = evaluate_on_options(step, options, stages, microbatches, static_power_w)
        freqs: dict[int, list[Hashable]] = {}
        for ins, knob in step.knobs.items():  # knobs are in 1F1B order per stage
            freqs.setdefault(ins.stage, []).append(knob)
        points.append({"time_s": t, "energy_j": e, "iteration": step.iteration,
                       "quant_time": step.quant_time, "cost": step.cost,
                       "frequencies": [freqs[s] for s in sorted(freqs)]})
    if all_iterations:
        return points
    keep = pareto_indices([p["time_s"] for p in points], [p["energy_j"] for p in points])
    return [points[i] for i in keep]
