"""The baselines that run on a measured profile: Perseus and EnvPipe, one command shape.

A Zeus-format profile (``stage,instruction,frequency,time,energy``, see
:mod:`kareus.hardware.profile`) gives each pipeline instruction type's measured time and energy
per SM clock, one microbatch on one GPU. That is all Perseus and EnvPipe need: both choose one
clock per instruction of the 1F1B iteration. The other baselines cannot run on such a profile:
Megatron-LM's plan is the top clock of the same profile (Perseus's fastest step, no separate
method), while nanobatching, Nanobatching + Perseus, Kareus and the Zeus power limit change *how*
an instruction executes (overlap, SM counts, a power cap), which a clock-only profile never
measured.

``kareus perseus`` and ``kareus envpipe`` reach these through the registry: the optimizer's
``on_profile`` (:class:`kareus.plugins.ProfileRunner`) checks the arguments
(:func:`check_arguments`), then runs :func:`perseus_on_profile` or
:func:`baselines.envpipe.envpipe_on_profile` (EnvPipe's own module owns it); both return point records with ``time_s`` and ``energy_j`` for the
GPUs the profile describes (one per stage, static included), each as its method reports it, and
``replayed_time_s`` / ``replayed_energy_j``, the plan replayed on the profile: the same footing
for both.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING

from kareus.errors import InputError
from kareus.frontier import pareto_indices
from kareus.graph import Instruction
from kareus.hardware.profile import check_clock_sweep, power_problem
from kareus.methods.profiling import profile_to_options
from kareus.methods.slack import replay_knobs
from kareus.methods.solver_units import solver_span, unit_problem, whole_dag_problem
from kareus.methods.tradeoff import PERSEUS_UNIT_S, Prefilter, solve, solver_energy
from kareus.progress import SILENT, Progress

if TYPE_CHECKING:
    import pandas as pd




def check_arguments(profile: pd.DataFrame, source: str, stages: int, microbatches: int,
                    static_power_w: float, unit_time_s: float) -> None:
    """Raise :class:`InputError` (one line) when the arguments do not fit the profile, or the
    profile does not sweep clocks on one grid."""
    check_clock_sweep(profile, source)
    if stages < 1 or microbatches < 1:
        raise InputError("--stages and --microbatches must be positive integers")
    too_long = whole_dag_problem(stages, microbatches, "Perseus's exact solve")
    if too_long:
        raise InputError(f"--stages x --microbatches: {too_long}")
    seen = int(profile.stage.nunique())
    if seen != stages:
        raise InputError(f"{source}: profile has {seen} stages, --stages says {stages}")
    why = power_problem("--p-static", static_power_w)
    if why:
        raise InputError(why)
    why = unit_problem(unit_time_s, profile.time.tolist(), exact=True)
    if why:
        raise InputError(f"--unit-ms {why}")


def frequencies_record(knobs: Mapping[Instruction, Hashable]) -> list[list[Hashable]]:
    """Per stage, the clocks in 1F1B order (the order the knobs come in)."""
    freqs: dict[int, list[Hashable]] = {}
    for ins, knob in knobs.items():
        freqs.setdefault(ins.stage, []).append(knob)
    return [freqs[s] for s in sorted(freqs)]


def perseus_on_profile(profile: pd.DataFrame, stages: int, microbatches: int,
                       static_power_w: float, *, unit_time_s: float = PERSEUS_UNIT_S,
                       prefilter: Prefilter = "raw", all_iterations: bool = False,
                       progress: Progress = SILENT) -> list[dict]:
    """Perseus on a Zeus-format profile, as the authors' driver runs it.

    Returns point records: ``time_s`` and ``energy_j`` as the authors' driver reports them (the
    solver's time, ``quant_time`` units, and its cost plus every stage's static power over that
    time); ``replayed_time_s`` and ``replayed_energy_j``, the same clocks replayed on the
    profile's measured times (:func:`kareus.methods.slack.replay_knobs`, the footing on which
    ``kareus envpipe``'s point compares); solver ``iteration``, ``quant_time``, ``cost`` and the
    per-stage ``frequencies`` in 1F1B order. All steps in solver order with ``all_iterations``,
    else the Pareto-optimal ones sorted by time. ``progress`` counts the solver's steps.
    """
    options = profile_to_options(profile)
    points: list[dict[str, object]] = []
    times: list[float] = []  # the points' time_s and energy_j
    energies: list[float] = []
    span = solver_span(options, stages, microbatches, 0.0)
    task = progress.start("perseus: solver steps", total=max(1, round(span / unit_time_s)))
    try:
        for step in solve(options, stages, microbatches, static_power_w,
                          unit_time_s=unit_time_s, prefilter=prefilter):
            times.append(step.real_time_s)
            energies.append(solver_energy(step, stages, static_power_w))
            replayed = replay_knobs(step.knobs, options, stages, microbatches, static_power_w)
            points.append({"time_s": times[-1], "energy_j": energies[-1],
                           "replayed_time_s": replayed.time_s,
                           "replayed_energy_j": replayed.energy_j,
                           "iteration": step.iteration, "quant_time": step.quant_time,
                           "cost": step.cost, "frequencies": frequencies_record(step.knobs)})
            task.advance()
    finally:
        task.done()
    if all_iterations:
        return points
    keep = pareto_indices(times, energies)
    return [points[i] for i in keep]
