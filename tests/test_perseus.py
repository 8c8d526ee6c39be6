"""Perseus: the lowtime DAG, the solver procedure, and the profile command."""

import json

import networkx as nx
import pandas as pd
import pytest

from kareus.cli import main
from kareus.graph import one_f_one_b
from kareus.methods.tradeoff import Option, build_1f1b_dag, lowtime_dag_shape, solve
from tests.conftest import profile_or_skip


def _spec_map(stages):
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec

    from kareus.methods.cost_models import fit_exponential_model
    from lowtime.perseus.instruction import Backward, Forward

    out = {}
    for s in range(stages):
        out[s] = {}
        for cls, base in ((Forward, 0.05), (Backward, 0.1)):
            opts = [ExecutionOption[int](real_time=base * k, unit_time=1e-3,
                                         cost=10.0 / k + 2 * k, knob=k) for k in (1, 1.2, 1.5)]
            cand = CandidateExecutionOptions[int](options=opts)
            out[s][cls] = OperationSpec[int](options=cand, cost_model=fit_exponential_model(cand))
    return out


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (4, 8), (3, 3), (8, 12)])
def test_lowtime_dag_has_the_1f1b_shape(stages, microbatches):
    dag, nodes = build_1f1b_dag(_spec_map(stages), stages, microbatches)
    n, e = lowtime_dag_shape(stages, microbatches)
    assert dag.number_of_nodes() == n == 2 * stages * microbatches + 2
    assert dag.number_of_edges() == e
    assert nx.is_directed_acyclic_graph(dag)
    # lowtime's Synchronous1F1B order is the suite's own 1F1B order, stage by stage
    ours = [i for s in range(stages) for i in one_f_one_b(stages, microbatches)[s]]
    assert [ins for ins, _ in nodes] == ours


def _resolver_dag(spec_map, stages, microbatches):
    """The reference driver's DAG: program-order edges, then lowtime's own DependencyResolver."""
    import itertools

    from lowtime.graph_utils import DependencyResolver
    from lowtime.perseus.instruction import Instruction as LtInstruction
    from lowtime.perseus.instruction import backward_dep, forward_dep
    from lowtime.perseus.schedule import Synchronous1F1B

    dag = nx.DiGraph()
    node_id = 2
    for stage in range(stages):
        ids = []
        for inst in Synchronous1F1B(num_stages=stages, num_micro_batches=microbatches,
                                     stage_id=stage, operation_spec_map=spec_map[stage]):
            dag.add_node(node_id, op=inst)
            ids.append(node_id)
            node_id += 1
        dag.add_edges_from(zip(ids, ids[1:]))
    resolver = DependencyResolver(dependency_rules=[forward_dep, backward_dep],
                                  node_type=LtInstruction)
    data = list(dag.nodes(data=True))
    for (id1, d1), (id2, d2) in itertools.product(data, data):
        if resolver.is_dependent(d1["op"], d2["op"]):
            dag.add_edge(id1, id2)
    return dag


@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 4), (4, 8), (3, 3), (8, 12)])
def test_lowtime_dag_edges_are_lowtime_resolvers(stages, microbatches):
    """The DAG built from kareus.graph's dependencies has lowtime's resolver's edges, in the
    reference driver's order (so the solver's ties break the same way)."""
    spec_map = _spec_map(stages)
    dag, _ = build_1f1b_dag(spec_map, stages, microbatches)
    ref = _resolver_dag(spec_map, stages, microbatches)
    ours = [e for e in dag.edges() if 0 not in e and 1 not in e]
    assert ours == list(ref.edges())


def _synthetic_options(stages):
    opts = {}
    for s in range(stages):
        for d, base in (("forward", 0.030), ("backward", 0.060)):
            opts[(s, d)] = [Option(base * 1410 / f * (0.85 + 0.15 * f / 1410),
                                   base * 400 * (f / 1410) ** 2.2 + 84 * base * 1410 / f, f)
                            for f in range(900, 1411, 30)]
    return opts


