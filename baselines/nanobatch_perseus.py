"""Nanobatching + Perseus, stacked independently: the nanobatched execution (default collective
schedules) profiled per clock, then the same Perseus time–cost tradeoff."""

from __future__ import annotations

from kareus.methods.profiling import clock_tradeoff_plans
from kareus.plan import IterationPlan
from kareus.plugins import Problem


class NanobatchPerseus:
    """Perseus's clock per instruction on top of nanobatched overlap."""

    name = "nanobatch-perseus"

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        return clock_tradeoff_plans(problem, nanobatched=True, label="nanobatch-perseus")
