"""The knee rule for GPUs without a V–f measurement (benchmarks/calibration.py --cross-gpu)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kareus.hardware.presets import get_preset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import calibration as calibration_benchmark  # noqa: E402


def test_knee_rules_carry_the_source_knee_in_mhz_or_as_a_fraction_of_the_top_clock():
    a100, a40 = get_preset("a100-sxm4-80gb"), get_preset("a40")
    rules = calibration_benchmark.knee_rules(a100, a40)
    assert rules["own"] is None
    assert rules["same MHz"] == a100.knee_mhz
    assert rules["same fraction"] == pytest.approx(a100.knee_mhz / 1410 * 1740)


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200"])
def test_hopper_presets_take_the_a100_knee_in_mhz(gpu):
    """The rule the cross-GPU hold-out picked: the A100's fitted knee and voltage ratio, in MHz."""
    hopper, a100 = get_preset(gpu), get_preset("a100-sxm4-40gb")
    assert hopper.knee_mhz == a100.knee_mhz
    assert hopper.v_ratio == a100.v_ratio


@pytest.mark.slow
def test_a_knee_carried_in_mhz_predicts_the_a40_better_than_one_carried_as_a_fraction():
    """A40, fitted on GPT-3 175B with the A100's curve held, predicting Bloom's per-clock energy."""
    from kareus.hardware.calibration import calibrate, predict_relative
    from kareus.hardware.profile import load_profile
    from kareus.suite.datasets import perseus_profile

    fit, test = (perseus_profile(f"{m}+a40_bf16.csv") for m in ("gpt3-175b", "bloom"))
    if fit is None or test is None:
        pytest.skip("shared/perseus_sosp24 not available")
    a100, a40 = get_preset("a100-sxm4-80gb"), get_preset("a40")
    energy = {}
    for rule in ("same MHz", "same fraction"):
        knee = calibration_benchmark.knee_rules(a100, a40)[rule]
        preset = a40.with_overrides(knee_mhz=knee, v_ratio=a100.v_ratio)
        res = calibrate(load_profile(fit), preset, min_clocks_below_knee=sys.maxsize)
        assert res.kept_from_preset == ("knee_mhz", "v_ratio")
        energy[rule] = predict_relative(res, preset, load_profile(test))[1].energy_mape_pct
    assert energy["same MHz"] < 2.6  # the A40's own fit: 2.32 %
    assert energy["same fraction"] > energy["same MHz"] + 1.0
