"""The incremental Phillips–Dessouky solver, the folded fast solve, and linear 1F1B timing."""

import random

import numpy as np
import pytest

# The solver stands on lowtime, which GPU images lack: skip, never break `pytest -m gpu`'s
# collection (tests/test_gpu_scripts.py holds this).
pytest.importorskip("lowtime.solver")

from kareus.graph import Instruction, dag_dependencies, one_f_one_b, schedule_times
from kareus.methods.phillips_dessouky import IncrementalPhillipsDessouky, min_cut
from kareus.methods.profiling import profile_instructions
from kareus.methods.tradeoff import (
    Option,
    build_1f1b_dag,
    folded_microbatches,
    folded_source,
    solve,
    spread_steps,
    steady_cut,
)
from kareus.plan import InstructionPlan
from kareus.suite.problem import make_problem


def _simulated_options(stages, microbatches):
    problem = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=stages, mbs=2,
                           microbatches=microbatches)
    make = lambda c: InstructionPlan.make(float(c), False)  # noqa: E731
    options = profile_instructions(problem.backend, problem.graph,
                                   problem.knobs.clocks_mhz[::3], make)
    return problem, options


def _lowtime_dag(options, stages, microbatches):
    """A fresh lowtime DAG of ``options`` (solvers change their operations in place)."""
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward

    from kareus.methods.cost_models import fit_exponential_model

    spec_map = {}
    for s in range(stages):
        spec_map[s] = {}
        for direction, cls in (("forward", Forward), ("backward", Backward)):
            opts = [ExecutionOption[int](real_time=o.time_s, unit_time=1e-3, cost=o.energy_j,
                                         knob=k) for k, o in enumerate(options[(s, direction)])]
            cand = CandidateExecutionOptions[int](options=opts)
            spec_map[s][cls] = OperationSpec[int](options=cand,
                                                  cost_model=fit_exponential_model(cand))
    return build_1f1b_dag(spec_map, stages, microbatches)


def _trace(solver, nodes):
    return [(r.iteration, r.quant_time, r.cost, tuple(lt.assigned_knob for _, lt in nodes))
            for r in solver.run()]


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 6)])
def test_incremental_solver_is_lowtimes_step_for_step(stages, microbatches):
    from lowtime.solver import PhillipsDessouky

    _, options = _simulated_options(stages, microbatches)
    dag, nodes = _lowtime_dag(options, stages, microbatches)
    reference = _trace(PhillipsDessouky(dag), nodes)
    dag, nodes = _lowtime_dag(options, stages, microbatches)
    ours = _trace(IncrementalPhillipsDessouky(dag, cut="lowtime"), nodes)
    assert len(reference) > 20
    assert ours == reference  # times, costs and every knob, bit for bit


def test_ortools_cut_follows_the_same_time_cost_path():
    from lowtime.solver import PhillipsDessouky

    _, options = _simulated_options(4, 6)
    dag, nodes = _lowtime_dag(options, 4, 6)
    reference = _trace(PhillipsDessouky(dag), nodes)
    dag, nodes = _lowtime_dag(options, 4, 6)
    ours = _trace(IncrementalPhillipsDessouky(dag, cut="ortools"), nodes)
    assert [r[1] for r in ours] == [r[1] for r in reference]
    assert np.allclose([r[2] for r in ours], [r[2] for r in reference], rtol=1e-9, atol=0)


def test_min_cut_with_lower_bounds():
    # 0 -> 1 -> 3 and 0 -> 2 -> 3; the cheapest cut takes edge 1->3 (2) and 0->2 (1).
    tails, heads = np.array([0, 1, 0, 2]), np.array([1, 3, 2, 3])
    upper = np.array([5.0, 2.0, 1.0, 4.0])
    lower = np.zeros(4)
    side = min_cut(tails, heads, lower, upper, 0, 3, 4)
    assert side.tolist() == [True, True, False, False]
    # a lower bound no flow can meet: infeasible
    assert min_cut(tails, heads, np.array([3.0, 0, 0, 0]), upper, 0, 3, 4) is None


