"""Perseus (SOSP '24): one locked SM clock per pipeline instruction, chosen by the time–cost
tradeoff on the 1F1B DAG (``lowtime``'s Phillips–Dessouky solver, 1 ms unit, exponential cost
model) to remove energy bloat off the critical path.

On a backend it first profiles every (stage, forward/backward) over the clock grid, then solves;
every solver step becomes a plan. :func:`baselines.profiles.perseus_on_profile` runs the same
solver on an external Zeus-format profile (``kareus perseus``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kareus.errors import InputError
from kareus.methods.profiling import TradeoffSettings, clock_tradeoff_plans
from kareus.methods.tradeoff import is_prefilter
from kareus.plan import IterationPlan
from kareus.plugins import Problem
from kareus.progress import SILENT, Progress

if TYPE_CHECKING:
    import pandas as pd


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
        :func:`baselines.profiles.perseus_on_profile` with the ``options`` it takes
        (``prefilter``, ``all_iterations``, and ``progress``, which counts the solver's steps)."""
        from baselines.profiles import check_arguments, perseus_on_profile

        check_arguments(profile, source, stages, microbatches, static_power_w, unit_time_s)
        prefilter = options.pop("prefilter", "raw")
        all_iterations = options.pop("all_iterations", False)
        progress = options.pop("progress", SILENT)
        if options:
            raise TypeError(f"perseus on a profile takes no option {', '.join(sorted(options))}")
        if not is_prefilter(prefilter):
            raise InputError(f"unknown pre-filter {prefilter!r}; choose raw or effective")
        if not isinstance(progress, Progress):
            raise TypeError(f"progress must be a kareus.progress.Progress, got {progress!r}")
        return perseus_on_profile(profile, stages, microbatches, static_power_w,
                                  unit_time_s=unit_time_s, prefilter=prefilter,
                                  all_iterations=bool(all_iterations), progress=progress)
