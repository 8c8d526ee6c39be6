"""Profiling instruction types on a backend, the way Perseus profiles a real job.

Every (stage, forward/backward) is run at each candidate knob and recorded as one GPU's measured
time and energy (dynamic plus static, what an energy meter reads), the Zeus profile format.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from kareus.backends.base import Backend
from kareus.energy import measured_energy
from kareus.errors import JobRefused
from kareus.graph import Direction, IterationGraph
from kareus.methods.slack import SlackReclaimer
from kareus.methods.solver_units import (
    MAX_STEPS,
    MIN_STEPS,
    plan_budget,
    solver_span,
    time_unit,
    unit_problem,
    whole_dag_problem,
)
from kareus.methods.tradeoff import (
    PERSEUS_UNIT_S,
    Option,
    Prefilter,
    fastest_plan,
    plans_from_steps,
    solve,
)
from kareus.plan import InstructionPlan, IterationPlan
from kareus.plugins import OptimizerSettings, require

if TYPE_CHECKING:
    import pandas as pd

    from kareus.plugins import Problem


def profile_instructions(backend: Backend, graph: IterationGraph, knobs: Sequence[Hashable],
                         make_plan: Callable[[Hashable], InstructionPlan]
                         ) -> dict[tuple[int, Direction], list[Option]]:
    """Options of every instruction type: ``make_plan(knob)`` run on ``backend`` per knob."""
    out: dict[tuple[int, Direction], list[Option]] = {}
    for key in sorted(graph.instruction_graphs):
        opts = []
        for knob in knobs:
            cost = backend.evaluate_instruction(graph, key, make_plan(knob))
            opts.append(Option(cost.time_s, measured_energy(cost.dynamic_energy_j,
                                                            backend.gpu.static_power_w,
                                                            cost.time_s), knob))
        out[key] = opts
    return out


def profile_to_options(profile: pd.DataFrame) -> dict[tuple[int, Direction], list[Option]]:
    """A validated Zeus-format profile as options keyed by (stage, direction), clock knobs."""
    out: dict[tuple[int, Direction], list[Option]] = {}
    for (stage, ins), g in profile.groupby(["stage", "instruction"], sort=True):
        out[(int(stage), ins)] = [Option(float(r.time), float(r.energy), int(r.frequency))
                                  for r in g.itertuples()]
    return out


#: How the iteration-level tradeoff is solved (:attr:`TradeoffSettings.solver`).
Solver = Literal["fast", "exact"]
SOLVERS: tuple[str, ...] = get_args(Solver)


@dataclass(frozen=True)
class TradeoffSettings(OptimizerSettings):
    """Settings of the iteration-level time–cost tradeoff (Perseus, Nanobatching + Perseus and
    Kareus declare them; ``--set NAME=VALUE``, ``kareus frontier --solver``)."""

    solver: Solver = "fast"
    """``fast`` folds the steady state of long pipelines
    (:func:`kareus.methods.tradeoff.folded_microbatches`), coarsens the unit when a solve would
    take more than ``max_steps`` steps and refines it when it would take fewer than
    ``min_steps`` (:func:`~kareus.methods.solver_units.time_unit`) and keeps at
    most :func:`~kareus.methods.solver_units.plan_budget` plans spread over the solve; ``exact``
    solves the whole DAG as Perseus does, lowtime's steps exactly, and keeps every step."""
    unit_ms: float | None = None
    """The solver's time unit (ms); none given: Perseus's 1 ms, or the fastest instruction's
    time where that is shorter (:data:`~kareus.methods.tradeoff.PERSEUS_UNIT_S`)."""
    prefilter: Prefilter = "raw"
    """Pareto pre-filter of each instruction type's options, on raw or static-adjusted energy
    (:func:`kareus.methods.tradeoff.solve`)."""
    max_steps: int = MAX_STEPS
    """``fast`` solver: the most steps a solve may take (steps, not ms); beyond it the unit
    coarsens."""
    min_steps: int = MIN_STEPS
    """``fast`` solver: below this many steps (or ``max_steps``, if fewer) the unit refines
    (``1`` keeps the unit)."""
    reclaim: bool = False
    """Give every kept plan's instructions the least-energy measured option their slack allows
    (:class:`~kareus.methods.slack.SlackReclaimer`) after the solve. Perseus's procedure does
    not (``false``); Kareus does by default: ``--set reclaim=`` on both measures what it adds.
    The fastest-option plan that ends every solve's plans is reclaimed either way
    (:func:`tradeoff_plans`)."""

    def check(self) -> None:
        require(self.unit_ms is None or self.unit_ms > 0, "unit_ms", "a positive number of ms",
                self.unit_ms)
        require(self.max_steps >= 1, "max_steps", "a positive integer", self.max_steps)
        require(self.min_steps >= 1, "min_steps", "a positive integer", self.min_steps)

    def unused(self) -> frozenset[str]:
        """The exact solver steps lowtime's whole DAG at the unit given: its step bounds change
        nothing."""
        return frozenset({"max_steps", "min_steps"}) if self.solver == "exact" else frozenset()


