"""Exhaustive search: measure every configuration (exact fronts; the simulator's default)."""

from __future__ import annotations

import numpy as np

from kareus.optimizer.search.base import Evaluator, SearchResult


class ExhaustiveSearch:
    """Every (clock, SMs, window) configuration, in one vectorised backend call."""

    name = "exhaustive"

    def search(self, evaluator: Evaluator, budget: int | None,
               rng: np.random.Generator) -> SearchResult:
        evaluator.measure_all()
        return evaluator.result()
