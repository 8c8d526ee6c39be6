"""The Kareus optimizer: composition, plans, export, the exact reference."""

import ast

import numpy as np
import pytest

from kareus.frontier import pareto_indices, spread_indices
from kareus.methods.exact import min_energy_within, reference_options
from kareus.methods.slack import evaluate_on_options
from kareus.methods.tradeoff import solve
from kareus.plan import IterationPlan
from kareus.optimizer.compose import merge_fronts
from kareus.optimizer.kareus import Kareus, kareus_options, partition_space
from kareus.suite.export import partition_schedules, zeus_frequency_schedule, zeus_solution_text
from kareus.suite.problem import make_problem


@pytest.fixture(scope="module")
def small():
    return make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=8, pp=2, mbs=8, microbatches=2,
                        seq=4096)


@pytest.fixture(scope="module")
def options(small):
    return kareus_options(small)


def test_merge_fronts_is_the_pareto_set_of_all_sums():
    rng = np.random.default_rng(1)
    fronts = []
    for _ in range(3):
        t = np.sort(rng.uniform(1, 2, 6))
        e = np.sort(rng.uniform(1, 2, 6))[::-1]
        fronts.append((t, e, np.arange(6)[:, None]))
    merged = fronts[0]
    for f in fronts[1:]:
        merged = merge_fronts(merged, f)
    # brute force over all 6^3 combinations
    combos = np.array(np.meshgrid(*[np.arange(6)] * 3, indexing="ij")).reshape(3, -1).T
    t = sum(fronts[j][0][combos[:, j]] for j in range(3))
    e = sum(fronts[j][1][combos[:, j]] for j in range(3))
    keep = pareto_indices(t, e)
    assert np.allclose(np.sort(merged[0]), np.sort(t[keep]))
    for row, tt, ee in zip(merged[2], merged[0], merged[1]):
        assert tt == pytest.approx(sum(fronts[j][0][row[j]] for j in range(3)))
        assert ee == pytest.approx(sum(fronts[j][1][row[j]] for j in range(3)))


def test_partition_space_follows_the_collective(small):
    knobs = small.knobs
    part = small.graph.instruction_graphs[(0, "forward")].partitions[1]
    space = partition_space(part, knobs)
    assert list(space.comm_sms) == list(knobs.comm_sms)
    n = len(part.compute)
    # every (launch, wait) window with s <= e, and the sequential one
    assert space.windows.shape == (n * (n + 1) // 2 + 1, 2)
    assert [-1, -1] in space.windows.tolist() and [0, n - 1] in space.windows.tolist()
    assert all(s <= e for s, e in space.windows.tolist())
    # a partition without a collective (no TP, no CP) has nothing to schedule but its clock
    alone = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=1, pp=2, mbs=8, microbatches=2,
                         seq=4096)
    bare = alone.graph.instruction_graphs[(0, "forward")].partitions
    assert bare and all(p.comm is None for p in bare)
    assert all(partition_space(p, alone.knobs).size == len(alone.knobs.clocks_mhz) for p in bare)
    cp = make_problem("llama3.2-3b", gpu="a100-sxm4-40gb", tp=4, cp=2, microbatches=2)
    ag = next(p for p in cp.graph.instruction_graphs[(0, "forward")].partitions
              if p.comm.collective == "all_gather")
    assert list(partition_space(ag, cp.knobs).comm_sms) == list(cp.knobs.cp_comm_sms)


def test_options_include_the_sequential_fallback_and_are_pareto(options, small):
    for key, opts in options.items():
        assert opts, key
        t = [o.time_s for o in opts]
        assert t == sorted(t)
    # overlap reaches the fronts, and the sequential fallback competes: at every clock it is on
    # its instruction's (time, dynamic energy) front or dominated by a point of it
    assert any(o.knob.nanobatched for opts in options.values() for o in opts)
    from kareus.plan import InstructionPlan
    for key, opts in options.items():
        front = [(o.time_s, small.backend.evaluate_instruction(small.graph, key, o.knob)
                  .dynamic_energy_j) for o in opts]
        for clock in small.knobs.clocks_mhz:
            seq = small.backend.evaluate_instruction(small.graph, key,
                                                     InstructionPlan.make(clock, False))
            assert any(t <= seq.time_s * (1 + 1e-9) and e <= seq.dynamic_energy_j * (1 + 1e-9)
                       for t, e in front), (key, clock)
    # where overlap does not pay (Qwen 3 1.7B at CP2 x TP4), the sequential execution at every
    # clock is on the front: the candidate set holds it
    loses = make_problem("qwen3-1.7b", gpu="a100-sxm4-40gb", tp=4, cp=2, pp=1, mbs=4,
                         microbatches=2, seq=2048)
    for key, opts in kareus_options(loses).items():
        sequential = sorted(o.knob.clock_mhz for o in opts if not o.knob.nanobatched)
        assert sequential == sorted(loses.knobs.clocks_mhz), key


