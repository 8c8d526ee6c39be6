"""Zeus (NSDI '23) GPU power-limit optimization: one board power limit for every GPU, swept over
the card's range; Zeus picks the limit minimising ``η·E + (1 − η)·P_max·T`` (energy and time of one
iteration, ``P_max`` the maximum power limit of all GPUs). Every swept point is returned, so the
sweep is also a frontier; the pick is marked in the plan's ``meta``."""

from __future__ import annotations

from dataclasses import dataclass

from kareus.errors import InputError
from kareus.plan import CHOICE, IterationPlan
from kareus.plugins import OptimizerSettings, Problem, require


@dataclass(frozen=True)
class ZeusSettings(OptimizerSettings):
    """Zeus's settings."""

    eta: float = 0.5
    """η of Zeus's cost ``η·E + (1 − η)·P_max·T``, in [0, 1]: 1 weighs energy alone, 0 time."""

    def check(self) -> None:
        require(0.0 <= self.eta <= 1.0, "eta", "in [0, 1]", self.eta)


def zeus_cost(energy_j: float, time_s: float, eta: float, max_power_w: float) -> float:
    """Zeus's energy-time cost (J-equivalent): ``η·E + (1 − η)·P_max·T``."""
    return eta * energy_j + (1 - eta) * max_power_w * time_s


class ZeusPowerLimit:
    """Sweep the power limit at the maximum clock, no overlap."""

    name = "zeus-power-limit"
    Settings = ZeusSettings

    def __init__(self, settings: ZeusSettings | None = None) -> None:
        self.settings = ZeusSettings() if settings is None else settings

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        eta = self.settings.eta
        limits = problem.knobs.power_limits_w
        if not limits:
            raise InputError("knob space has no power limits to sweep")
        g, gpu = problem.graph, problem.gpu
        p_max = max(limits) * g.num_gpus
        plans, costs = [], []
        for limit in limits:
            plan = IterationPlan.uniform(g, gpu.clock_max_mhz, power_limit_w=limit,
                                         label=f"power limit {limit:.0f} W")
            res = problem.backend.evaluate_plan(g, plan)
            plans.append(plan)
            costs.append(zeus_cost(res.energy.total_j, res.time_s, eta, p_max))
        pick = min(range(len(plans)), key=costs.__getitem__)
        plans[pick] = IterationPlan(plans[pick].instructions, plans[pick].power_limit_w,
                                    plans[pick].label + " (Zeus choice)",
                                    meta={CHOICE: True, "eta": eta})
        return plans
