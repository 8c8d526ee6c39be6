"""Per-partition search strategies: budget accounting, reproducibility, input errors and how much
of the exact (exhaustive) fronts a 2 % budget reaches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kareus.errors import InputError
from kareus.graph import Partition
from kareus.optimizer.kareus import partition_space, partition_windows
from kareus.optimizer.search import Evaluator, PartitionSearch, PartitionSpace, SearchResult, make_search
from kareus.suite.problem import make_problem

SAMPLERS = ("nsga2", "surrogate")


@pytest.fixture(scope="module")
def problem():
    return make_problem("llama3.2-3b", gpu="a100-sxm4-40gb")


@pytest.fixture(scope="module")
def part(problem) -> Partition:
    # bwd_attn/1: 18 clocks x 11 SM counts (the library's kernel, 3..30) x 37 windows
    return problem.graph.instruction_graphs[(0, "backward")].partitions[-1]


@pytest.fixture(scope="module")
def space(problem, part) -> PartitionSpace:
    return partition_space(part, problem.knobs)


@pytest.fixture(scope="module")
def exact(problem, part, space) -> SearchResult:
    return make_search("exhaustive").search(Evaluator(problem.backend, part, space), None,
                                            np.random.default_rng(0))


class SpyEvaluator(Evaluator):
    """Records every configuration a strategy asks for; the whole-grid shortcut is off limits."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.asked: set[int] = set()

    def measure(self, idx):
        self.asked.update(int(f) for f in self.space.flat(np.atleast_2d(idx)))
        return super().measure(idx)

    def measure_all(self):
        raise AssertionError("a sampling strategy must not measure the whole grid")


def run(name, problem, part, space, budget, seed=0) -> tuple[SearchResult, SpyEvaluator]:
    ev = SpyEvaluator(problem.backend, part, space)
    return make_search(name).search(ev, budget, np.random.default_rng(seed)), ev


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("budget", [8, 37, 100])
def test_budget_is_respected_and_counted(name, budget, problem, part, space, exact):
    res, ev = run(name, problem, part, space, budget)
    assert res.evaluations == budget == len(ev.asked) == ev.evaluations == len(res.idx)
    flat = space.flat(res.idx)
    assert len(np.unique(flat)) == len(flat)
    assert set(flat.tolist()) == ev.asked
    # the values are the backend's, row for row
    np.testing.assert_allclose(res.time_s, exact.time_s[flat])
    np.testing.assert_allclose(res.dynamic_energy_j, exact.dynamic_energy_j[flat])
    assert len(res.total_front()) >= 1 and len(res.dynamic_front()) >= 1


@pytest.mark.parametrize("name", SAMPLERS)
def test_default_budget_is_15_percent(name, problem, part, space):
    res, _ = run(name, problem, part, space, None)
    assert res.evaluations == max(20, math.ceil(0.15 * space.size))


@pytest.mark.parametrize("name", SAMPLERS)
def test_budget_beyond_the_space_and_tiny_spaces(name, problem, part):
    # a knob with a single value, and a space smaller than any initial design
    tiny = PartitionSpace(np.array(problem.knobs.clocks_mhz[-2:]), np.array([12]),
                          partition_windows(len(part.compute))[:3])
    res, ev = run(name, problem, part, tiny, None)
    assert res.evaluations == len(ev.asked) <= tiny.size
    if name == "surrogate":
        assert res.evaluations == tiny.size
    res, ev = run(name, problem, part, tiny, 10_000)
    assert res.evaluations <= tiny.size


@pytest.mark.parametrize("name", SAMPLERS)
def test_reproducible_with_the_same_seed(name, problem, part, space):
    a, _ = run(name, problem, part, space, 60, seed=3)
    b, _ = run(name, problem, part, space, 60, seed=3)
    c, _ = run(name, problem, part, space, 60, seed=4)
    np.testing.assert_array_equal(a.idx, b.idx)
    np.testing.assert_array_equal(a.time_s, b.time_s)
    assert not np.array_equal(a.idx, c.idx)


@pytest.mark.parametrize(("name", "budget"), [("nsga2", 3), ("nsga2", 0), ("surrogate", 7),
                                              ("surrogate", -1)])
def test_too_small_budget_is_an_input_error(name, budget, problem, part, space):
    with pytest.raises(InputError, match="budget"):
        run(name, problem, part, space, budget)


def test_make_search_names():
    for name in ("exhaustive", *SAMPLERS):
        s = make_search(name)
        assert s.name == name and isinstance(s, PartitionSearch)
    with pytest.raises(InputError, match="unknown search strategy"):
        make_search("simulated-annealing")