def test_solver_shortens_the_iteration_one_unit_per_step():
    steps = list(solve(_synthetic_options(3), 3, 6, 84.0))
    assert len(steps) > 10
    q = [s.quant_time for s in steps]
    assert all(b == a - 1 for a, b in zip(q, q[1:]))
    assert [s.iteration for s in steps] == list(range(1, len(steps) + 1))
    # the last step runs the critical path at high clocks
    assert max(steps[-1].knobs.values()) == 1410


def test_the_solver_quiets_lowtime_only_while_lowtime_runs():
    """lowtime logs every step at INFO; the solve holds its logger at WARNING while lowtime's
    code runs, and leaves it as it was between the steps it yields and when abandoned."""
    import logging

    logger = logging.getLogger("lowtime")
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        steps = solve(_synthetic_options(2), 2, 4, 84.0)
        next(steps)
        assert logger.level == logging.INFO  # the consumer's code runs with its own level
        next(steps)
        steps.close()  # abandoned after two steps
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(before)


def test_a_job_no_clock_speeds_up_gives_its_starting_point():
    """Every option equally fast (a host-bound job): lowtime has nothing to reduce and yields no
    step; the solve yields the starting point, each instruction at its lowtime candidate, so the
    optimizer still returns a plan."""
    for fast in (False, True):
        opts = {(s, d): [Option(0.0105, 2.0 + f / 1410, f) for f in (900.0, 1200.0, 1410.0)]
                for s in range(2) for d in ("forward", "backward")}
        steps = list(solve(opts, 2, 4, 84.0, fast=fast))
        assert len(steps) == 1 and steps[0].iteration == 0
        # 1F1B, 2 stages, 4 microbatches: (4 + 2 - 1) forward-backward pairs of 10 units each
        assert steps[0].quant_time == 100 and steps[0].real_time_s == pytest.approx(0.1)
        assert len(steps[0].knobs) == 16
    # one that can be sped up keeps lowtime's steps exactly (none for its starting point)
    assert list(solve(_synthetic_options(2), 2, 4, 84.0))[0].iteration == 1


def test_effective_prefilter_differs_only_in_filtering():
    raw = list(solve(_synthetic_options(2), 2, 4, 84.0, prefilter="raw"))
    eff = list(solve(_synthetic_options(2), 2, 4, 84.0, prefilter="effective"))
    assert raw and eff
    assert raw[-1].quant_time == eff[-1].quant_time


