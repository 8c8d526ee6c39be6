"""Metric definitions on hand-made frontiers (shared/method.md §7)."""

import numpy as np
import pytest

from kareus import frontier as fr

REF_T, REF_E = [10.0, 11.0, 12.0], [100.0, 94.0, 90.0]  # a Perseus-like frontier


def test_pareto_filter():
    t = [3, 1, 2, 2, 4, 1]
    e = [1, 5, 3, 4, 0.5, 5]
    idx = fr.pareto_indices(t, e)
    assert [(t[i], e[i]) for i in idx] == [(1, 5), (2, 3), (3, 1), (4, 0.5)]


def test_iso_time_energy_reduction():
    # at the reference's fastest point (10 s, 100 J): the least energy among points <= 10 s
    assert fr.iso_time_energy_reduction(REF_T, REF_E, [9.0, 10.0, 11.0], [97.0, 95.0, 60.0]) \
        == pytest.approx(5.0)


def test_iso_energy_time_reduction():
    # at the reference's lowest-energy point (12 s, 90 J): the least time among points <= 90 J
    assert fr.iso_energy_time_reduction(REF_T, REF_E, [9.0, 11.0, 10.5], [99.0, 90.0, 95.0]) \
        == pytest.approx(100 * (12 - 11) / 12)


def test_not_attainable_is_none_not_zero():
    assert fr.iso_time_energy_reduction(REF_T, REF_E, [10.5, 13.0], [50.0, 40.0]) is None
    assert fr.iso_energy_time_reduction(REF_T, REF_E, [5.0, 6.0], [95.0, 91.0]) is None


def test_a_method_against_itself_is_zero_and_worse_is_negative():
    assert fr.iso_time_energy_reduction(REF_T, REF_E, REF_T, REF_E) == 0.0
    assert fr.iso_energy_time_reduction(REF_T, REF_E, REF_T, REF_E) == 0.0
    assert fr.iso_time_energy_reduction(REF_T, REF_E, [10.0], [110.0]) == pytest.approx(-10.0)


def test_max_throughput_deltas():
    assert fr.reduction_pct(10.0, 9.0) == pytest.approx(10.0)
    assert fr.reduction_pct(200.0, 210.0) == pytest.approx(-5.0)
    assert fr.fastest([3.0, 1.0, 1.0], [1.0, 5.0, 4.0]) == 2


def test_least_energy_breaks_ties_by_time_and_skips_non_finite_energies():
    assert fr.least_energy([3.0, 1.0, 2.0], [4.0, 4.0, 5.0]) == 1
    assert fr.least_energy([1.0, 2.0], [float("nan"), 7.0]) == 1
    with pytest.raises(ValueError, match="no point with a finite energy"):
        fr.least_energy([1.0], [float("nan")])


def test_best_within_a_budget():
    t, e = [1.0, 2.0, 3.0, 4.0], [9.0, 6.0, 6.0, 2.0]
    assert fr.best_within(t, e, 3.0) == 1  # least energy by 3 s; of the tie the faster
    # a time over the budget by floating-point noise only is within it
    assert fr.best_within([1.0, 3.0 * (1 + 1e-12)], [9.0, 1.0], 3.0) == 1
    assert fr.best_within(t, e, 0.5) is None
    assert fr.best_within(e, t, 6.0) == 1  # swapped: the fastest within 6 J
    assert fr.best_within([1.0, 2.0], [float("nan"), 3.0], 1.5) is None


def test_iso_time_with_slack_admits_slightly_slower_points():
    # within +1 % of the reference's fastest 10 s: 10.05 s counts, 10.2 s does not
    assert fr.iso_time_energy_reduction(REF_T, REF_E, [10.05, 10.2], [90.0, 50.0]) is None
    assert fr.iso_time_energy_reduction(REF_T, REF_E, [10.05, 10.2], [90.0, 50.0],
                                        time_slack=0.01) == pytest.approx(10.0)


def test_relative_change_and_mape():
    assert fr.change_pct(200.0, 210.0) == pytest.approx(5.0)
    assert fr.change_pct(10.0, 9.0) == pytest.approx(-fr.reduction_pct(10.0, 9.0))
    np.testing.assert_allclose(fr.change_pct(np.array([1.0, 2.0]), np.array([1.1, 1.0])),
                               [10.0, -50.0])
    assert fr.mape_pct([1.0, 2.0], [1.1, 1.0]) == pytest.approx(30.0)
    assert np.isnan(fr.mape_pct([], []))


def test_spread_and_hypervolume():
    t = np.linspace(1, 2, 50)
    idx = fr.spread_indices(t, 10)
    assert len(idx) == 10 and idx[0] == 0 and idx[-1] == 49
    assert list(fr.spread_indices(t[:4], 10)) == [0, 1, 2, 3]
    # one point at (1, 1) with reference (3, 2): a 2 x 1 rectangle
    assert fr.hypervolume([1.0], [1.0], (3.0, 2.0)) == pytest.approx(2.0)
    assert fr.hypervolume([1.0, 2.0], [2.0, 1.0], (3.0, 3.0)) == pytest.approx(3.0)
    assert fr.hypervolume([4.0], [1.0], (3.0, 3.0)) == 0.0


def test_even_indices_keep_both_ends_and_the_limit():
    assert fr.even_indices(5, 10) == [0, 1, 2, 3, 4]
    assert fr.even_indices(11, 3) == [0, 5, 10]
    assert fr.even_indices(100, 1) == [0, 99]  # at least the two ends
    assert len(fr.even_indices(1000, 15)) == 15


def test_non_finite_points_are_never_on_a_frontier_nor_a_reference():
    """The harness drops such points first; the formulas hold without it too."""
    import math

    from kareus.frontier import iso_time_energy_reduction, pareto_indices

    assert pareto_indices([math.nan, 1.0, 2.0], [1.0, 5.0, 4.0]).tolist() == [1, 2]
    assert pareto_indices([1.0, 2.0], [math.inf, 4.0]).tolist() == [1]
    # the reference's fastest point has no energy: its fastest whole point (2 s, 10 J) counts
    assert iso_time_energy_reduction([1.0, 2.0], [math.nan, 10.0], [2.0], [9.0]) == \
        pytest.approx(10.0)
    assert iso_time_energy_reduction([math.nan], [1.0], [2.0], [9.0]) is None


def test_ties_are_judged_on_negative_values_too():
    """Energies measured against a static power can come out below zero (a dynamic part); the
    floating-point slack of the ties widens towards larger values either way."""
    from kareus.frontier import best_within, fastest, least_energy

    assert least_energy([1.0, 2.0], [-5.0, -3.0]) == 0
    assert fastest([-2.0, -1.0], [1.0, 0.5]) == 0
    assert best_within([-1.0, 1.0], [3.0, 2.0], -1.0) == 0