def _hv_fraction(res: SearchResult, exact: SearchResult, total: bool) -> float:
    # Reference: 1.05 x the nadir of the exact front. With 1.05 x the maxima over the whole space
    # even random sampling of 15 % reaches ~0.995 here (the far corner dwarfs the front), so that
    # reference could not tell a search from a coin; this one puts random sampling at ~0.96.
    e_exact = exact.total_energy_j if total else exact.dynamic_energy_j
    front = exact.total_front() if total else exact.dynamic_front()
    ref = (1.05 * exact.time_s[front].max(), 1.05 * e_exact[front].max())
    return res.hypervolume(ref, total=total) / exact.hypervolume(ref, total=total)


def test_2_percent_budget_reaches_the_exact_fronts(problem, part, space, exact):
    # With every (launch, wait) window in the space, 15 % of it is enough for random sampling
    # (~0.99); 2 % (147 configurations) separates a search from a coin. (Under the partition law
    # refitted 2026-12-04, late, random sampling reaches 0.89-0.99 with 4 %, seeds 0-7, mean
    # 0.973 over seeds 0-2: the bar below moved the test to 2 %.)
    budget = math.ceil(0.02 * space.size)
    seeds = range(3)
    # random sampling with the same budget, for scale: it must fall short of the bar below
    rand = []
    for s in seeds:
        ev = Evaluator(problem.backend, part, space)
        pick = np.random.default_rng(s).choice(space.size, budget, replace=False)
        ev.measure(space.all_indices()[pick])
        rand.append(_hv_fraction(ev.result(), exact, total=True))
    assert np.mean(rand) < 0.93
    for name in SAMPLERS:
        runs = [run(name, problem, part, space, budget, seed=s)[0] for s in seeds]
        tot = [_hv_fraction(r, exact, total=True) for r in runs]
        dyn = [_hv_fraction(r, exact, total=False) for r in runs]
        # measured at 2 % under the partition law refitted 2026-12-04, late (seeds 0-7): nsga2
        # 1.0, 0.976, 1.0, 0.992, 1.0, 1.0, 0.983, 1.0 (dynamic 0.979-0.99); surrogate 1.0, 1.0,
        # 1.0, 0.998, 1.0, 1.0, 1.0, 0.955 (dynamic 0.992-0.998); random 0.895-0.959. At 4 % before
        # that law: surrogate 1.0, 1.0, 0.954, 1.0, 1.0, 0.99, 1.0, 0.992 (its extra trees are
        # seeded, but their fits follow the machine's floating-point path: another machine, same
        # code and versions, gave 0.973 for seed 2), nsga2 0.993-1.0 on 7 of 8 and 0.36 on the
        # other (a genetic search either finds the valley of SM counts or does not). The test
        # runs seeds 0-2. The surrogate's worst-seed bar only tells a search that found
        # the front from a collapse like nsga2's 0.36. Under the partition law of 2026-12-05
        # (the collective's SM path slowed beside memory kernels), seeds 0-7 at 2 %: nsga2
        # 0.965, 0.976, 0.973, 1.0, 0.966, 0.975, 0.959, 0.958 (dynamic 0.979-0.994); surrogate
        # 0.934, 0.965, 0.984, 0.994, 0.95, 1.0, 0.944, 0.974 (dynamic 0.993-0.996); random
        # 0.835-0.922, mean 0.881; the bars below moved with them (0.98, +0.02 and, for the
        # surrogate's worst seed, 0.93 before).
        assert np.median(tot) >= 0.95, (name, tot)
        assert np.mean(tot) > np.mean(rand) + 0.04, (name, tot, rand)
        assert np.median(dyn) >= 0.97, (name, dyn)
        if name == "surrogate":
            assert min(tot) >= 0.90, (name, tot)


def test_a_partition_space_refuses_windows_that_are_not_launch_wait_pairs():
    """A flat list of launch slots once reached the searches, which then read it as pairs."""
    clocks, sms = np.array([1200.0, 1410.0]), np.array([0, 12])
    assert PartitionSpace(clocks, sms, partition_windows(3)).shape == (2, 2, 7)
    for windows in (np.arange(4), np.zeros((0, 2), dtype=np.int64), np.zeros((3, 3))):
        with pytest.raises(ValueError, match="windows"):
            PartitionSpace(clocks, sms, windows)
    with pytest.raises(ValueError, match="clocks and SM counts"):
        PartitionSpace(np.array([]), sms, partition_windows(3))
