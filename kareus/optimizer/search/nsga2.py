"""NSGA-II over a partition's (clock, communication SMs, window) grid, through pymoo.

Objectives. By default the search minimises **time and total energy** (dynamic + static · time).
Total energy increases with both time and dynamic energy, so a configuration dominated in
(time, dynamic) is also dominated in (time, total): the time/total-energy Pareto set is a *subset*
of the time/dynamic-energy one. A 3-objective run (time, dynamic, total) therefore has exactly the
(time, dynamic) Pareto set, with crowding spread over the whole, wider dynamic front — including
the slow low-clock end that is never total-optimal. Measured on the benchmark partitions at a 15 %
budget (``benchmarks/search_efficiency.py``; hypervolumes against the exact fronts' nadirs), the
(time, total) run reaches ~0.99 of the exact total-energy hypervolume and still ~0.99 of the
dynamic one, while (time, dynamic) and the 3-objective run reach ~0.97 total / ~0.99 dynamic; the
total-energy front is the one on the critical path, hence the default. ``objectives="dynamic"``
and ``"both"`` are available.

Population. Small populations (budget / 10, clipped to 8..40) give more generations per budget;
on the same benchmark budget / 6 loses ~1 point of total hypervolume.

Budget. Every measurement goes through :meth:`Evaluator.measure`, which counts distinct
configurations. Duplicates are eliminated against everything already measured (not only the
current population), so each offspring costs one evaluation; the last generation is truncated so
the budget is never exceeded.
"""

from __future__ import annotations


import numpy as np
from numpy.typing import NDArray

from kareus.energy import measured_energy
from kareus.errors import InputError
from kareus.optimizer.search.base import Evaluator, SearchResult, resolve_budget

#: Smallest budget any sampling strategy accepts (fewer points give no front to speak of).
MIN_BUDGET = 4


OBJECTIVES = ("total", "dynamic", "both")


class NSGA2Search:
    """NSGA-II (pymoo) on the integer knob grid under a budget of distinct measurements.

    Args:
        objectives: ``"total"`` (time, total energy; default), ``"dynamic"`` (time, dynamic
            energy) or ``"both"`` (time, dynamic, total). See the module docstring.
        pop_size: Population size; ``None`` picks ``budget / 10`` clipped to 8..40.
        eta: Distribution index of SBX and polynomial mutation (small: large integer steps).
    """

    name = "nsga2"
    #: The smallest budget it accepts (:func:`kareus.optimizer.search.min_budget`).
    min_budget = MIN_BUDGET

    def __init__(self, objectives: str = "total", pop_size: int | None = None,
                 eta: float = 3.0) -> None:
        if objectives not in OBJECTIVES:
            raise InputError(f"unknown NSGA-II objectives {objectives!r}; choose one of: "
                             f"{', '.join(OBJECTIVES)}")
        self.objectives = objectives
        self.pop_size = pop_size
        self.eta = eta

    def _pop_size(self, budget: int) -> int:
        if self.pop_size is not None:
            return max(2, min(int(self.pop_size), budget))
        return max(MIN_BUDGET, min(budget, max(8, min(40, budget // 10))))

    def search(self, evaluator: Evaluator, budget: int | None,
               rng: np.random.Generator) -> SearchResult:
        from pymoo.algorithms.moo.nsga2 import NSGA2
        from pymoo.core.duplicate import DefaultDuplicateElimination
        from pymoo.core.problem import Problem
        from pymoo.core.termination import NoTermination
        from pymoo.operators.crossover.sbx import SBX
        from pymoo.operators.mutation.pm import PM
        from pymoo.operators.repair.rounding import RoundingRepair
        from pymoo.operators.sampling.rnd import IntegerRandomSampling

        space = evaluator.space
        budget = resolve_budget(space, budget, MIN_BUDGET, "nsga2")
        if budget >= space.size:  # the whole space: every configuration, in one call
            evaluator.measure(space.all_indices())
            return evaluator.result()
        shape = np.asarray(space.shape)
        active = np.flatnonzero(shape > 1)  # knobs with a single value are not variables
        static_w = evaluator.backend.gpu.static_power_w
        measured: set[int] = set()

        def full(x: NDArray) -> NDArray[np.int64]:
            idx = np.zeros((len(x), 3), dtype=np.int64)
            idx[:, active] = np.rint(np.asarray(x, dtype=float)).astype(np.int64)
            return idx

        if active.size == 0:  # a one-configuration space
            evaluator.measure(np.zeros((1, 3), dtype=np.int64))
            return evaluator.result()

        objectives = self.objectives

        class _Partition(Problem):
            def __init__(self) -> None:
                super().__init__(n_var=active.size, n_obj=3 if objectives == "both" else 2,
                                 xl=np.zeros(active.size), xu=(shape[active] - 1).astype(float),
                                 vtype=int)

            def _evaluate(self, x, out, *args, **kwargs):  # noqa: ANN001
                idx = full(x)
                t, e = evaluator.measure(idx)
                measured.update(int(f) for f in space.flat(idx))
                total = measured_energy(e, static_w, t)
                cols = {"dynamic": (t, e), "total": (t, total), "both": (t, e, total)}
                out["F"] = np.column_stack(cols[objectives])

        class _NotYetMeasured(DefaultDuplicateElimination):
            """pymoo's duplicate elimination, plus everything measured in earlier generations."""

            def _do(self, pop, other, is_duplicate):  # noqa: ANN001
                is_duplicate = super()._do(pop, other, is_duplicate)
                if other is None:
                    flat = space.flat(full(pop.get("X")))
                    is_duplicate |= np.array([int(f) in measured for f in flat], dtype=bool)
                return is_duplicate

        pop_size = self._pop_size(budget)
        algorithm = NSGA2(
            pop_size=pop_size,
            sampling=IntegerRandomSampling(),
            crossover=SBX(prob=0.9, eta=self.eta, vtype=float, repair=RoundingRepair()),
            mutation=PM(eta=self.eta, vtype=float, repair=RoundingRepair()),
            eliminate_duplicates=_NotYetMeasured(),
        )
        problem = _Partition()
        algorithm.setup(problem, seed=int(rng.integers(2**31 - 1)), termination=NoTermination())
        stalls = 0
        while evaluator.evaluations < budget and algorithm.has_next() and stalls < 20:
            before = evaluator.evaluations
            pop = algorithm.ask()
            if pop is None or len(pop) == 0:
                break  # no unmeasured offspring could be produced
            flat = space.flat(full(pop.get("X")))
            left = budget - evaluator.evaluations
            seen = set(measured)
            keep = 0
            for f in flat:  # truncate the batch at the budget
                if int(f) not in seen:
                    if left == 0:
                        break
                    seen.add(int(f))
                    left -= 1
                keep += 1
            if keep == 0:
                break
            pop = pop[:keep]
            algorithm.evaluator.eval(problem, pop, algorithm=algorithm)
            algorithm.tell(infills=pop)
            stalls = stalls + 1 if evaluator.evaluations == before else 0
        return evaluator.result()
