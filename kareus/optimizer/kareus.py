"""The Kareus optimizer: joint per-partition clock / SM / window search, composition into
instruction options, and the iteration-level time–cost tradeoff.

1. **Per-partition search** (:mod:`kareus.optimizer.search`) over (SM clock, communication SMs, window: the
   compute op the collective is launched before and the one after which compute waits for it)
   for every distinct partition of the iteration, measured on the problem's backend; the search
   keeps the time vs dynamic-energy and time vs total-energy fronts.
2. **Composition** (:mod:`kareus.optimizer.compose`): per instruction type and clock, the Pareto set of the
   partitions' combined schedules, measured as whole instructions, plus the sequential execution.
3. **Iteration frontier** (:mod:`kareus.methods.tradeoff`): lowtime's Phillips–Dessouky solver on the 1F1B
   DAG exactly as Perseus, each option's knob being (clock, per-partition SMs and window). Every
   solver step is a plan, whose instructions then take (unless ``--set reclaim=false``) the
   least-energy measured option their slack allows (:class:`~kareus.methods.slack.SlackReclaimer`:
   the solver chooses through a fitted cost model on a time grid, which leaves energy on
   instructions off the critical path).
   The solver also runs on the two baselines' option sets, which Kareus's knob space contains:
   the sequential execution per clock (Perseus's) and the nanobatched one with the default
   collective schedules per clock (Nanobatching + Perseus's), each solve's plans reclaimed over
   all options, and Kareus returns every solve's plans. The solver is a heuristic on quantized
   times (Perseus's 1 ms unit, docs/solver.md) and a fitted cost model: with more options it
   can land a hair off the plans a subset gives (on GPT-3 XL, under a simulator preset where
   nanobatching did not pay there, Kareus's fastest plan came out 0.8 ms slower than
   Perseus's). So Kareus's frontier holds plans
   as fast and as frugal as each baseline's solver finds (the reclaimer keeps a plan's makespan
   and never raises its energy in its model of measured instruction options; a test holds the
   guarantee where nanobatching is slower and where it pays).

Settings: :class:`KareusSettings`, the search strategy and its budget beside the tradeoff's
(:class:`kareus.methods.profiling.TradeoffSettings`, as for Perseus).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kareus.graph import Direction, Partition
from kareus.hardware.knobs import KnobSpace
from kareus.methods.profiling import TradeoffSettings, profile_instructions, tradeoff_plans
from kareus.methods.tradeoff import Option
from kareus.optimizer.compose import instruction_options
from kareus.optimizer.search import (Evaluator, PartitionSpace, SearchResult, Strategy,
                                     make_search, min_budget)
from kareus.plan import LIBRARY_DEFAULT, SEQUENTIAL, InstructionPlan, IterationPlan
from kareus.plugins import Problem, require


@dataclass(frozen=True)
class KareusSettings(TradeoffSettings):
    """Kareus's settings: the per-partition search's beside the tradeoff's."""

    search: Strategy = "exhaustive"
    """Per-partition search strategy (:mod:`kareus.optimizer.search`): ``exhaustive`` measures
    every configuration; ``nsga2`` and ``surrogate`` spend ``budget`` measurements."""
    budget: int | None = None
    """Configurations measured per partition by ``nsga2`` and ``surrogate`` (``None``: the
    strategy's default, :func:`kareus.optimizer.search.base.resolve_budget`); at least the
    strategy's smallest (:func:`kareus.optimizer.search.min_budget`: 4 for ``nsga2``, 8 for
    ``surrogate``)."""
    reclaim: bool = True
    """Kareus re-chooses every kept plan's options within their slack among all it measured, the
    baselines' included (:class:`~kareus.methods.slack.SlackReclaimer`); ``false`` keeps the
    solver's plans as lowtime returns them, as Perseus does (all but the fastest-option plan
    after them: :func:`kareus.methods.profiling.tradeoff_plans`)."""

    def check(self) -> None:
        super().check()
        require(self.budget is None or self.budget >= 1, "budget", "a positive integer",
                self.budget)
        least = min_budget(self.search)
        require(self.budget is None or self.budget >= least, "budget",
                f"at least {least} with search={self.search}", self.budget)

    def unused(self) -> frozenset[str]:
        """The exhaustive search measures every configuration: its ``budget`` changes nothing
        (nor do the step bounds under the exact solver: :meth:`TradeoffSettings.unused`)."""
        return super().unused() | (frozenset({"budget"}) if self.search == "exhaustive"
                                   else frozenset())


def partition_windows(n_ops: int) -> np.ndarray:
    """Every meaningful (launch, wait) window of a partition of ``n_ops`` compute ops: launched
    before op ``s``, waited for after op ``e`` for ``0 <= s <= e < n_ops``, and (-1, -1), the
    collective alone before the compute; shape (W, 2)."""
    pairs = [SEQUENTIAL] + [(s, e) for s in range(n_ops) for e in range(s, n_ops)]
    return np.array(pairs, dtype=np.int64)


