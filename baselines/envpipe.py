"""EnvPipe (ATC '23), as the Perseus authors emulated it on profiles.

Keep the pipeline's **outer envelope** at the top clock: every instruction of the last stage, the
first forward and the last backward of every stage. Every other instruction starts at its slowest
Pareto-optimal clock, which is its minimum-energy clock. Then, repeatedly, take one critical path
of the 1F1B iteration and raise the instructions on it that sit at the path's lowest clock by one
clock step, until the envelope is critical (the iteration is as long as the envelope path). One
plan, near the fastest time.

One algorithm, two inputs: :func:`envpipe_clocks` takes each instruction type's options (time,
energy, clock), which come from a measured profile (``kareus envpipe``, :mod:`baselines.profiles`)
or from profiling the problem's backend (the ``envpipe`` optimizer below).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import pandas as pd

from kareus.frontier import pareto_indices
from kareus.graph import Direction, Instruction, critical_path, one_f_one_b, schedule_times
from kareus.methods.profiling import profile_instructions
from kareus.methods.tradeoff import Option
from kareus.plan import InstructionPlan, IterationPlan
from kareus.plugins import Problem

#: Relative tolerance of "the iteration is as long as the envelope" (float sums).
_TOLERANCE = 1e-9


def in_envelope(ins: Instruction, stages: int, microbatches: int) -> bool:
    """Whether ``ins`` is on the outer envelope: the last stage, or a stage's first forward or
    last backward."""
    return (ins.stage == stages - 1
            or (ins.direction == "forward" and ins.microbatch == 0)
            or (ins.direction == "backward" and ins.microbatch == microbatches - 1))


def envelope_time(durations: Mapping[Instruction, float], stages: int, microbatches: int,
                  p2p_s: float = 0.0) -> float:
    """Length of the envelope path (s): the first forward through every stage, all of the last
    stage, the last backward back through every stage, and the transfers between stages."""
    last = stages - 1
    t = sum(durations[Instruction(s, 0, "forward")] + durations[Instruction(s, microbatches - 1,
                                                                             "backward")]
            for s in range(last))
    t += sum(durations[Instruction(last, m, d)] for m in range(microbatches)
             for d in ("forward", "backward"))
    return t + 2 * last * p2p_s


def envpipe_clocks(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                   microbatches: int, p2p_s: float = 0.0, unit_time_s: float = 0.0
                   ) -> dict[Instruction, Hashable]:
    """EnvPipe's knob (clock) for every instruction.

    Args:
        options: Each (stage, direction)'s options (measured time s, energy J, clock MHz); the
            clocks must be comparable, and a type's sorted clocks are its clock steps.
        stages: Pipeline stages.
        microbatches: Microbatches per iteration.
        p2p_s: Activation transfer between stages (s), on every cross-stage dependency.
        unit_time_s: When positive, instruction times are quantized down to this unit (the
            Perseus emulation's time unit); 0 uses the measured times.
    """
    clocks = {k: sorted(o.knob for o in opts) for k, opts in options.items()}  # type: ignore[type-var]
    time_of = {k: {o.knob: _quantized(o.time_s, unit_time_s) for o in opts}
               for k, opts in options.items()}
    slowest = {}
    for k, opts in options.items():
        keep = pareto_indices([o.time_s for o in opts], [o.energy_j for o in opts])
        slowest[k] = max((opts[i] for i in keep), key=lambda o: o.time_s).knob
    order = [ins for seq in one_f_one_b(stages, microbatches).values() for ins in seq]
    clock = {ins: clocks[ins.type_key][-1] if in_envelope(ins, stages, microbatches)
             else slowest[ins.type_key] for ins in order}
    for _ in range(sum(len(c) for c in clocks.values()) * len(order) + 1):
        durations = {ins: time_of[ins.type_key][clock[ins]] for ins in order}
        times = schedule_times(stages, microbatches, durations, p2p_s)
        total = max(end for _, end in times.values())
        if total <= envelope_time(durations, stages, microbatches, p2p_s) * (1 + _TOLERANCE):
            break
        path = [ins for ins in critical_path(stages, microbatches, times, p2p_s)
                if clock[ins] != clocks[ins.type_key][-1]]
        if not path:
            break
        low = min(clock[ins] for ins in path)  # type: ignore[type-var]
        for ins in path:
            if clock[ins] == low:
                steps = clocks[ins.type_key]
                clock[ins] = steps[steps.index(low) + 1]
    return clock


def _quantized(time_s: float, unit_time_s: float) -> float:
    return (time_s // unit_time_s) * unit_time_s if unit_time_s > 0 else time_s


class EnvPipe:
    """EnvPipe on the problem's backend: its instructions profiled per clock (sequential
    execution), then :func:`envpipe_clocks`."""

    name = "envpipe"

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        g, backend = problem.graph, problem.backend
        plan_at = {c: InstructionPlan.make(c) for c in problem.knobs.clocks_mhz}
        options = profile_instructions(backend, g, sorted(plan_at), lambda c: plan_at[c])  # type: ignore[index]
        clock = envpipe_clocks(options, g.stages, g.microbatches, backend.p2p_time(g))
        return [IterationPlan({ins: plan_at[c] for ins, c in clock.items()},  # type: ignore[index]
                              label="envpipe")]

    def on_profile(self, profile: pd.DataFrame, source: str, stages: int, microbatches: int,
                   static_power_w: float, *, unit_time_s: float,
                   **options: object) -> list[dict]:
        """envpipe on a measured Zeus-format profile (``kareus envpipe``); see
        :func:`baselines.profiles.run_on_profile`."""
        from baselines.profiles import run_on_profile

        return run_on_profile(self.name, profile, source, stages, microbatches, static_power_w,
                              unit_time_s=unit_time_s, **options)
