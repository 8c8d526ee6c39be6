"""Megatron-LM as it runs by default: maximum clock, communication after compute, no overlap."""

from __future__ import annotations

from kareus.plan import IterationPlan
from kareus.plugins import Problem


class Megatron:
    """One plan: every instruction at the maximum clock, sequential communication."""

    name = "megatron"

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        return [IterationPlan.uniform(problem.graph, problem.gpu.clock_max_mhz, label="megatron")]