def test_unknown_cut_back_end_is_refused():
    _, options = _simulated_options(2, 4)
    dag, _ = _lowtime_dag(options, 2, 4)
    with pytest.raises(ValueError, match="minimum-cut"):
        IncrementalPhillipsDessouky(dag, cut="networkx")


@pytest.mark.parametrize("stages,microbatches", [(2, 64), (4, 40), (8, 48), (16, 128)])
def test_fold_keeps_warmup_drain_and_the_pairs_around_one_block_per_stage(stages, microbatches):
    solved = folded_microbatches(stages, microbatches)
    assert solved == max(2 * stages + 2, 32) < microbatches
    extra, cut = microbatches - solved, steady_cut(stages, solved)
    solved_set = {i for seq in one_f_one_b(stages, solved).values() for i in seq}
    for s, seq in one_f_one_b(stages, microbatches).items():
        sources = [folded_source(ins, stages, microbatches, solved) for ins in seq]
        # every solved instruction of the stage stands for itself once, in program order,
        # and the block for `extra` forwards and `extra` backwards, in one run of 2·extra
        kept = [src for src in sources if src is not None]
        assert kept == one_f_one_b(stages, solved)[s] and set(kept) <= solved_set
        blocked = [k for k, src in enumerate(sources) if src is None]
        assert blocked == list(range(blocked[0], blocked[0] + 2 * extra))
        warmup = stages - s - 1
        # the block starts after the cut's pair: every warm-up forward and pairs 0..cut are kept
        assert blocked[0] == warmup + 2 * (cut + 1)
        # the drain is the solved DAG's, as many microbatches earlier
        assert sources[-1] == Instruction(s, solved - 1, "backward")


def test_short_pipelines_are_not_folded():
    assert folded_microbatches(2, 8) == 8
    assert folded_microbatches(8, 32) == 32
    for seq in one_f_one_b(2, 8).values():
        assert all(folded_source(ins, 2, 8, 8) == ins for ins in seq)


@pytest.mark.parametrize("stages,microbatches,p2p", [(2, 40, 0.0), (4, 64, 3), (8, 96, 5),
                                                     (16, 128, 5), (5, 77, 2)])
def test_folded_dag_times_the_whole_iteration(stages, microbatches, p2p):
    """With its steady blocks the folded DAG is as long as the whole iteration (every type one
    option; times and transfers whole units, so that quantizing loses nothing): a block repeats
    its stage's pair as the iteration's steady state does, and no path runs through two. Without
    them the solver saw the short DAG only, and a stage its warm-up's slack let it slow
    repeated that slowness in every pair it stood for (GPT-3 175B over 16 stages: its fastest
    plan 1.4 % slower than every instruction at the top clock)."""
    unit = 1 / 1024
    rng = random.Random(stages * microbatches)
    options = {}
    for s in range(stages):
        options[(s, "forward")] = [Option(rng.randint(50, 80) * unit, 10.0, 0)]
        options[(s, "backward")] = [Option(rng.randint(120, 170) * unit, 20.0, 0)]
    durations = {ins: options[ins.type_key][0].time_s
                 for seq in one_f_one_b(stages, microbatches).values() for ins in seq}
    makespan = max(end for _, end in schedule_times(stages, microbatches, durations,
                                                    p2p * unit).values())
    (step,) = solve(options, stages, microbatches, 50.0, unit_time_s=unit,
                    p2p_time_s=p2p * unit, fast=True)
    assert step.real_time_s == pytest.approx(makespan, abs=1e-9)


