"""Example optimizer plugin: lock every GPU to one SM clock, for each clock of the knob space.

The simplest DVFS policy there is (``nvidia-smi -lgc`` for the whole job). Each clock gives one
plan; the harness measures them all and keeps the Pareto frontier.
"""

from __future__ import annotations

from kareus.plan import IterationPlan
from kareus.plugins import Problem


class UniformClock:
    """One plan per candidate clock: every instruction at that clock, no overlap."""

    name = "uniform-clock"

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        return [IterationPlan.uniform(problem.graph, clock, label=f"all at {clock:.0f} MHz")
                for clock in problem.knobs.clocks_mhz]
