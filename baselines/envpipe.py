"""EnvPipe (ATC '23), as the Perseus authors emulated it on profiles.

Keep the pipeline's **outer envelope** at the top clock: every instruction of the last stage, the
first forward and the last backward of every stage. Every other instruction starts at its slowest
Pareto-optimal clock, which is its minimum-energy clock. Then, repeatedly, take one critical path
of the 1F1B iteration and raise the instructions on it that sit at the path's lowest clock by one
clock step, until the path taken is the envelope. One plan, near the fastest time.

As in the Perseus authors' ``lowtime/scripts/envpipe.py`` (Perseus artifact, ``ml-energy/zeus``
branch ``kronos``): critical paths are found on times quantized down to the emulation's unit, but
the iteration time reported is the *measured* length of the path the procedure stops on (their
``iter_time += ...real_time``), not the quantized schedule's, which is 0.2 - 0.7 % shorter on
their profiles. Remaining difference: of several tied critical paths they take the first that
networkx enumerates on lowtime's activity-on-arc graph, we the one :func:`kareus.graph.
critical_path` traces back; the times agree, clocks off the envelope can differ by a step
(energy within 0.2 % on their profiles).

One algorithm, two inputs: :func:`envpipe_clocks` takes each instruction type's options (time,
energy, clock), which come from a measured profile (``kareus envpipe``, :mod:`baselines.profiles`)
or from profiling the problem's backend (the ``envpipe`` optimizer below).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from baselines.profiles import check_arguments, frequencies_record
from kareus.energy import iteration_energy
from kareus.errors import JobRefused
from kareus.frontier import undominated
from kareus.graph import (
    Direction,
    Instruction,
    boundary_delays,
    critical_path,
    dependency_delay,
    one_f_one_b,
    schedule_times,
)
from kareus.methods.profiling import profile_instructions, profile_to_options
from kareus.methods.slack import replay_knobs
from kareus.methods.solver_units import whole_dag_problem
from kareus.methods.tradeoff import Option, stage_waits, wait_before, with_first_forward_waits
from kareus.plan import InstructionPlan, IterationPlan
from kareus.plugins import Problem

if TYPE_CHECKING:
    import pandas as pd


def in_envelope(ins: Instruction, stages: int, microbatches: int) -> bool:
    """Whether ``ins`` is on the outer envelope: the last stage, or a stage's first forward or
    last backward."""
    return (ins.stage == stages - 1
            or (ins.direction == "forward" and ins.microbatch == 0)
            or (ins.direction == "backward" and ins.microbatch == microbatches - 1))


@dataclass(frozen=True)
class EnvPipeRun:
    """What :func:`envpipe_run` ends with.

    Attributes:
        clocks: The clock (knob, MHz) of every instruction.
        path: The critical path the procedure stopped on, first instruction first (the
            envelope, unless no clock on the path could be raised any more).
        time_s: The iteration time as the authors report it (s): the *measured* times of the
            instructions on ``path`` (their options at the chosen clocks, not quantized) plus
            the transfers between stages along it.
        steps: Raising steps taken (each raised one clock step on one critical path).
    """

    clocks: dict[Instruction, float]
    path: tuple[Instruction, ...]
    time_s: float
    steps: int


def starting_clock(options: Sequence[Option], unit_time_s: float = 0.0) -> Hashable:
    """The clock an instruction off the envelope starts at: the slowest Pareto-optimal one.

    As lowtime's ``CandidateExecutionOptions`` (which the authors' script starts every
    instruction from) defines it: an option is Pareto-optimal unless another is strictly faster
    *and* strictly cheaper (measured time s, energy J); of the Pareto-optimal options with the
    largest time quantized down to ``unit_time_s``, the most energetic one (the one whose
    quantized time is closest to its measured time). With ``unit_time_s`` 0, simply the slowest
    Pareto-optimal option.
    """
    times, energies = [o.time_s for o in options], [o.energy_j for o in options]
    keep = undominated(times, energies, times, energies, strict=True)
    pareto = [o for o, kept in zip(options, keep) if kept]
    slowest = max(_quantized(o.time_s, unit_time_s) for o in pareto)
    return max((o for o in pareto if _quantized(o.time_s, unit_time_s) == slowest),
               key=lambda o: (o.energy_j, o.time_s)).knob


def clock_knob(knob: Hashable) -> float:
    """An option's knob as the clock (MHz) it must be for EnvPipe, which raises clocks step by
    step: the knob itself (an ``int`` stays one); :class:`TypeError` for any other knob."""
    if not isinstance(knob, (int, float)):
        raise TypeError(f"EnvPipe needs clock knobs (MHz), got {knob!r}")
    return knob


def envpipe_run(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                microbatches: int, p2p_s: float | Sequence[float] = 0.0,
                unit_time_s: float = 0.0,
                first_forward_wait_s: Sequence[float] | None = None) -> EnvPipeRun:
    """EnvPipe's procedure, as the Perseus authors' ``lowtime/scripts/envpipe.py`` runs it.

    1. The envelope (:func:`in_envelope`) runs at the top clock; every other instruction starts
       at :func:`starting_clock`.
    2. Repeatedly: take one critical path of the 1F1B iteration (on times quantized down to
       ``unit_time_s``), raise the instructions on it that sit at the path's lowest clock by one
       clock step, and stop once that path lies on the envelope. (Not once the envelope is
       *a* critical path: while another path ties with it, that one is raised too.) It also
       stops when no instruction on the path can be raised.
    3. The iteration time is the path's measured length (:attr:`EnvPipeRun.time_s`).

    Args:
        options: Each (stage, direction)'s options (measured time s, energy J, clock MHz: a
            number, :func:`clock_knob`); a type's sorted clocks are its clock steps.
        stages: Pipeline stages.
        microbatches: Microbatches per iteration.
        p2p_s: Activation transfer between stages (s), on every cross-stage dependency and on
            the sender's own next instruction (:func:`kareus.graph.dependency_delay`): one
            time for every boundary, or one per boundary (``b``: between stages ``b``, ``b + 1``).
        unit_time_s: When positive, the critical path is found on instruction times quantized
            down to this unit (the Perseus emulation's time unit); 0 uses the measured times.
        first_forward_wait_s: Per stage, the wait (s) before its first forward's work
            (:func:`kareus.methods.tradeoff.stage_waits`); ``None`` for none.
    """
    waits = stage_waits(stages, first_forward_wait_s)
    clocks = {k: sorted(clock_knob(o.knob) for o in opts) for k, opts in options.items()}
    measured = {k: {o.knob: o.time_s for o in opts} for k, opts in options.items()}
    time_of = {k: {c: _quantized(t, unit_time_s) for c, t in m.items()}
               for k, m in measured.items()}
    start = {k: clock_knob(starting_clock(opts, unit_time_s)) for k, opts in options.items()}
    order = [ins for seq in one_f_one_b(stages, microbatches).values() for ins in seq]
    clock = {ins: clocks[ins.type_key][-1] if in_envelope(ins, stages, microbatches)
             else start[ins.type_key] for ins in order}
    steps = 0
    while True:
        durations = with_first_forward_waits(
            {ins: time_of[ins.type_key][clock[ins]] for ins in order}, waits)
        times = schedule_times(stages, microbatches, durations, p2p_s)
        path = critical_path(stages, microbatches, times, p2p_s)
        raisable = [ins for ins in path if clock[ins] != clocks[ins.type_key][-1]]
        if all(in_envelope(ins, stages, microbatches) for ins in path) or not raisable:
            break
        low = min(clock[ins] for ins in raisable)
        for ins in raisable:
            if clock[ins] == low:
                c = clocks[ins.type_key]
                clock[ins] = c[c.index(low) + 1]
        steps += 1
    delays = boundary_delays(stages, p2p_s)
    hops = sum(dependency_delay(a, b, stages, delays) for a, b in zip(path, path[1:]))
    length = (sum(measured[ins.type_key][clock[ins]] for ins in path) + hops
              + sum(wait_before(ins, waits) for ins in path))
    return EnvPipeRun(clock, tuple(path), length, steps)


def envpipe_clocks(options: Mapping[tuple[int, Direction], Sequence[Option]], stages: int,
                   microbatches: int, p2p_s: float | Sequence[float] = 0.0,
                   unit_time_s: float = 0.0,
                   first_forward_wait_s: Sequence[float] | None = None
                   ) -> dict[Instruction, float]:
    """EnvPipe's knob (clock, MHz) for every instruction (:func:`envpipe_run`'s clocks)."""
    return envpipe_run(options, stages, microbatches, p2p_s, unit_time_s,
                       first_forward_wait_s).clocks


def _quantized(time_s: float, unit_time_s: float) -> float:
    """``time_s`` rounded down to a whole number of ``unit_time_s`` (s); as is when 0."""
    return (time_s // unit_time_s) * unit_time_s if unit_time_s > 0 else time_s


def envpipe_on_profile(profile: pd.DataFrame, stages: int, microbatches: int,
                       static_power_w: float, *, unit_time_s: float = 1e-3) -> list[dict]:
    """EnvPipe on a Zeus-format profile: one point, as the authors' script reports it.

    The procedure finds critical paths on instruction times quantized down to ``unit_time_s``
    (the Perseus emulation's unit); the iteration time is the measured length of the path it
    stops on (:func:`envpipe_run`), and the energy is every instruction's
    measured energy plus every GPU's static power over its idle time in that iteration.
    Also returns the plan replayed on the profile (``replayed_time_s``, ``replayed_energy_j``:
    :func:`kareus.methods.slack.replay_knobs`, as ``kareus perseus`` does) and the raising
    ``steps`` taken.
    """
    options = profile_to_options(profile)
    run = envpipe_run(options, stages, microbatches, unit_time_s=unit_time_s)
    replayed = replay_knobs(run.clocks, options, stages, microbatches, static_power_w)
    # as the authors' script reports it: the same dynamic energy, static power over its own time
    energy = iteration_energy(replayed.dynamic_j, stages, static_power_w, run.time_s).total_j
    return [{"time_s": run.time_s, "energy_j": energy, "replayed_time_s": replayed.time_s,
             "replayed_energy_j": replayed.energy_j, "steps": run.steps,
             "frequencies": frequencies_record(run.clocks)}]


class EnvPipe:
    """EnvPipe on the problem's backend: its instructions profiled per clock (sequential
    execution), then :func:`envpipe_clocks`."""

    name = "envpipe"

    def optimize(self, problem: Problem) -> list[IterationPlan]:
        g, backend = problem.graph, problem.backend
        too_long = whole_dag_problem(g.stages, g.microbatches, "EnvPipe")
        if too_long:
            raise JobRefused(too_long)
        plan_at = {c: InstructionPlan.make(c) for c in problem.knobs.clocks_mhz}
        options = profile_instructions(backend, g, sorted(plan_at),
                                       lambda c: plan_at[clock_knob(c)])
        clock = envpipe_clocks(options, g.stages, g.microbatches, backend.p2p_times(g),
                               first_forward_wait_s=backend.first_forward_waits(g))
        return [IterationPlan({ins: plan_at[c] for ins, c in clock.items()}, label="envpipe")]

    def on_profile(self, profile: pd.DataFrame, source: str, stages: int, microbatches: int,
                   static_power_w: float, *, unit_time_s: float,
                   **options: object) -> list[dict]:
        """envpipe on a measured Zeus-format profile (``kareus envpipe``): the arguments checked
        (:func:`baselines.profiles.check_arguments`), then :func:`envpipe_on_profile`."""
        check_arguments(profile, source, stages, microbatches, static_power_w, unit_time_s)
        options.pop("progress", None)  # about a second: nothing to report
        return envpipe_on_profile(profile, stages, microbatches, static_power_w,
                                  unit_time_s=unit_time_s, **options)
