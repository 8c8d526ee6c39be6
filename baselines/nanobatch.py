"""Nanobatching: 2 nanobatches, each collective launched at its partition's start with the
collective library's default SM count, maximum clock (cuts static energy by finishing sooner)."""

from __future__ import annotations

from kareus.plan import IterationPlan
from kareus.plugins import Problem


class Nanobatch:
    """One plan: nanobatched overlap with default schedules at the maximum clock."""

    name = "nanobatch"
    #: Every plan is nanobatched: a job whose micro-batch does not split is refused before any
    #: work (:func:`kareus.plugins.nanobatched_only`).
    nanobatched_only = True

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        return [IterationPlan.uniform(problem.graph, problem.gpu.clock_max_mhz, nanobatched=True,
                                      label="nanobatch")]