def test_perseus_command_on_the_published_profile(capsys):
    path = profile_or_skip("gpt3-175b+a100_sxm_bf16.csv")
    code = main(["perseus", "--profile", str(path), "--stages", "8", "--microbatches", "8",
                 "--p-static", "83.64", "--all-iterations", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    # the contract's frontier-object fields, as a profile gives them
    assert {k: out[k] for k in ("workload", "optimizer", "backend", "gpu", "num_gpus",
                                "gpus_per_stage")} == {
        "workload": "gpt3-175b+a100_sxm_bf16", "optimizer": "perseus", "backend": "profile",
        "gpu": None, "num_gpus": 8, "gpus_per_stage": 1}
    pts = out["points"]
    assert [p["iteration"] for p in pts] == list(range(1, len(pts) + 1))
    assert all(len(p["frequencies"]) == 8 and len(p["frequencies"][0]) == 16 for p in pts)
    assert pts[-1]["time_s"] < pts[0]["time_s"]
    code = main(["perseus", "--profile", str(path), "--stages", "8", "--microbatches", "8",
                 "--p-static", "83.64", "--json"])
    front = json.loads(capsys.readouterr().out)["points"]
    times = [p["time_s"] for p in front]
    energies = [p["energy_j"] for p in front]
    assert times == sorted(times) and energies == sorted(energies, reverse=True)
    assert set(p["iteration"] for p in front) <= set(p["iteration"] for p in pts)


@pytest.mark.parametrize("args,fragment", [
    (["--stages", "3"], "profile has 8 stages"),
    (["--stages", "8", "--unit-ms", "0"], "--unit-ms"),
    (["--stages", "8", "--filter", "odd"], "raw"),
    (["--stages", "8", "--prefilter", "odd"], "raw"),
])
def test_perseus_command_bad_input(capsys, args, fragment):
    path = profile_or_skip("gpt3-175b+a100_sxm_bf16.csv")
    code = main(["perseus", "--profile", str(path), "--microbatches", "8", "--p-static", "83.64",
                 *args])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_perseus_command_names_the_bad_line(capsys, tmp_path):
    bad = tmp_path / "p.csv"
    pd.DataFrame({"stage": [0, 0], "instruction": ["forward", "backward"],
                  "frequency": [1410, 1410], "time": [0.1, "x"], "energy": [1, 2]}
                 ).to_csv(bad, index=False)
    code = main(["perseus", "--profile", str(bad), "--stages", "1", "--microbatches", "2",
                 "--p-static", "80"])
    err = capsys.readouterr().err
    assert code == 2 and "p.csv" in err and "row 2" in err


def test_profile_to_options():
    from kareus.methods.profiling import profile_to_options
    df = pd.DataFrame({"stage": [0, 0], "instruction": ["forward", "backward"],
                       "frequency": [1410, 1410], "time": [0.1, 0.2], "energy": [30.0, 60.0]})
    opts = profile_to_options(df)
    assert opts[(0, "backward")] == [Option(0.2, 60.0, 1410)]


@pytest.mark.parametrize("name,p_static,unit_ms", [
    ("gpt3-175b+a100_sxm_bf16.csv", 83.64, 1.0),
    ("bloom+a100_sxm_bf16.csv", 83.64, 1.0),
])
def test_perseus_command_is_the_authors_driver_step_for_step(capsys, name, p_static, unit_ms):
    """Every solver step of ``kareus perseus`` equals the authors' driver (transcribed in
    tests/perseus_reference.py): the same number of steps, times, energies and clocks."""
    from tests.perseus_reference import reference_frontier

    path = profile_or_skip(name)
    ref = reference_frontier(str(path), 8, 8, p_static, unit_ms / 1e3)
    code = main(["perseus", "--profile", str(path), "--stages", "8", "--microbatches", "8",
                 "--p-static", str(p_static), "--unit-ms", str(unit_ms), "--all-iterations",
                 "--json"])
    pts = json.loads(capsys.readouterr().out)["points"]
    assert code == 0 and len(pts) == len(ref) > 100
    for (t, e, freqs), p in zip(ref, pts):
        assert p["time_s"] == pytest.approx(t, rel=1e-6)
        assert p["energy_j"] == pytest.approx(e, rel=1e-6)
        assert p["frequencies"] == freqs


def test_few_pareto_options_are_filtered_with_slack():
    """A type whose strict frontier keeps three options or fewer is filtered again with 5 %
    slack: a slightly noisy option (1 % worse in energy) comes back."""
    opts = [Option(0.100, 30.0, 1410), Option(0.110, 30.3, 1300), Option(0.130, 25.0, 1100)]
    options = {(s, d): opts for s in range(2) for d in ("forward", "backward")}
    knobs = {k for st in solve(options, 2, 2, 0.0) for k in st.knobs.values()}
    assert 1300 in knobs


def _fastest_cases():
    from kareus.suite.suites import get_suite

    return [(c.workload, c.overrides, c.label) for c in get_suite("paper")] + \
        [("gpt3-xl", {}, "gpt3-xl")]


@pytest.mark.parametrize("workload,overrides,label", _fastest_cases(),
                         ids=[c[2] for c in _fastest_cases()])
def test_fastest_perseus_plan_is_the_default_plans_time(workload, overrides, label):
    """Perseus's last solver step runs the critical path at the top clock, so its iteration is as
    fast as Megatron-LM's plan (within 0.1 %): the solver sees the P2P transfers the iteration
    has. (The last step's plan, not the fastest-option plan the plans end with.)"""
    from baselines.perseus import Perseus
    from kareus.hardware.presets import DEFAULT_GPU
    from kareus.plan import IterationPlan
    from kareus.suite.problem import make_problem

    problem = make_problem(workload, gpu=DEFAULT_GPU, **overrides)
    be, g = problem.backend, problem.graph
    default = be.evaluate_plan(g, IterationPlan.uniform(g, problem.gpu.clock_max_mhz))
    steps = [p for p in Perseus().optimize(problem) if p.meta["solver_iteration"] is not None]
    fastest = be.evaluate_plan(g, steps[-1])
    assert fastest.energy.time_s == pytest.approx(default.energy.time_s, rel=1e-3)


def _candidates(times, costs):
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption

    return CandidateExecutionOptions[int](options=[
        ExecutionOption[int](real_time=t * 1e-3, unit_time=1e-3, cost=c, knob=k)
        for k, (t, c) in enumerate(zip(times, costs))])


@pytest.mark.parametrize("times,costs", [
    # Llama 3.2 3B with one GPU per node: instructions of seconds, lowtime's grid keeps its first
    # guess (a constant 100 J) and the solver took one step
    ([2346.86, 2343.284, 2339.93, 2336.78, 2333.816, 2331.02, 2328.38, 2325.883, 2323.517, 2321.273, 2319.141, 2317.112, 2315.181, 2313.339, 2311.581, 2310.345, 2309.395],
     [113.519, 115.227, 117.039, 118.783, 120.543, 122.232, 124.431, 130.821, 137.474, 144.482, 151.854, 159.598, 167.722, 176.234, 185.141, 194.127, 212.454]),
    # the same job with two GPUs per node: exp(b·t) overflowed, every cost was NaN
    ([2137, 2136, 2135, 2134, 2133], [146.97, 152.18, 179.44, 229.13, 257.75]),
    # GPT-3 XL with two GPUs per node: near-flat, not monotone, then a jump; the fit raised
    ([341, 337, 333, 330, 326, 322], [18.058, 18.028, 18.060, 18.082, 18.050, 33.275]),
    # the same near zero: lowtime's fit is tried there, and refused
    ([41, 37, 33, 30, 26, 22], [18.058, 18.028, 18.060, 18.082, 18.050, 33.275]),
], ids=["kept-first-guess", "overflow", "no-exponential", "no-exponential-near-zero"])
def test_cost_model_fits_options_at_thousands_of_units(times, costs):
    """At quantized times of hundreds or thousands of units (slow networks), the cost model is
    finite and follows the options' costs at least as well as their mean does."""
    import numpy as np

    from kareus.methods.cost_models import fit_exponential_model

    cand = _candidates(times, costs)
    model = fit_exponential_model(cand)
    t = np.array([o.quant_time for o in cand.options])
    e = np.array([o.cost for o in cand.options])
    predicted = np.array([model(int(x)) for x in t])
    assert np.all(np.isfinite(predicted))
    assert np.sum((predicted - e) ** 2) < np.sum((e - e.mean()) ** 2)
    # the fastest option is the costliest: the model charges for shortening
    assert model(int(t.min())) > model(int(t.max()))


def test_cost_model_keeps_lowtime_s_fit_where_it_is_usable():
    """On the reference driver's scale (tens to hundreds of units, tens of J) the fit is
    lowtime's own ExponentialModel, as the authors' driver fits it."""
    from lowtime.cost_model import ExponentialModel

    from kareus.methods.cost_models import fit_exponential_model

    cand = _candidates([50, 60, 75, 90], [40.0, 31.0, 26.0, 24.5])
    assert isinstance(fit_exponential_model(cand), ExponentialModel)


def test_options_with_a_narrow_spread_skip_lowtime_s_grid():
    """Pythia-70M at a 5.5 µs unit: 15 options 971–991 units apart by 20, costs 0.09–0.17 J.
    lowtime's grid (``a`` ≤ 1000 in absolute time) needed ``a`` ≈ 1e44 and 3 s to get there; the
    fit in time shifted to the fastest option is as close, in milliseconds."""
    import numpy as np
    from lowtime.cost_model import ExponentialModel

    from kareus.methods.cost_models import LOWTIME_TIME_TO_SPREAD, fit_exponential_model

    times = [991, 989, 987, 985, 983, 982, 980, 979, 978, 976, 975, 974, 973, 972, 971]
    costs = [0.09292, 0.09387, 0.09487, 0.09634, 0.10203, 0.10754, 0.11379, 0.11986, 0.12622,
             0.13333, 0.14026, 0.14748, 0.155, 0.16282, 0.17094]
    assert min(times) > LOWTIME_TIME_TO_SPREAD * (max(times) - min(times))
    cand = _candidates(times, costs)
    model = fit_exponential_model(cand)
    assert not isinstance(model, ExponentialModel)
    t = np.array([o.quant_time for o in cand.options])
    predicted = np.array([model(int(x)) for x in t])
    # lowtime's fit of these options (3 s): root mean square error 1.76 mJ
    assert np.sqrt(np.mean((predicted - np.array(costs)) ** 2)) <= 1.8e-3


def test_short_instructions_get_a_unit_that_fits_them(tmp_path):
    """Without ``--set unit_ms`` the solver's unit is Perseus's 1 ms, or the fastest
    instruction's time where that is shorter; an explicit 1 ms is refused with one line there."""
    from kareus.errors import JobRefused
    from kareus.plugins import load_optimizer
    from kareus.suite.problem import make_problem

    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 512,
         "n_positions": 1024}))
    p = make_problem(str(tmp_path / "config.json"), gpu="a100-sxm4-40gb", seq=32, mbs=2, tp=1)
    assert load_optimizer("perseus").optimize(p)
    with pytest.raises(JobRefused, match="--set unit_ms=1: 1 ms is longer than the fastest"):
        load_optimizer("perseus", {"unit_ms": "1"}).optimize(p)


