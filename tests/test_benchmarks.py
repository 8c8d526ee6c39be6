"""The benchmark scripts (benchmarks/*.py) as a user starts them: each answers --help, and the
search-efficiency benchmark measures one partition on the optimizer's own grid (it once ran on
a grid the searches no longer read, and nothing noticed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py")


def _load(path: Path):
    """``path`` imported as a module of its own (the scripts run with their folder on the path:
    perseus_exact.py and the cross-GPU tables import siblings)."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_each_benchmark_answers_help(path):
    result = CliRunner().invoke(_load(path).main, ["--help"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage:")


def test_search_efficiency_measures_a_partition_on_the_optimizers_grid(monkeypatch):
    from kareus.optimizer.kareus import partition_windows

    bench = _load(ROOT / "benchmarks" / "search_efficiency.py")
    monkeypatch.setattr(bench, "CASES", [("qwen3-1.7b", "TP8", {}, ("fwd_attn/0",))])
    ((label, _, part, space),) = list(bench._partitions())
    assert (space.windows == partition_windows(len(part.compute))).all()
    rows = bench.measure(1, (5,))
    assert {r["strategy"] for r in rows} == set(bench.STRATEGIES)
    for r in rows:
        assert r["partition"] == label and 0 < r["evaluations"] <= r["budget"]
        assert 0.0 < r["hv_front"] <= 1.0 + 1e-9


def test_sanity_records_its_figures_beside_the_record_s_other_entries(tmp_path):
    """``sanity.py --write`` merges its figures as one entry of a record file (the docs render
    the first-principles table from it) and keeps the file's other entries."""
    import json

    record = tmp_path / "summary.json"
    record.write_text(json.dumps({"artifact": {"endpoints": 16}}))
    result = CliRunner().invoke(_load(ROOT / "benchmarks" / "sanity.py").main,
                                ["--write", str(record)])
    assert result.exit_code == 0, result.output
    data = json.loads(record.read_text())
    assert data["artifact"] == {"endpoints": 16}
    f = data["first-principles"]
    assert f["command"] == "python benchmarks/sanity.py" and f["workload"] == "llama3.2-3b"
    # the printed figures are the recorded ones
    assert f"T = {f['time_s']:.3f} s" in result.output
    assert f["one_f_one_b_s"] <= f["time_s"]  # the estimate leaves out P2P and the step
    assert f["ideal_time_s"] / f["time_s"] == pytest.approx(f["mfu_pct"] / 100, rel=0.05)
