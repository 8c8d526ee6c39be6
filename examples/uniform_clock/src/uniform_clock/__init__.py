"""Example optimizer plugin: lock every GPU to one SM clock, for each clock of the knob space.

The simplest DVFS policy there is (``nvidia-smi -lgc`` for the whole job). Each clock gives one
plan; the harness measures them all and keeps the Pareto frontier.

It also shows how a plugin declares settings: a frozen dataclass subclassing
:class:`kareus.plugins.OptimizerSettings`, named by the class attribute ``Settings``. The registry
builds it once from the command line (``kareus frontier -o uniform-clock --set
min_clock_mhz=900``, or ``reproduce.py --set ...``), converted to the fields' types and checked,
and passes it to the constructor. A plugin without settings leaves both out.

A job the plugin cannot plan as asked (here: no clock of the GPU at or above ``min_clock_mhz``) is
refused with :class:`kareus.errors.JobRefused`: one line for the user, exit status 2.
"""

from __future__ import annotations

from dataclasses import dataclass

from kareus.errors import JobRefused
from kareus.plan import IterationPlan
from kareus.plugins import OptimizerSettings, Problem, require


@dataclass(frozen=True)
class UniformClockSettings(OptimizerSettings):
    """The example's one setting."""

    min_clock_mhz: float = 0.0
    """The lowest clock swept (MHz); 0: every clock of the knob space."""

    def check(self) -> None:
        require(self.min_clock_mhz >= 0, "min_clock_mhz", "a non-negative number of MHz",
                self.min_clock_mhz)


class UniformClock:
    """One plan per candidate clock: every instruction at that clock, no overlap."""

    name = "uniform-clock"
    Settings = UniformClockSettings

    def __init__(self, settings: UniformClockSettings = UniformClockSettings()) -> None:
        self.settings = settings

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        clocks = [c for c in problem.knobs.clocks_mhz if c >= self.settings.min_clock_mhz]
        if not clocks:
            raise JobRefused(f"no clock of {problem.gpu.name} is at or above min_clock_mhz "
                             f"{self.settings.min_clock_mhz:g} MHz (its highest: "
                             f"{max(problem.knobs.clocks_mhz):g} MHz)")
        return [IterationPlan.uniform(problem.graph, clock, label=f"all at {clock:.0f} MHz")
                for clock in clocks]
