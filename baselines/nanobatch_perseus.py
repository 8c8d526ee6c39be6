"""Nanobatching + Perseus, stacked independently: the nanobatched execution (default collective
schedules) profiled per clock, then the same Perseus time–cost tradeoff."""

from __future__ import annotations

from kareus.methods.profiling import TradeoffSettings, clock_tradeoff_plans
from kareus.plan import IterationPlan
from kareus.plugins import Problem


class NanobatchPerseus:
    """Perseus's clock per instruction on top of nanobatched overlap."""

    name = "nanobatch-perseus"
    Settings = TradeoffSettings
    #: Every plan is nanobatched (see :func:`kareus.plugins.nanobatched_only`).
    nanobatched_only = True

    def __init__(self, settings: TradeoffSettings | None = None) -> None:
        self.settings = TradeoffSettings() if settings is None else settings

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        return clock_tradeoff_plans(problem, nanobatched=True, label="nanobatch-perseus",
                                    settings=self.settings)