def test_kareus_plans_beat_nanobatch_at_max_clock(small):
    from kareus.plugins import load_optimizer
    from kareus.suite.harness import run_optimizer
    kareus = run_optimizer("kareus", Kareus(), small)
    nb = run_optimizer("nanobatch", load_optimizer("nanobatch"), small)
    assert kareus.status == "ok", kareus.error
    # its fastest plan is at least as fast as default nanobatching (the space contains it)
    assert kareus.frontier[0].time_s <= nb.frontier[0].time_s * 1.01
    # and schedules are real: some partition uses a tuned kernel or a window other than the
    # whole partition
    plan = kareus.plans[kareus.frontier[0].plan_id]
    scheds = [s for ip in plan.instructions.values() for _, s in ip.schedules]
    assert scheds and any(s.comm_sms is not None or s.launch_slot != 0 or s.wait_after
                          is not None for s in scheds)


def test_export_formats(small, options):
    steps = list(solve(options, 2, 2, small.gpu.static_power_w))
    from kareus.methods.tradeoff import plans_from_steps
    plan = plans_from_steps(steps[-1:], lambda k: k, "kareus")[0]
    sched = zeus_frequency_schedule(small.graph, plan)
    assert len(sched) == 2 and all(len(s) == 4 for s in sched)
    assert sched[1][:2] == [("forward", sched[1][0][1]), ("backward", sched[1][1][1])]
    js = partition_schedules(small.graph, plan)
    assert js["stages"][0]["instructions"][0]["instruction"] == "forward"
    first = js["stages"][0]["instructions"][0]
    if first["nanobatched"]:
        for v in first["partitions"].values():
            assert v["launch_slot"] <= v["wait_after"]
            assert (v["launch_slot"] == -1) == (v["launch_before"] is None)


def test_zeus_solution_file_is_what_pointsolution_evaluates(tmp_path, small, options):
    steps = list(solve(options, 2, 2, small.gpu.static_power_w))
    from kareus.methods.tradeoff import plans_from_steps
    plan = plans_from_steps(steps[:1], lambda k: k, "kareus")[0]
    value = ast.literal_eval(zeus_solution_text(small.graph, plan))
    assert value == [[tuple(x) for x in s] for s in zeus_frequency_schedule(small.graph, plan)]


def test_lowtime_frontier_is_close_to_the_exact_optimum(small, options):
    """Optimality gap of the lowtime frontier vs the MILP on a 2-stage x 2-microbatch instance,
    as the solver's plans come and after slack reclamation (what the Kareus optimizer returns)."""
    from kareus.methods.slack import SlackReclaimer

    thin = reference_options(options, 6)
    p = small.gpu.static_power_w
    steps = list(solve(thin, 2, 2, p))
    pts = [evaluate_on_options(s, thin, 2, 2, p) for s in steps]
    keep = pareto_indices([a for a, _ in pts], [b for _, b in pts])
    reclaim = SlackReclaimer(thin, 2, 2, p)
    gaps, reclaimed = [], []
    for i in spread_indices([pts[k][0] for k in keep], 5):
        t, e = pts[keep[i]]
        ex = min_energy_within(thin, 2, 2, p, t)
        assert ex is not None and ex.time_s <= t * (1 + 1e-9)
        assert ex.energy_j <= e * (1 + 1e-9)  # the optimum is never worse
        gaps.append((e - ex.energy_j) / ex.energy_j)
        t2, e2 = evaluate_on_options(_Knobs(reclaim(steps[keep[i]].knobs)), thin, 2, 2, p)
        assert t2 <= t * (1 + 1e-9)  # reclaiming slack never lengthens the plan
        ex2 = min_energy_within(thin, 2, 2, p, t2)
        reclaimed.append((e2 - ex2.energy_j) / ex2.energy_j)
    # measured 2026-12-06 on each type's Pareto-optimal options: four of five points at the
    # optimum, one 0.44 % above it, as lowtime leaves them (its fitted cost model on a 1 ms grid
    # leaves energy off the critical path) and after slack reclamation, which finds no slack there
    assert max(gaps) < 0.02
    assert max(reclaimed) < 0.01


