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
    assert fr.time_reduction_pct(10.0, 9.0) == pytest.approx(10.0)
    assert fr.energy_reduction_pct(200.0, 210.0) == pytest.approx(-5.0)
    assert fr.fastest([3.0, 1.0, 1.0], [1.0, 5.0, 4.0]) == 2


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
