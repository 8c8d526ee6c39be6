"""Profiling instruction types on a backend, the way Perseus profiles a real job.

Every (stage, forward/backward) is run at each candidate knob and recorded as one GPU's measured
time and energy (dynamic plus static, what an energy meter reads), the Zeus profile format.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import pandas as pd

from kareus.backends.base import Backend
from kareus.energy import measured_energy
from kareus.graph import Direction, IterationGraph
from kareus.methods.tradeoff import Option, plans_from_steps, solve
from kareus.plan import InstructionPlan, IterationPlan

if TYPE_CHECKING:
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


def clock_tradeoff_plans(problem: "Problem", *, nanobatched: bool, label: str
                         ) -> list[IterationPlan]:
    """Perseus's procedure on ``problem``: profile every instruction type per clock (sequential,
    or nanobatched with default collective schedules), solve the time–cost tradeoff, and return
    one plan per solver step."""
    opts = problem.options
    make = lambda clock: InstructionPlan.make(float(clock), nanobatched)  # noqa: E731
    options = profile_instructions(problem.backend, problem.graph, problem.knobs.clocks_mhz, make)
    steps = list(solve(options, problem.graph.stages, problem.graph.microbatches,
                       problem.gpu.static_power_w,
                       unit_time_s=float(opts.get("unit_ms", 1.0)) / 1e3,  # type: ignore[arg-type]
                       prefilter=str(opts.get("prefilter", "raw")),  # type: ignore[arg-type]
                       p2p_time_s=problem.backend.p2p_time(problem.graph)))
    return plans_from_steps(steps, make, label)