class _Knobs:
    """A plan's knobs in the shape :func:`evaluate_on_options` reads."""

    def __init__(self, knobs: dict) -> None:
        self.knobs = knobs


def test_exact_reference_is_infeasible_below_the_fastest_time(options):
    assert min_energy_within(options, 2, 2, 85.0, 1e-3) is None


@pytest.mark.parametrize("model,layout", [
    ("qwen3-1.7b", {"tp": 4, "cp": 2, "pp": 2, "mbs": 8, "microbatches": 2}),
    ("qwen3-1.7b", {"tp": 8, "pp": 2, "mbs": 8, "microbatches": 2})],
    ids=["nanobatching-slower", "nanobatching-pays"])
def test_kareus_frontier_is_never_behind_its_baselines(model, layout):
    # Kareus's space contains both baselines'. Where nanobatching does not pay, a single lowtime
    # solve over Kareus's options can land a hair off Perseus's plans: on GPT-3 XL, when
    # nanobatching did not pay there (before an iteration hid part of the host's issue time),
    # its fastest plan came out 0.8 ms slower than Perseus's and its least energy 0.07 % higher
    # (both iso metrics n/a). Under Qwen 3 1.7B CP2+TP4 MBS 8 nanobatching is ~10 % slower at the
    # fastest point and nanobatch-perseus never reaches Perseus's frontier (2026-12-04, late).
    # Under Qwen 3 1.7B TP8 nanobatching pays; there Kareus's own solve already leads, so the
    # default-schedule solve only adds plans (on the paper suite it once lifted Qwen CP2+TP4
    # MBS 16 from 2.4 to nanobatch-perseus's 2.6 %).
    from kareus.plugins import load_optimizer
    from kareus.suite.harness import compare, run_optimizer
    problem = make_problem(model, gpu="a100-sxm4-40gb", **layout)
    runs = {name: run_optimizer(name, load_optimizer(name), problem)
            for name in ("megatron", "perseus", "nanobatch-perseus", "kareus")}
    assert all(r.status == "ok" for r in runs.values()), {n: r.error for n, r in runs.items()}
    vs_perseus = compare(runs)["frontier_vs_perseus"]["kareus"]
    assert vs_perseus["iso_time_energy_reduction_pct"] is not None
    assert vs_perseus["iso_energy_time_reduction_pct"] is not None
    assert vs_perseus["iso_time_energy_reduction_pct"] >= -1e-9
    assert vs_perseus["iso_energy_time_reduction_pct"] >= -1e-9
    labels = {plan.label.rsplit(" step ", 1)[0].removesuffix(" fastest options")
              for plan in runs["kareus"].plans}
    assert labels == {"kareus", "kareus sequential", "kareus default schedules"}
    kareus = runs["kareus"].frontier
    for name in ("perseus", "nanobatch-perseus"):
        base = runs[name].frontier
        assert min(p.time_s for p in kareus) <= min(p.time_s for p in base) * (1 + 1e-12), name
        assert min(p.energy_j for p in kareus) <= min(p.energy_j for p in base) * (1 + 1e-12), name


def test_kareus_solves_each_distinct_option_set_once():
    """Micro-batches of one sample do not nanobatch: Kareus's options are then Perseus's (in
    another order), their solve would give the same plans again, and it is skipped; its plans
    are Perseus's with the slack reclaimed."""
    from kareus.plugins import load_optimizer
    from kareus.suite.harness import run_optimizer
    problem = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=2, pp=2, mbs=1, microbatches=4)
    assert problem.graph.nanobatch_refusal
    runs = {name: run_optimizer(name, load_optimizer(name), problem)
            for name in ("perseus", "kareus")}
    solves = {plan.label.rsplit(" step ", 1)[0].removesuffix(" fastest options")
              for plan in runs["kareus"].plans}
    assert solves == {"kareus"}
    ends = {name: (min(p.time_s for p in r.frontier), min(p.energy_j for p in r.frontier))
            for name, r in runs.items()}
    steps = {name: [p for p in r.plans if p.meta["solver_iteration"] is not None]
             for name, r in runs.items()}
    assert len(steps["kareus"]) == len(steps["perseus"])
    assert ends["kareus"][0] == pytest.approx(ends["perseus"][0], rel=1e-9)
    assert ends["kareus"][1] <= ends["perseus"][1]