def test_a_short_span_is_solved_in_finer_steps():
    """GPT-3 XL at sequence 16: clocks move the iteration by about 20 µs, no step of 1 ms; the
    fast solver refines its unit (to a hundredth of the span, no finer than 1 µs), and finds the
    energy the clocks save at the same time; ``min_steps=1`` keeps Perseus's 1 ms."""
    from kareus.methods.solver_units import MIN_UNIT_S, time_unit
    from kareus.plugins import load_optimizer
    from kareus.suite.problem import make_problem

    assert time_unit(20e-6, 1e-3, min_steps=1) == 1e-3
    assert time_unit(20e-6, 1e-3) == MIN_UNIT_S
    assert time_unit(0.05, 1e-3) == pytest.approx(0.05 / 100)
    assert time_unit(0.5, 1e-3) == 1e-3
    p = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", seq=16)
    fine = load_optimizer("perseus").optimize(p)
    coarse = load_optimizer("perseus", {"min_steps": "1"}).optimize(p)
    # one solver step, and every instruction at its fastest option (tradeoff_plans' fast end)
    assert len(coarse) == 2 and coarse[-1].label.endswith("fastest options") and len(fine) >= 10

    def least(plans, what):
        return min(getattr(p.backend.evaluate_plan(p.graph, x).energy, what) for x in plans)
    assert least(fine, "time_s") == pytest.approx(least(coarse, "time_s"), rel=1e-4)
    assert least(fine, "total_j") < 0.99 * least(coarse[:1], "total_j")


def test_cost_models_never_rise_with_time():
    """The solvers charge a speed-up the cost it adds (lowtime and phillips_dessouky take the
    difference's size): a model that rises with time is refused, and the hull that stands in
    where no exponential fits stays flat past its cheapest corner."""
    import numpy as np

    from kareus.methods.cost_models import _exponential, _fits, _lower_hull

    t = np.array([0.0, 5.0, 10.0])
    assert _fits(_exponential((10.0, -0.3, 1.0)), t, 10.0 * np.exp(-0.3 * t) + 1.0)
    rising = _exponential((1.0, 0.3, 0.0))
    assert not _fits(rising, t, np.array([rising(int(x)) for x in t]))
    hull = _lower_hull(np.array([1.0, 2.0, 4.0, 5.0, 3.0]), np.array([10.0, 5.0, 4.0, 8.0, 6.0]))
    assert [hull(x) for x in (1, 2, 3, 4, 5, 9)] == [10.0, 5.0, 4.5, 4.0, 4.0, 4.0]
