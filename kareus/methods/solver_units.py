"""How finely and how far the time–cost solver runs on a job: the plans it keeps
(:func:`plan_budget`), its time unit against the span between the fastest and most frugal
iteration (:func:`solver_span`, :func:`time_unit`), and the one-line refusals of a unit or a
whole-DAG solve a job cannot take (:func:`unit_problem`, :func:`whole_dag_problem`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from kareus.frontier import least_energy
from kareus.graph import Direction, one_f_one_b
from kareus.methods.tradeoff import Option, stage_waits, with_first_forward_waits


#: Instruction plans (plans × instructions) the fast path materializes and evaluates at most.
PLAN_ENTRIES = 1 << 19


def plan_budget(instructions: int) -> int:
    """Plans to keep from a solve of an iteration of ``instructions`` instructions:
    ``max(64, PLAN_ENTRIES // instructions)``: every step of the paper's 16-GPU jobs (32
    instructions, 16,384 plans), 128 evenly spread steps of a 4,096-instruction job, so that
    memory and evaluation stay bounded whatever the job."""
    return max(64, PLAN_ENTRIES // max(1, instructions))


#: Solver steps the fast solver's time unit keeps a solve under (see time_unit).
MAX_STEPS = 8000
#: Solver steps below which the fast solver refines its time unit (see time_unit).
MIN_STEPS = 100
#: The finest unit a refinement gives (s): a microsecond, the scale of one kernel launch; a
#: span shorter than that is one that clocks barely move, and finer steps would trade noise.
MIN_UNIT_S = 1e-6

#: Most (microbatch, stage) pairs a procedure over the whole 1F1B DAG accepts (Perseus's exact
#: solve, EnvPipe): it takes a step per time unit (or per clock raised), each over the whole DAG,
#: so its work grows with the square of the pairs.
MAX_WHOLE_DAG_SLOTS = 8192
#: Measured reference for the estimate in the refusal: the exact solve of the published
#: gpt3-175b A100 profile, 8 stages x 12 microbatches at 1 ms, took about 4 s (one core).
REFERENCE_SLOTS, REFERENCE_SOLVE_S = 96, 4.0


def whole_dag_problem(stages: int, microbatches: int, what: str) -> str:
    """Why ``what`` (e.g. "Perseus's exact solve") cannot run over the whole DAG of ``stages``
    x ``microbatches`` pairs in reasonable time ("" when it can): more than
    :data:`MAX_WHOLE_DAG_SLOTS`, with an estimate of its time (h)."""
    slots = stages * microbatches
    if slots <= MAX_WHOLE_DAG_SLOTS:
        return ""
    hours = REFERENCE_SOLVE_S * (slots / REFERENCE_SLOTS) ** 2 / 3600
    return (f"{stages} stages x {microbatches} microbatches = {slots:,} (microbatch, stage) "
            f"pairs; the solve's work grows with their square ({what}: about {hours:,.0f} h "
            f"here); at most {MAX_WHOLE_DAG_SLOTS:,}")


#: Most time units the slowest instruction may span in an exact solve (Perseus's): it trades
#: iteration time one unit per step, so its work grows as the unit shrinks (on the shared GPT-3
#: 175B A100 profile, whose slowest instruction takes 150 ms: 2.8 s at 1 ms, 48 s at 0.03 ms).
MAX_UNITS_PER_INSTRUCTION = 10_000


def unit_problem(unit_s: float, times_s: Sequence[float], *, exact: bool) -> str:
    """Why the solver's time unit ``unit_s`` (s) cannot quantise instructions that take
    ``times_s`` (s); '' when it can. It must be a finite positive time no longer than the
    fastest instruction (which would round to no time at all), and for an ``exact`` solve (the
    fast one coarsens its unit itself, :func:`time_unit`) no finer than the slowest's
    1/:data:`MAX_UNITS_PER_INSTRUCTION`."""
    ms = unit_s * 1e3
    if not (unit_s > 0 and math.isfinite(unit_s)):
        return f"{ms} is not a positive number of ms"
    fastest, slowest = min(times_s), max(times_s)
    if unit_s > fastest:
        return (f"{ms:g} ms is longer than the fastest instruction ({fastest * 1e3:.4g} ms), "
                f"which would round to no time at all; use at most {fastest * 1e3:.4g}")
    if exact and slowest / unit_s > MAX_UNITS_PER_INSTRUCTION:
        return (f"{ms:g} ms: the slowest instruction ({slowest * 1e3:.4g} ms) spans "
                f"{slowest / unit_s:,.0f} units and the solver trades time one unit per step; at "
                f"most {MAX_UNITS_PER_INSTRUCTION:,} (use at least "
                f"{slowest * 1e3 / MAX_UNITS_PER_INSTRUCTION:.3g} here)")
    return ""


def solver_span(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                microbatches: int, p2p_time_s: float | Sequence[float],
                first_forward_wait_s: Sequence[float] | None = None) -> float:
    """How much a solve shortens the iteration (s): from every instruction at its slowest
    Pareto-optimal option (its least-energy one) to every one at its fastest, both timed on the
    1F1B schedule of ``microbatches`` (:func:`kareus.graph.schedule_times`, with the stages'
    first-forward waits, :func:`stage_waits`). Each solver step shortens it by one time unit."""
    from kareus.graph import schedule_times

    waits = stage_waits(stages, first_forward_wait_s)

    def iteration(pick: Callable[[Sequence[Option]], float]) -> float:
        durations = with_first_forward_waits(
            {ins: pick(options[(ins.stage, ins.direction)])
             for seq in one_f_one_b(stages, microbatches).values() for ins in seq}, waits)
        return max(end for _, end in schedule_times(stages, microbatches, durations,
                                                    p2p_time_s).values())

    fastest = lambda opts: min(o.time_s for o in opts)  # noqa: E731
    frugal = lambda opts: opts[least_energy([o.time_s for o in opts],  # noqa: E731
                                            [o.energy_j for o in opts])].time_s
    return iteration(frugal) - iteration(fastest)


def time_unit(span_s: float, base_unit_s: float, max_steps: int = MAX_STEPS,
              min_steps: int = MIN_STEPS) -> float:
    """The fast solver's time unit (s): the smallest whole multiple of ``base_unit_s`` for which
    a solve over ``span_s`` (:func:`solver_span`) takes at most ``max_steps`` steps; where the
    span holds fewer than ``min_steps`` units, ``span_s / min_steps`` instead, so that a job of
    short instructions still has a frontier to trade along (at 1 ms a span of 3 ms would give
    three steps), but no finer than :data:`MIN_UNIT_S`. Perseus's 1 ms stays the unit for every
    job whose span is between ``min_steps`` and ``max_steps`` ms; ``min_steps`` 1 keeps it."""
    if min_steps > 1 and 0 < span_s < base_unit_s * min_steps:
        return max(span_s / min_steps, min(MIN_UNIT_S, base_unit_s))
    return base_unit_s * max(1, math.ceil(span_s / (base_unit_s * max_steps)))