def test_reclaiming_slack_keeps_the_makespan_when_boundaries_differ():
    """TP4 over four stages on nodes of 8: boundaries 0 and 2 stay in a node, boundary 1 crosses
    to the next; the solver and the reclaimer must time each boundary as the iteration does, or
    the reclaimer takes slack that is not there and the plan gets slower (as it did with one
    figure for all boundaries: 0.310204 → 0.311016 s)."""
    from kareus.methods.profiling import tradeoff_plans
    from kareus.optimizer.kareus import _knob_plan, baseline_options

    p = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=4, mbs=2, microbatches=6)
    delays = p.backend.p2p_times(p.graph)
    assert delays[0] == delays[2] < delays[1] / 10
    seq = baseline_options(p, nanobatched=False)
    plain = tradeoff_plans(p, seq, _knob_plan, "x")
    reclaimed = tradeoff_plans(p, seq, _knob_plan, "x", reclaim_from=seq)
    for a, b in zip(plain, reclaimed):
        ra, rb = (p.backend.evaluate_plan(p.graph, x) for x in (a, b))
        assert rb.energy.time_s <= ra.energy.time_s * (1 + 1e-9)
        assert rb.energy.total_j <= ra.energy.total_j * (1 + 1e-9)
    top = p.backend.evaluate_plan(p.graph, IterationPlan.uniform(p.graph, 1410.0)).energy.time_s
    fastest = min(p.backend.evaluate_plan(p.graph, x).energy.time_s for x in reclaimed)
    assert fastest <= top + 1e-3  # within the solver's 1 ms unit of every clock at the top


def test_the_frontier_reaches_the_option_spaces_fastest_plan():
    """The solver's unit rounds options less than a unit apart alike and keeps the cheaper one,
    so its fastest step may run a lower clock than the top for no time it can see (here 1 ms
    over 4 stages: 0.3145 s against 0.3141 s). The plans end with every instruction at its
    fastest option, which no plan over the options beats, unless the last step is that plan."""
    from kareus.methods.profiling import tradeoff_plans
    from kareus.methods.tradeoff import Option, fastest_knobs
    from kareus.optimizer.kareus import _knob_plan, baseline_options

    # the fastest option, the least energy among equally fast ones, on every instruction
    opts = {(s, d): [Option(2.0, 5.0, "slow"), Option(1.0, 9.0, "dear"),
                     Option(1.0, 8.0, "fast")] for s in range(2) for d in ("forward", "backward")}
    knobs = fastest_knobs(opts, 2, 3)
    assert len(knobs) == 2 * 2 * 3 and set(knobs.values()) == {"fast"}

    p = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=4, mbs=2, microbatches=6)
    seq = baseline_options(p, nanobatched=False)
    plans = tradeoff_plans(p, seq, _knob_plan, "x")
    times = [p.backend.evaluate_plan(p.graph, x).energy.time_s for x in plans]
    top = p.backend.evaluate_plan(p.graph, IterationPlan.uniform(p.graph, 1410.0)).energy.time_s
    assert plans[-1].label == "x fastest options"
    assert min(times) == pytest.approx(top, rel=1e-9) and min(times[:-1]) > top * 1.0005


def test_the_solver_waits_for_the_parameter_all_gather_as_the_iteration_does():
    """With ``--overlap-param-gather`` each stage's first forward waits for its exposed
    parameter all-gather (the second stage's only after its input arrives, on the filling
    path). The solver's DAG carries that wait before each first forward, so its iteration is
    the schedule's with the waits, and the reclaimed plans never run slower."""
    from kareus.graph import schedule_times
    from kareus.methods.profiling import tradeoff_plans
    from kareus.methods.tradeoff import solve, with_first_forward_waits
    from kareus.optimizer.kareus import _knob_plan, baseline_options

    p = make_problem("gpt3-xl", gpu="a100-sxm4-80gb", pp=2, dp=8, mbs=2, microbatches=4,
                     distributed_optimizer=True, overlap_grad_reduce=True,
                     overlap_param_gather=True)
    g, sim = p.graph, p.backend
    waits, p2p = sim.first_forward_waits(g), sim.p2p_times(g)
    assert waits[1] > waits[0] > 0.002
    seq = baseline_options(p, nanobatched=False)

    def frugal(with_waits: bool) -> tuple[float, float]:
        """(solver's first step, 1F1B schedule) of the least-energy options (s)."""
        step = next(iter(solve(seq, g.stages, g.microbatches, p.gpu.static_power_w,
                               p2p_time_s=p2p, first_forward_wait_s=waits if with_waits
                               else None)))
        durations = {ins: min(seq[ins.type_key], key=lambda o: (o.energy_j, o.time_s)).time_s
                     for ins in step.knobs}
        if with_waits:
            durations = with_first_forward_waits(durations, waits)
        times = schedule_times(g.stages, g.microbatches, durations, p2p)
        return step.quant_time * 1e-3, max(end for _, end in times.values())

    (solver_with, run_with), (solver_without, run_without) = frugal(True), frugal(False)
    assert run_with - run_without > 0.01
    assert solver_with - solver_without == pytest.approx(run_with - run_without, abs=2e-3)
    plain = tradeoff_plans(p, seq, _knob_plan, "x")
    reclaimed = tradeoff_plans(p, seq, _knob_plan, "x", reclaim_from=seq)
    for a, b in zip(plain, reclaimed):
        ra, rb = (sim.evaluate_plan(g, x) for x in (a, b))
        assert rb.energy.time_s <= ra.energy.time_s * (1 + 1e-9)