def test_fast_solve_gives_every_instruction_a_knob():
    _, options = _simulated_options(2, 40)
    steps = list(solve(options, 2, 40, 85.0, fast=True))
    knobs = steps[len(steps) // 2].knobs
    assert set(knobs) == {i for seq in one_f_one_b(2, 40).values() for i in seq}
    # the pairs a block stands for share its (forward, backward) knobs
    for s in range(2):
        blocked = {(ins.direction, knobs[ins]) for ins in one_f_one_b(2, 40)[s]
                   if folded_source(ins, 2, 40, 32) is None}
        assert len(blocked) == 2 and {d for d, _ in blocked} == {"forward", "backward"}
    # and the fastest step runs the iteration as fast as the top clock does
    clocks = {ins.type_key: min(options[ins.type_key], key=lambda o: o.time_s) for ins in knobs}
    time_of = {key: {o.knob: o.time_s for o in opts} for key, opts in options.items()}
    fastest = max(end for _, end in schedule_times(2, 40, {
        ins: time_of[ins.type_key][k] for ins, k in steps[-1].knobs.items()}).values())
    top = max(end for _, end in schedule_times(2, 40, {
        ins: clocks[ins.type_key].time_s for ins in knobs}).values())
    assert fastest <= top * 1.001


def test_spread_steps_keeps_the_ends():
    steps = list(range(1000))
    kept = spread_steps(steps, 64)
    assert len(kept) == 64 and kept[0] == 0 and kept[-1] == 999
    assert spread_steps(steps, None) == steps
    assert spread_steps(steps[:10], 64) == steps[:10]


def _reference_times(stages, microbatches, durations, p2p, hold=True):
    """Earliest times by brute force over the dependency lists (the definition): a transfer
    delays its receiver and (``hold``) holds its sender (a forward sends on every stage but the
    last, a backward on every stage but the first)."""
    deps = dag_dependencies(stages, microbatches)

    def sends(p):
        return p.stage < stages - 1 if p.direction == "forward" else p.stage > 0

    times = {}
    while len(times) < len(deps):
        for ins, preds in deps.items():
            if ins in times or any(p not in times for p in preds):
                continue
            start = max([times[p][1] + (p2p if p.stage != ins.stage or hold and sends(p) else 0.0)
                         for p in preds], default=0.0)
            times[ins] = (start, start + durations[ins])
    return times


@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 5), (4, 4), (5, 11), (8, 3)])
def test_schedule_times_match_the_dependency_definition(stages, microbatches):
    rng = random.Random(stages * 100 + microbatches)
    durations = {Instruction(s, m, d): rng.uniform(0.5, 2.0) for s in range(stages)
                 for m in range(microbatches) for d in ("forward", "backward")}
    for p2p in (0.0, 0.3):
        assert schedule_times(stages, microbatches, durations, p2p) == \
            _reference_times(stages, microbatches, durations, p2p)


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 6)])
def test_solver_dag_times_transfers_as_the_schedule_does(stages, microbatches):
    """The DAG the solver hands lowtime carries each transfer on its receiver and on its sender
    (:func:`kareus.graph.dependency_delay`), as the 1F1B schedule does: its first step (every
    instruction at its one option) lasts the schedule's makespan, to the solver's unit."""
    from kareus.methods.tradeoff import Option, solve

    rng = random.Random(stages + microbatches)
    options = {(s, d): [Option(rng.uniform(0.05, 0.2), 1.0, 0)]
               for s in range(stages) for d in ("forward", "backward")}
    p2p = 0.011
    durations = {ins: options[ins.type_key][0].time_s
                 for seq in one_f_one_b(stages, microbatches).values() for ins in seq}
    makespan = max(end for _, end in schedule_times(stages, microbatches, durations,
                                                    p2p).values())
    receiver_only = max(end for _, end in _reference_times(stages, microbatches, durations,
                                                            p2p, hold=False).values())
    step = next(iter(solve(options, stages, microbatches, 60.0, unit_time_s=1e-4,
                           p2p_time_s=p2p)))
    units = 2 * stages * microbatches + 4 * (stages - 1) * microbatches  # quantised nodes
    assert makespan - units * 1e-4 <= step.real_time_s <= makespan + 1e-9
    assert makespan > receiver_only + 1e-3  # the holds lengthen this pipeline