def partition_space(part: Partition, knobs: KnobSpace) -> PartitionSpace:
    """Knob grid of a partition: the knob space's clocks; all-reduce or CP-collective SM counts
    by the partition's collective; every (launch, wait) window. A partition without a collective
    has nothing to schedule: one SM count, one window."""
    clocks = np.asarray(knobs.clocks_mhz, dtype=np.float64)
    if part.comm is None:
        return PartitionSpace(clocks, np.array([LIBRARY_DEFAULT]),
                              np.array([(0, len(part.compute) - 1)]))
    sms = knobs.comm_sms if part.comm.collective == "all_reduce" else knobs.cp_comm_sms
    return PartitionSpace(clocks, np.asarray(sms, dtype=np.int64),
                          partition_windows(len(part.compute)))


def search_partitions(problem: Problem, settings: KareusSettings = KareusSettings()
                      ) -> dict[Partition, SearchResult]:
    """Search every distinct partition of the iteration (identical partitions of different
    stages are searched once) with ``settings``' strategy and budget."""
    strategy = make_search(settings.search)
    rng = np.random.default_rng(problem.seed)
    distinct = list(dict.fromkeys(part for key in sorted(problem.graph.instruction_graphs)
                                  for part in problem.graph.instruction_graphs[key].partitions))
    results: dict[Partition, SearchResult] = {}
    task = problem.progress.start("kareus: partition searches", total=len(distinct))
    try:
        for part in distinct:
            ev = Evaluator(problem.backend, part, partition_space(part, problem.knobs))
            results[part] = strategy.search(ev, settings.budget, rng)
            task.advance()
    finally:
        task.done()
    return results


def kareus_options(problem: Problem, settings: KareusSettings = KareusSettings()
                   ) -> dict[tuple[int, Direction], list[Option]]:
    """Execution options of every instruction type (steps 1 and 2)."""
    results = search_partitions(problem, settings)
    return {key: instruction_options(problem.backend, problem.graph, key, results,
                                     problem.knobs.clocks_mhz)
            for key in sorted(problem.graph.instruction_graphs)}


class Kareus:
    """Joint clock and fine-grained schedule optimization (Kareus, OSDI '26)."""

    name = "kareus"
    Settings = KareusSettings

    def __init__(self, settings: KareusSettings | None = None) -> None:
        self.settings = KareusSettings() if settings is None else settings

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        options = kareus_options(problem, self.settings)
        subsets = {"sequential": baseline_options(problem, nanobatched=False)}
        if default_schedules_in_space(problem):
            subsets["default schedules"] = baseline_options(problem, nanobatched=True)
        every = {key: union_of_options(options[key], *(sub[key] for sub in subsets.values()))
                 for key in options}
        # the knobs are the instructions' plans
        plans = tradeoff_plans(problem, options, _knob_plan, "kareus", reclaim_from=every,
                               settings=self.settings)
        # the same options solve to the same plans: where nothing nanobatches, Kareus's options
        # are Perseus's (in another order) and that solve is not run again
        solved = [_as_sets(options)]
        for name, sub in subsets.items():
            if _as_sets(sub) in solved:
                continue
            plans += tradeoff_plans(problem, sub, _knob_plan, f"kareus {name}",
                                    reclaim_from=every, settings=self.settings)
            solved.append(_as_sets(sub))
        return plans


def _as_sets(options: Mapping[tuple[int, Direction], Sequence[Option]]
             ) -> dict[tuple[int, Direction], frozenset[Option]]:
    """Each instruction type's options as a set: what a solve depends on, not their order."""
    return {key: frozenset(opts) for key, opts in options.items()}


def default_schedules_in_space(problem: Problem) -> bool:
    """Whether the problem nanobatches at all and its knob space holds the library's kernel for
    every collective its partitions overlap (the default schedules, Nanobatching + Perseus's)."""
    parts = [p for ig in problem.graph.instruction_graphs.values() for p in ig.partitions]
    return bool(parts) and all(
        LIBRARY_DEFAULT in partition_space(p, problem.knobs).comm_sms for p in parts)


def _knob_plan(knob: Hashable) -> InstructionPlan:
    """The instruction plan a Kareus option's knob is (the knob itself); :class:`TypeError` for
    any other knob."""
    if not isinstance(knob, InstructionPlan):
        raise TypeError(f"a Kareus knob is an instruction plan, got {knob!r}")
    return knob


def baseline_options(problem: Problem, nanobatched: bool
                     ) -> dict[tuple[int, Direction], list[Option]]:
    """Every instruction type at each clock of the knob space, sequential (Perseus's options) or
    nanobatched with the default collective schedules (Nanobatching + Perseus's), with the
    instruction plans as knobs."""
    plans = [InstructionPlan.make(float(clock), nanobatched)
             for clock in problem.knobs.clocks_mhz]
    return profile_instructions(problem.backend, problem.graph, plans, _knob_plan)


def union_of_options(first: list[Option], *others: list[Option]) -> list[Option]:
    """``first`` and, in order, the options of ``others`` whose knob (instruction plan) is not
    already among them."""
    out, seen = list(first), {o.knob for o in first}
    for opts in others:
        for o in opts:
            if o.knob not in seen:
                out.append(o)
                seen.add(o.knob)
    return out
