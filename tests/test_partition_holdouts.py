"""The partition law's hold-outs along the sweep's other axes (benchmarks/partition_holdouts.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import partition_holdouts  # noqa: E402


def test_each_holdout_fits_one_side_and_predicts_the_other():
    """The SM hold-outs cut the sweep's 1-20 SMs at 14 and 6, the block-size one keeps 1024
    threads; every axis leaves rows on both sides."""
    sms = np.tile(np.arange(1, 21), 2)
    threads = np.repeat([512, 1024], 20)
    many = partition_holdouts.fitted_rows("many-sms", sms, threads)
    few = partition_holdouts.fitted_rows("few-sms", sms, threads)
    block = partition_holdouts.fitted_rows("block-size", sms, threads)
    assert set(sms[~many]) == set(range(15, 21)) and set(sms[many]) == set(range(1, 15))
    assert set(sms[~few]) == set(range(1, 7)) and set(sms[few]) == set(range(7, 21))
    assert set(threads[block]) == {1024} and set(threads[~block]) == {512}


def test_an_unknown_holdout_exits_2_before_any_fit():
    result = CliRunner().invoke(partition_holdouts.main, ["--only", "many-sms,bogus"])
    assert result.exit_code == 2
    assert "unknown hold-out 'bogus'" in result.output
