import pytest

from kareus.errors import InputError
from kareus.suite import harness
from kareus.suite.harness import OptimizerRun, compare, pick_within
from kareus.suite.records import Point


def _run(name, pts):
    points = [Point(t, e, 0.7 * e, 0.3 * e, i) for i, (t, e) in enumerate(pts)]
    run = OptimizerRun(name=name, points=points)
    from kareus.frontier import pareto_indices
    run.frontier = [points[i] for i in pareto_indices([p.time_s for p in points],
                                                      [p.energy_j for p in points])]
    return run


def test_compare_builds_the_contract_block():
    runs = {"megatron": _run("megatron", [(10.0, 100.0)]),
            "perseus": _run("perseus", [(10.1, 92.0), (11.0, 88.0)]),
            "kareus": _run("kareus", [(9.0, 90.0), (10.0, 80.0), (12.0, 85.0)]),
            "broken": OptimizerRun(name="broken", status="failed", error="x")}
    c = compare(runs)
    mt = c["max_throughput_vs_megatron"]
    assert mt["kareus"]["time_reduction_pct"] == pytest.approx(10.0)
    assert mt["kareus"]["energy_reduction_pct"] == pytest.approx(10.0)
    assert mt["perseus"]["time_reduction_pct"] == pytest.approx(-1.0)
    fvp = c["frontier_vs_perseus"]
    assert fvp["kareus"]["iso_time_energy_reduction_pct"] == pytest.approx(100 * 12 / 92)
    assert fvp["kareus"]["iso_energy_time_reduction_pct"] == pytest.approx(100 * 1 / 11)
    assert fvp["megatron"]["iso_time_energy_reduction_pct"] == pytest.approx(100 * -8 / 92)
    assert fvp["megatron"]["iso_energy_time_reduction_pct"] is None
    assert "broken" not in mt and "broken" not in fvp


def test_budgets():
    run = _run("x", [(9.0, 90.0), (10.0, 80.0), (12.0, 70.0)])
    assert pick_within(run, time_budget_s=10.5).energy_j == 80.0
    assert pick_within(run, energy_budget_j=85.0).time_s == 10.0
    with pytest.raises(InputError, match="fastest takes 9"):
        pick_within(run, time_budget_s=5.0)
    with pytest.raises(InputError, match="most frugal uses 70"):
        pick_within(run, energy_budget_j=10.0)
    with pytest.raises(InputError):
        pick_within(run)


def test_spread_marks_the_fastest_and_up_to_ten_more():
    from kareus.plugins import load_optimizer
    from kareus.suite.problem import make_problem
    problem = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, mbs=2, microbatches=4)
    run = harness.run_optimizer("perseus", load_optimizer("perseus"), problem)
    assert run.status == "ok" and len(run.frontier) > 11
    assert run.frontier[0].plan_id in run.spread
    assert 2 <= len(run.spread) <= 11
    assert {p.plan_id for p in run.frontier} >= set(run.spread)