def tradeoff_plans(problem: "Problem", options: dict[tuple[int, Direction], list[Option]],
                   make_plan: Callable[[Hashable], InstructionPlan], label: str,
                   reclaim_from: Mapping[tuple[int, Direction], Sequence[Option]] | None = None,
                   settings: TradeoffSettings = TradeoffSettings()) -> list[IterationPlan]:
    """Solve the time–cost tradeoff over ``options`` on ``problem`` and return the plans, as
    ``settings`` say (:class:`TradeoffSettings`: the solver, its time unit, the pre-filter). With
    ``settings.reclaim``, every kept plan's instructions are given the least-energy option their
    slack allows (:class:`~kareus.methods.slack.SlackReclaimer`) among ``reclaim_from`` (options
    per instruction type, those of ``options`` among them; ``None``: ``options``). The plans
    end with every instruction at its fastest option, then reclaimed as above whatever
    ``settings.reclaim`` says (:func:`~kareus.methods.tradeoff.fastest_plan`), unless the last
    step's plan is that one.
    """
    graph = problem.graph
    fast = settings.solver == "fast"
    p2p = problem.backend.p2p_times(graph)  # each boundary's own, as the iteration runs them
    waits = problem.backend.first_forward_waits(graph)
    times = [o.time_s for opts in options.values() for o in opts]
    if settings.unit_ms is None:
        unit = min(PERSEUS_UNIT_S, min(times))
        named = f"the solver's time unit ({unit * 1e3:.4g} ms; --set unit_ms gives another)"
    else:
        unit, named = settings.unit_ms / 1e3, f"--set unit_ms={settings.unit_ms:g}"
    why = unit_problem(unit, times, exact=not fast)
    if why:
        raise JobRefused(f"{named}: {why}")
    too_long = "" if fast else whole_dag_problem(graph.stages, graph.microbatches,
                                                 "the exact solve")
    if too_long:
        raise JobRefused(f"--solver exact: {too_long}; the fast solver folds long pipelines")
    # the folded DAG's steady blocks stand for the rest of the iteration: the solve spans all of it
    span = solver_span(options, graph.stages, graph.microbatches, p2p, waits)
    if fast:
        unit = time_unit(span, unit, settings.max_steps,
                         min(settings.min_steps, settings.max_steps))
    task = problem.progress.start(f"{label}: solver steps", total=max(1, round(span / unit)))
    steps = []
    try:
        for step in solve(options, graph.stages, graph.microbatches, problem.gpu.static_power_w,
                          unit_time_s=unit, prefilter=settings.prefilter, p2p_time_s=p2p,
                          first_forward_wait_s=waits, fast=fast):
            steps.append(step)
            task.advance()
    finally:
        task.done()
    instructions = 2 * graph.stages * graph.microbatches
    limit = plan_budget(instructions) if fast else None
    reclaimer = SlackReclaimer(options if reclaim_from is None else reclaim_from, graph.stages,
                               graph.microbatches, problem.gpu.static_power_w, p2p,
                               first_forward_wait_s=waits)
    plans = plans_from_steps(steps, make_plan, label, limit,
                             reclaimer if settings.reclaim else None)
    # The frontier's fast end is the option space's own, whatever the solver's unit rounded. It
    # is always reclaimed: at every fastest option, the instructions off the critical path would
    # spend the top clock's energy for no time (the solver's own steps leave them slower).
    fastest = fastest_plan(options, graph.stages, graph.microbatches, make_plan, label,
                           reclaimer)
    if not plans or fastest.instructions != plans[-1].instructions:
        plans.append(fastest)
    return plans


def clock_tradeoff_plans(problem: "Problem", *, nanobatched: bool, label: str,
                         settings: TradeoffSettings = TradeoffSettings()) -> list[IterationPlan]:
    """Perseus's procedure on ``problem``: profile every instruction type per clock (sequential,
    or nanobatched with default collective schedules), solve the time–cost tradeoff
    (:func:`tradeoff_plans` with ``settings``), and return one plan per solver step."""
    make = lambda clock: InstructionPlan.make(float(clock), nanobatched)  # noqa: E731
    options = profile_instructions(problem.backend, problem.graph, problem.knobs.clocks_mhz, make)
    return tradeoff_plans(problem, options, make, label, settings=settings)
