"""Perseus (SOSP '24): one locked SM clock per pipeline instruction, chosen by the time–cost
tradeoff on the 1F1B DAG (``lowtime``'s Phillips–Dessouky solver, 1 ms unit, exponential cost
model) to remove energy bloat off the critical path.

On a backend it first profiles every (stage, forward/backward) over the clock grid, then solves;
every solver step becomes a plan. :func:`baselines.profiles.perseus_on_profile` runs the same
solver on an external Zeus-format profile (``kareus perseus``).
"""

from __future__ import annotations

import pandas as pd

from kareus.methods.profiling import TradeoffSettings, clock_tradeoff_plans
from kareus.plan import IterationPlan
from kareus.plugins import Problem


class Perseus:
    """Perseus on the problem's backend (clock per instruction, no overlap)."""

    name = "perseus"
    Settings = TradeoffSettings

    def __init__(self, settings: TradeoffSettings | None = None) -> None:
        self.settings = TradeoffSettings() if settings is None else settings

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        return clock_tradeoff_plans(problem, nanobatched=False, label="perseus",
                                    settings=self.settings)

    def on_profile(self, profile: pd.DataFrame, source: str, stages: int, microbatches: int,
                   static_power_w: float, *, unit_time_s: float,
                   **options: object) -> list[dict]:
        """perseus on a measured Zeus-format profile (``kareus perseus``): the arguments checked
        (:func:`baselines.profiles.check_arguments`), then
        :func:`baselines.profiles.perseus_on_profile` (solver steps reported to ``progress``)."""
        from baselines.profiles import check_arguments, perseus_on_profile

        check_arguments(profile, source, stages, microbatches, static_power_w, unit_time_s)
        return perseus_on_profile(profile, stages, microbatches, static_power_w,
                                  unit_time_s=unit_time_s, **options)  # type: ignore[arg-type]
