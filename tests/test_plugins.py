"""The plugin machinery: built-ins and a third-party plugin found through entry points, and
plugins that misbehave."""

import sys
import tomllib
from pathlib import Path

import pytest

from kareus.errors import InputError
from kareus.plan import IterationPlan
from kareus.plugins import load_optimizer, optimizer_names
from kareus.suite import harness
from kareus.suite.problem import make_problem

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "uniform_clock"


@pytest.fixture()
def installed_example(tmp_path, monkeypatch):
    """Make the example plugin discoverable exactly as `pip install examples/uniform_clock`
    would: a dist-info with its entry points on sys.path, and its source importable."""
    dist = tmp_path / "kareus_uniform_clock-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kareus-uniform-clock\n"
                                   "Version: 0.1.0\n")
    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["kareus.optimizers"]
    (dist / "entry_points.txt").write_text(
        "[kareus.optimizers]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    yield
    sys.modules.pop("uniform_clock", None)


@pytest.fixture(scope="module")
def problem():
    return make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=2, mbs=2, microbatches=4)


def test_builtins_are_registered_through_entry_points():
    names = optimizer_names()
    assert names[:6] == ["megatron", "perseus", "nanobatch", "nanobatch-perseus", "envpipe",
                         "zeus-power-limit"]


def test_unknown_optimizer_lists_registered():
    with pytest.raises(InputError, match="registered: megatron"):
        load_optimizer("nope")


def test_example_plugin_runs_in_the_harness(installed_example, problem):
    assert "uniform-clock" in optimizer_names()
    runs = harness.run_all(problem, ["megatron", "uniform-clock"])
    run = runs["uniform-clock"]
    assert run.status == "ok", run.error
    assert len(run.points) == len(problem.knobs.clocks_mhz)
    # all-at-max-clock is Megatron's plan
    fastest = run.frontier[0]
    assert fastest.time_s == pytest.approx(runs["megatron"].frontier[0].time_s)
    cmp_ = harness.compare(runs)
    assert cmp_["max_throughput_vs_megatron"]["uniform-clock"]["time_reduction_pct"] == \
        pytest.approx(0.0, abs=1e-9)


class _Raises:
    name = "raises"

    def optimize(self, problem):
        raise RuntimeError("boom")


class _Nothing:
    name = "nothing"

    def optimize(self, problem):
        return None


class _Empty:
    name = "empty"

    def optimize(self, problem):
        return []


class _NaN:
    name = "nan"

    def optimize(self, problem):
        return [IterationPlan.uniform(problem.graph, float("nan"))]


class _Negative:
    name = "negative"

    def optimize(self, problem):
        return [IterationPlan.uniform(problem.graph, -100.0)]


class _Partial:
    name = "partial"

    def optimize(self, problem):
        full = IterationPlan.uniform(problem.graph, 1410.0)
        first = next(iter(full.instructions))
        return [IterationPlan({first: full.instructions[first]})]


class _OffGrid:
    name = "offgrid"

    def optimize(self, problem):
        return [IterationPlan.uniform(problem.graph, 5000.0)]


@pytest.mark.parametrize("plugin,fragment", [
    (_Raises(), "boom"), (_Nothing(), "nothing"), (_Empty(), "no plans"),
    (_NaN(), "invalid clock"), (_Negative(), "invalid clock"), (_Partial(), "no entry"),
    (_OffGrid(), "outside"),
])
def test_misbehaving_plugins_fail_alone(problem, plugin, fragment):
    run = harness.run_optimizer(plugin.name, plugin, problem)
    assert run.status == "failed" and fragment in run.error
    assert run.points == [] and run.frontier == []
    ok = harness.run_optimizer("megatron", load_optimizer("megatron"), problem)
    cmp_ = harness.compare({"megatron": ok, plugin.name: run})
    assert plugin.name not in cmp_["max_throughput_vs_megatron"]
    assert "megatron" in cmp_["max_throughput_vs_megatron"]