def test_exact_reference_times_its_choice_even_without_static_power(options):
    """Without static power the makespan costs nothing, so the MILP's makespan variable may sit
    anywhere up to the deadline; the solution's time is its choice's own schedule."""
    from kareus.graph import schedule_times

    ex = min_energy_within(options, 2, 2, 0.0, 10.0)
    times = schedule_times(2, 2, {ins: options[ins.type_key][o].time_s
                                  for ins, o in ex.choice.items()})
    assert ex.time_s == pytest.approx(max(end for _, end in times.values()))
    assert ex.time_s < 5.0


def test_exact_reference_refuses_an_unproven_answer(options):
    from kareus.errors import SolverTimeout

    with pytest.raises(SolverTimeout, match="before proving optimality"):
        min_energy_within(options, 2, 2, 85.0, 10.0, time_limit_s=1e-9)


def test_the_reclaimer_is_a_setting_on_kareus_and_the_baselines():
    """``reclaim``: on by default for Kareus, off for Perseus's procedure; turned on for Perseus
    it never makes a plan slower or costlier, and on gpt3-xl it moves some."""
    from kareus.plugins import load_optimizer
    from kareus.suite.problem import make_problem

    problem = make_problem("gpt3-xl", gpu="a100-sxm4-40gb")
    plain = load_optimizer("perseus").optimize(problem)
    reclaimed = load_optimizer("perseus", {"reclaim": "true"}).optimize(problem)
    assert len(plain) == len(reclaimed)
    ev = problem.backend.evaluate_plan
    moved = 0
    for a, b in zip(plain, reclaimed):
        ra, rb = ev(problem.graph, a).energy, ev(problem.graph, b).energy
        assert rb.time_s <= ra.time_s * (1 + 1e-9) and rb.total_j <= ra.total_j * (1 + 1e-9)
        moved += rb.total_j < ra.total_j * (1 - 1e-9)
    assert moved > 0
    assert load_optimizer("kareus", {"reclaim": "false"}).settings.reclaim is False


def test_a_clock_a_sampling_search_missed_keeps_its_overlapped_options(small):
    """A partition not measured at some clock takes its front's schedules from the nearest clock
    it was measured at: every clock keeps nanobatched options (the instruction evaluated at its
    own clock), instead of losing them all for one partition's gap."""
    from dataclasses import replace

    from kareus.optimizer.compose import instruction_options, nearest_measured_clock
    from kareus.optimizer.kareus import search_partitions

    results = search_partitions(small)
    part = next(iter(results))
    full = results[part]
    gone = 0  # drop every measurement at the lowest clock from one partition
    keep = full.idx[:, 0] != gone
    results[part] = replace(full, idx=full.idx[keep], time_s=full.time_s[keep],
                            dynamic_energy_j=full.dynamic_energy_j[keep])
    assert nearest_measured_clock(results[part], gone) == 1
    assert nearest_measured_clock(full, gone) == gone
    clock = small.knobs.clocks_mhz[gone]
    checked = 0
    for key in sorted(small.graph.instruction_graphs):
        if part not in small.graph.instruction_graphs[key].partitions:
            continue
        counts = []
        for res in ({**results, part: full}, results):
            opts = instruction_options(small.backend, small.graph, key, res,
                                       small.knobs.clocks_mhz)
            counts.append(sum(o.knob.clock_mhz == clock and o.knob.nanobatched for o in opts))
        assert counts[0] > 0 and counts[1] > 0, (key, counts)  # was 0 with the gap
        checked += 1
    assert checked
