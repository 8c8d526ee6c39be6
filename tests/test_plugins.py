"""The plugin machinery: built-ins and a third-party plugin found through entry points,
plugins that misbehave, and the optimizers' typed settings."""

import json
import sys
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

import reproduce
from kareus import plugins
from kareus.cli import main
from kareus.errors import InputError, PluginError
from kareus.methods.profiling import SOLVERS, TradeoffSettings
from kareus.methods.solver_units import MAX_STEPS, MIN_STEPS
from kareus.optimizer.search import STRATEGIES
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


class _Exits:
    name = "exits"

    def optimize(self, problem):
        sys.exit(7)


@pytest.mark.parametrize("plugin,fragment", [
    (_Raises(), "boom"), (_Exits(), "SystemExit: 7"), (_Nothing(), "nothing"),
    (_Empty(), "no plans"),
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


def test_an_invalid_plan_is_blamed_on_the_plan_not_the_harness(problem):
    """The harness's own re-raise is no place to send a plugin's author; its own code is."""
    run = harness.run_optimizer("offgrid", _OffGrid(), problem)
    assert run.error.startswith("PlanError: plan 0: ") and "harness.py" not in run.error
    assert "test_plugins.py:" in harness.run_optimizer("raises", _Raises(), problem).error


# --- Typed settings ------------------------------------------------------------------------------

XL = ["-w", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2", "--microbatches", "4"]


class _EntryPoint:
    def __init__(self, cls):
        self.cls, self.name = cls, cls.name
        self.value = f"tests.test_plugins:{cls.__name__}"
        self.module = "tests.test_plugins"

    def load(self):
        return self.cls


@dataclass(frozen=True)
class _PlainSettings:  # a plain dataclass: the registry converts its values all the same
    clock_mhz: float
    label: str = "x"


class _Declares:
    name = "declares"
    Settings = _PlainSettings

    def __init__(self, settings):
        self.settings = settings

    def optimize(self, problem):
        return [IterationPlan.uniform(problem.graph, self.settings.clock_mhz,
                                      label=self.settings.label)]


class _Malformed:
    name = "malformed"
    Settings = dict

    def optimize(self, problem):
        return []


@pytest.fixture()
def fake_plugins(monkeypatch):
    eps = {c.name: _EntryPoint(c) for c in (_Declares, _Malformed, _Empty)}
    real = plugins.registered_optimizers()
    monkeypatch.setattr(plugins, "registered_optimizers", lambda: {**real, **eps})


def test_defaults_are_the_old_behaviour():
    """What optimizers read with ``options.get(key, default)`` before settings were typed."""
    k = load_optimizer("kareus", {}).settings
    assert (k.solver, k.unit_ms, k.prefilter, k.max_steps, k.min_steps, k.reclaim, k.search,
            k.budget) == ("fast", None, "raw", MAX_STEPS, MIN_STEPS, True, "exhaustive", None)
    assert load_optimizer("perseus").settings == TradeoffSettings()
    assert load_optimizer("nanobatch-perseus").settings == TradeoffSettings()
    assert load_optimizer("zeus-power-limit").settings.eta == 0.5
    assert [f.name for f in fields(type(k))] == ["solver", "unit_ms", "prefilter", "max_steps",
                                                 "min_steps", "reclaim", "search", "budget"]
    assert not TradeoffSettings().reclaim  # Perseus's procedure keeps the solver's plans
    assert SOLVERS == ("fast", "exact") and STRATEGIES == ("exhaustive", "nsga2", "surrogate")


def test_settings_are_typed_once_and_keep_only_their_keys():
    """Command-line strings become the fields' types; keys of other optimizers are ignored."""
    opts = {"solver": "exact", "budget": "40", "search": "nsga2", "unit_ms": "2",
            "eta": "0.25", "nobody": "x"}
    k = load_optimizer("kareus", opts).settings
    assert (k.solver, k.budget, k.search, k.unit_ms) == ("exact", 40, "nsga2", 2.0)
    assert type(k.unit_ms) is float and type(k.budget) is int
    assert load_optimizer("zeus-power-limit", opts).settings.eta == 0.25
    assert load_optimizer("perseus", opts).settings == TradeoffSettings(solver="exact",
                                                                        unit_ms=2.0)
    assert plugins.settings_view("kareus", opts) == {"solver": "exact", "budget": 40,
                                                     "search": "nsga2", "unit_ms": 2.0}
    assert plugins.settings_view("megatron", opts) == {}
    assert plugins.settings_view("perseus", {}) == {}


def test_settings_at_their_defaults_are_not_recorded():
    """A cell's key holds the settings that differ from the defaults: ``--set eta=0.5`` (Zeus's
    default) is the same cell as no ``--set``."""
    assert plugins.settings_view("zeus-power-limit", {"eta": "0.5"}) == {}
    assert plugins.settings_view("zeus-power-limit", {"eta": "0.50", "budget": "9"}) == {}
    assert plugins.settings_view("kareus", {"solver": "fast", "min_steps": "100", "search":
                                            "exhaustive", "budget": "40"}) == {}  # ignored
    # an explicit unit is a setting: none given, short instructions get a shorter one than 1 ms
    assert plugins.settings_view("kareus", {"unit_ms": "1"}) == {"unit_ms": 1.0}
    assert plugins.settings_view("kareus", {"search": "nsga2", "budget": "40"}) == \
        {"search": "nsga2", "budget": 40}
    # an optional setting's documented default, "none", is the default itself
    assert plugins.settings_view("kareus", {"search": "nsga2", "budget": "none",
                                            "unit_ms": "None"}) == {"search": "nsga2"}
    assert plugins.settings_view("perseus", {"max_steps": str(MAX_STEPS), "unit_ms": "2"}) == \
        {"unit_ms": 2.0}


@pytest.mark.parametrize("name, options, fragment", [
    ("kareus", {"budget": "x"}, "kareus: setting 'budget' must be an integer, got 'x'"),
    ("kareus", {"budget": 0}, "setting 'budget' must be a positive integer, got 0"),
    ("kareus", {"budget": True}, "'budget' must be an integer"),
    ("kareus", {"budget": 4.0}, "'budget' must be an integer"),
    ("kareus", {"search": "annealing"}, "must be one of: exhaustive, nsga2, surrogate"),
    ("kareus", {"search": "nsga2", "budget": "3"},
     "kareus: setting 'budget' must be at least 4 with search=nsga2, got 3"),
    ("kareus", {"search": "surrogate", "budget": 7},
     "setting 'budget' must be at least 8 with search=surrogate, got 7"),
    ("perseus", {"solver": "slow"}, "perseus: setting 'solver' must be one of: fast, exact"),
    ("perseus", {"unit_ms": "nan"}, "'unit_ms' must be a finite number"),
    ("perseus", {"unit_ms": 0}, "'unit_ms' must be a positive number of ms"),
    ("perseus", {"max_steps": "0"}, "'max_steps' must be a positive integer"),
    ("nanobatch-perseus", {"prefilter": "strict"}, "must be one of: raw, effective"),
    ("zeus-power-limit", {"eta": "1.5"}, "setting 'eta' must be in [0, 1], got 1.5"),
    ("zeus-power-limit", {"eta": "high"}, "'eta' must be a finite number"),
])
def test_a_bad_setting_is_one_input_error(name, options, fragment):
    with pytest.raises(InputError) as e:
        load_optimizer(name, options)
    assert fragment in str(e.value) and len(str(e.value).splitlines()) == 1


def test_a_setting_the_others_make_irrelevant_is_named_for_a_warning(capsys):
    """``--set budget=40`` under the exhaustive search changes nothing: the command says so."""
    assert plugins.ignored_settings("kareus", {"budget": "40"}) == ["budget"]
    assert plugins.ignored_settings("kareus", {"search": "nsga2", "budget": "40"}) == []
    assert plugins.ignored_settings("megatron", {"budget": "40"}) == []
    # the exact solver steps the whole DAG at its unit: the fast solver's step bounds do nothing
    exact = {"solver": "exact", "max_steps": "500", "min_steps": "10"}
    assert plugins.ignored_settings("perseus", exact) == ["max_steps", "min_steps"]
    assert plugins.ignored_settings("kareus", exact) == ["max_steps", "min_steps"]
    assert plugins.settings_view("perseus", exact) == {"solver": "exact"}
    assert plugins.settings_view("perseus", {**exact, "solver": "fast"}) == \
        {"max_steps": 500, "min_steps": 10}
    from kareus.cli import main

    assert main(["frontier", "-w", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2",
                 "--microbatches", "4", "-o", "kareus", "--set", "budget=40", "--json"]) == 0
    assert "warning: --set budget: kareus does not use it with the other settings given" in \
        capsys.readouterr().err


def test_the_budget_is_checked_against_the_strategy_s_smallest():
    """The rule the searches enforce at run time (resolve_budget) holds before any work; the
    smallest budgets and the exhaustive search (which ignores it) still pass."""
    for search, least in (("nsga2", 4), ("surrogate", 8), ("exhaustive", 1)):
        k = load_optimizer("kareus", {"search": search, "budget": str(least)}).settings
        assert (k.search, k.budget) == (search, least)
    assert load_optimizer("kareus", {"search": "nsga2"}).settings.budget is None


def test_a_plugin_declaring_settings_gets_a_typed_instance(fake_plugins, problem):
    opt = load_optimizer("declares", {"clock_mhz": "1200", "solver": "exact"})
    assert opt.settings == _PlainSettings(1200.0) and type(opt.settings.clock_mhz) is float
    run = harness.load_and_run("declares", make_problem(
        "gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=2, mbs=2, microbatches=4,
        options={"clock_mhz": 1200, "label": "mine"}))
    assert run.status == "ok" and [p.label for p in run.plans] == ["mine"]
    with pytest.raises(InputError, match="declares: setting 'clock_mhz' is required"):
        load_optimizer("declares", {})
    with pytest.raises(InputError, match="'clock_mhz' must be a finite number"):
        load_optimizer("declares", {"clock_mhz": "fast"})
    with pytest.raises(PluginError, match="Settings must be a dataclass"):
        load_optimizer("malformed")


def test_a_plugin_without_settings_still_works(fake_plugins, problem):
    assert load_optimizer("empty", {"budget": "x"}).name == "empty"  # nothing of its own to check
    megatron = load_optimizer("megatron", {"solver": "exact", "eta": "nope"})
    assert not hasattr(megatron, "settings")
    runs = harness.run_all(make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=2, mbs=2,
                                        microbatches=4, options={"eta": "x"}), ["megatron"])
    assert runs["megatron"].status == "ok"


def test_the_example_plugin_declares_its_settings(installed_example, problem):
    opt = load_optimizer("uniform-clock", {"min_clock_mhz": "1000", "budget": "9"})
    assert opt.settings.min_clock_mhz == 1000.0
    assert load_optimizer("uniform-clock").settings.min_clock_mhz == 0.0
    run = harness.run_optimizer("uniform-clock", opt, problem)
    assert run.status == "ok"
    assert len(run.points) == sum(c >= 1000 for c in problem.knobs.clocks_mhz) > 0
    too_high = load_optimizer("uniform-clock", {"min_clock_mhz": "5000"})
    run = harness.run_optimizer("uniform-clock", too_high, problem)
    assert run.status == "failed" and run.refused
    assert run.error.startswith("no clock of a100-sxm4-40gb is at or above min_clock_mhz 5000")


def test_zeus_reads_its_eta_from_the_run(problem):
    def choice(eta):
        p = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=2, mbs=2, microbatches=4,
                         options={"eta": eta})
        run = harness.run_all(p, ["zeus-power-limit"])["zeus-power-limit"]
        plan = run.plans[run.choice.point.plan_id]
        return plan.meta["eta"], plan.power_limit_w

    (eta0, fast), (eta1, frugal) = choice("0"), choice("1")
    assert (eta0, eta1) == (0.0, 1.0) and fast > frugal


@pytest.mark.parametrize("args, fragment", [
    (["-o", "kareus", "--set", "budget=x"], "kareus: setting 'budget' must be an integer, got 'x'"),
    (["-o", "kareus", "--set", "search=annealing"], "must be one of: exhaustive, nsga2"),
    (["-o", "kareus", "--set", "budget=3", "--set", "search=nsga2"],
     "kareus: setting 'budget' must be at least 4 with search=nsga2, got 3"),
    (["-o", "zeus-power-limit", "--set", "eta=2"], "setting 'eta' must be in [0, 1], got 2.0"),
    (["-o", "perseus", "--set", "budget=3"],
     "--set budget: no optimizer of this run (perseus) has that setting; theirs: max_steps"),
    (["-o", "megatron", "--set", "eta=1"], "has that setting; theirs: none"),
    (["-o", "kareus", "--set", "budget"], "--set 'budget': give NAME=VALUE"),
    (["-o", "kareus", "--set", "budget=3", "--set", "budget=4"], "--set budget: given twice"),
    (["-o", "kareus", "--set", "solver=exact", "--solver", "fast"],
     "--solver fast and --set solver=exact disagree; give one"),
    (["-o", "kareus", "--set", "solver=slow"], "setting 'solver' must be one of"),
])
def test_frontier_refuses_a_bad_setting_in_one_line(capsys, args, fragment):
    assert main(["frontier", *XL, *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and fragment in err


@dataclass(frozen=True)
class _Unresolvable:  # an annotation its module cannot resolve: the plugin's fault
    clock_mhz: "NoSuchType" = 1.0  # noqa: F821


@dataclass(frozen=True)
class _SettingsRaise:  # a plain ValueError of its own, not a user's value
    clock_mhz: float = 1.0

    def __post_init__(self):
        raise ValueError("the plugin's own bug")


class _ConstructorRaises:
    name = "constructor-raises"

    def __init__(self):
        raise RuntimeError("boom in the constructor")

    def optimize(self, problem):  # pragma: no cover - never constructed
        return []


def _declaring(settings_cls, name):
    return type(name.title(), (_Declares,), {"name": name, "Settings": settings_cls})


@pytest.fixture()
def broken_plugins(fake_plugins, tmp_path, monkeypatch):
    """Besides the fake plugins: one whose module fails to import, and ones whose Settings the
    registry cannot build."""
    from importlib.metadata import EntryPoint

    (tmp_path / "broken_plugin.py").write_text("from kareus import no_such_name\n")
    (tmp_path / "value_plugin.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    eps = {"broken": EntryPoint("broken", "broken_plugin:Broken", plugins.ENTRY_POINT_GROUP),
           "not-a-class": EntryPoint("not-a-class", "value_plugin:VALUE",
                                     plugins.ENTRY_POINT_GROUP),
           **{c.name: _EntryPoint(c) for c in (_declaring(_Unresolvable, "unresolvable"),
                                              _declaring(_SettingsRaise, "raises"),
                                              _ConstructorRaises)}}
    real = plugins.registered_optimizers()
    monkeypatch.setattr(plugins, "registered_optimizers", lambda: {**real, **eps})
    yield
    sys.modules.pop("broken_plugin", None)
    sys.modules.pop("value_plugin", None)


def test_a_plugin_s_own_fault_is_a_plugin_error_not_the_user_s(broken_plugins):
    """Exit 1 (PluginError), not 2: unresolvable annotations, a Settings constructor failing on
    its own, a Settings that is not a dataclass, a class that is not an optimizer."""
    assert PluginError.exit_status == 1 and not issubclass(PluginError, InputError)
    with pytest.raises(PluginError, match="unresolvable: settings _Unresolvable: cannot resolve"):
        load_optimizer("unresolvable", {"clock_mhz": "1200"})
    with pytest.raises(PluginError, match="raises: settings _SettingsRaise failed: ValueError: the"):
        load_optimizer("raises")
    with pytest.raises(PluginError, match="Settings must be a dataclass"):
        plugins.optimizer_settings("malformed")
    with pytest.raises(InputError, match="'clock_mhz' must be a finite number"):
        load_optimizer("declares", {"clock_mhz": "fast"})  # the user's value stays exit 2


def test_the_optimizer_list_says_which_plugin_cannot_be_loaded(broken_plugins, capsys):
    assert main(["optimizers", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["megatron"]["loads"] and "error" not in rows["megatron"]
    assert not rows["broken"]["loads"]
    assert "cannot be loaded: ImportError" in rows["broken"]["error"]
    # built with its defaults: faults past the import show here too, not only in a run
    for name, fault in (("malformed", "Settings must be a dataclass"),
                        ("unresolvable", "cannot resolve"), ("raises", "the plugin's own bug"),
                        ("constructor-raises", "boom in the constructor"),
                        ("not-a-class", "its entry point names a value of type int, not a class")):
        assert not rows[name]["loads"] and fault in rows[name]["error"], rows[name]
    # a setting without a default is the user's to give: the plugin itself is fine
    assert rows["declares"]["loads"] and rows["declares"]["settings"] == ["clock_mhz", "label"]
    assert rows["zeus-power-limit"]["settings"] == ["eta"] and rows["megatron"]["settings"] == []
    assert main(["optimizers"]) == 0
    out = capsys.readouterr().out
    assert "broken_plugin:Broken  (cannot be loaded: " in out
    assert "--set clock_mhz, label" in out


def test_frontier_with_a_broken_plugin_is_one_line_exit_1(broken_plugins, capsys):
    for name in ("malformed", "unresolvable", "broken", "constructor-raises", "not-a-class"):
        assert main(["frontier", *XL, "-o", name]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert "internal error" not in err  # the plugin's fault, not the suite's
        assert err.startswith("plugin error: "), err


def test_settings_skip_a_plugin_that_cannot_be_loaded(broken_plugins):
    from kareus.suite.options import parse_settings

    names = ["zeus-power-limit", "broken", "malformed", "unresolvable"]
    assert parse_settings(["eta=0.25"], names) == {"eta": "0.25"}
    with pytest.raises(InputError, match=r"theirs: clock_mhz, eta \(broken could not be loaded: "
                                         r".*ImportError.*\) \(malformed could not be loaded: .*\)$"):
        parse_settings(["etta=0.25"], names)
    assert plugins.own_settings("broken", {"eta": "0.25"}) == {}
    assert plugins.own_settings("malformed", {"eta": "0.25"}) == {}
    with pytest.raises(InputError):
        plugins.own_settings("zeus-power-limit", {"eta": "2"})


def test_reproduce_with_a_broken_plugin_runs_the_others(broken_plugins, tmp_path, capsys):
    out = tmp_path / "res"
    code = reproduce.main(["--workload", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2",
                           "--microbatches", "4", "--optimizers",
                           "megatron,broken,malformed,raises,constructor-raises", "--set",
                           "clock_mhz=1200",
                           "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err
    runs = json.loads((out / "summary.json").read_text())["optimizers"]
    assert runs["megatron"]["status"] == "ok"
    for name, fragment in (("broken", "ImportError"), ("malformed", "Settings must be a dataclass"),
                           ("raises", "PluginError"),
                           ("constructor-raises", "cannot be constructed: RuntimeError: boom")):
        assert runs[name]["status"] == "failed" and fragment in runs[name]["error"], name


def test_frontier_passes_settings(fake_plugins, capsys):
    def point(clock):
        assert main(["frontier", *XL, "-o", "declares", "--set", f"clock_mhz={clock}",
                     "--json"]) == 0
        return json.loads(capsys.readouterr().out)["points"]

    top, low = point(1410), point(1200)
    assert len(top) == len(low) == 1 and low[0]["time_s"] > top[0]["time_s"]


def test_reproduce_checks_every_setting_before_any_work(tmp_path, capsys):
    out = tmp_path / "res"
    code = reproduce.main(["--workload", "gpt3-xl", "--optimizers", "megatron,kareus", "--set",
                           "budget=0", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "kareus: setting 'budget' must be a positive integer, got 0" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    code = reproduce.main(["--workload", "gpt3-xl", "--optimizers", "megatron", "--set",
                           "budget=40", "--out", str(out)])
    assert code == 2 and "no optimizer of this run (megatron)" in capsys.readouterr().err


def test_reproduce_runs_the_others_past_a_plugin_that_does_not_parse_or_is_not_found(
        tmp_path, monkeypatch, capsys):
    """A plugin whose source has a syntax error, and one whose module is not installed, each
    fail alone with their own error, though asked for by name."""
    from importlib.metadata import EntryPoint

    (tmp_path / "syntax_bad_plugin.py").write_text("def broken(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    group = plugins.ENTRY_POINT_GROUP
    eps = {"syntaxbad": EntryPoint("syntaxbad", "syntax_bad_plugin:Bad", group),
           "missingmod": EntryPoint("missingmod", "no_such_plugin_module:Missing", group)}
    real = plugins.registered_optimizers()
    monkeypatch.setattr(plugins, "registered_optimizers", lambda: {**real, **eps})
    out = tmp_path / "res"
    code = reproduce.main(["--workload", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2",
                           "--microbatches", "4", "--optimizers",
                           "megatron,syntaxbad,missingmod", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err and "interrupted" not in err
    assert "optimizers not asked for" not in err
    runs = json.loads((out / "summary.json").read_text())["optimizers"]
    assert runs["megatron"]["status"] == "ok"
    assert runs["syntaxbad"]["status"] == "failed" and "SyntaxError" in runs["syntaxbad"]["error"]
    assert runs["missingmod"]["status"] == "failed"
    assert "ModuleNotFoundError" in runs["missingmod"]["error"]
    sys.modules.pop("syntax_bad_plugin", None)


def test_one_name_registered_for_two_classes_is_refused(monkeypatch):
    from importlib.metadata import EntryPoint

    group = plugins.ENTRY_POINT_GROUP
    twice = [EntryPoint("perseus", "baselines.perseus:Perseus", group),
             EntryPoint("perseus", "my_plugin:FakePerseus", group),
             EntryPoint("megatron", "baselines.megatron:Megatron", group),
             EntryPoint("megatron", "baselines.megatron:Megatron", group)]  # one package, twice
    monkeypatch.setattr(plugins, "entry_points", lambda group: twice)
    clash = ("'perseus' is registered twice, by baselines.perseus:Perseus and "
             "my_plugin:FakePerseus")
    with pytest.raises(InputError, match=clash):
        load_optimizer("perseus")
    # the clash stops only the name it concerns: the others run, and the listing says why
    assert list(plugins.registered_optimizers()) == ["megatron", "perseus"]
    assert load_optimizer("megatron").name == "megatron"
    assert clash in plugins.load_error("perseus") and plugins.load_error("megatron") == ""
    monkeypatch.setattr(plugins, "entry_points", lambda group: twice[2:])
    assert list(plugins.registered_optimizers()) == ["megatron"]


def test_an_optimizer_named_in_the_environment_runs_without_installing(monkeypatch, problem,
                                                                        capsys):
    """$KAREUS_OPTIMIZERS registers a class of an importable module, as an entry point would."""
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.setenv(plugins.ENV_OPTIMIZERS, " uniform-clock = uniform_clock:UniformClock ,")
    try:
        assert optimizer_names()[-1] == "uniform-clock"
        opt = load_optimizer("uniform-clock", {"min_clock_mhz": "1300"})
        run = harness.run_optimizer("uniform-clock", opt, problem)
        assert run.status == "ok", run.error
        assert len(run.points) == sum(c >= 1300 for c in problem.knobs.clocks_mhz) > 0
        assert main(["optimizers"]) == 0
        assert "uniform_clock:UniformClock  --set min_clock_mhz" in capsys.readouterr().out
    finally:
        sys.modules.pop("uniform_clock", None)


@pytest.mark.parametrize("spec", ["uniform-clock", "=uniform_clock:UniformClock",
                                  "uniform-clock=uniform_clock", "u=:UniformClock"])
def test_a_malformed_environment_entry_is_one_input_error(monkeypatch, capsys, spec):
    monkeypatch.setenv(plugins.ENV_OPTIMIZERS, f"megatron=baselines.megatron:Megatron,{spec}")
    with pytest.raises(InputError, match=r"\$KAREUS_OPTIMIZERS entry .* is not NAME=module:Class"):
        plugins.registered_optimizers()
    assert main(["optimizers"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_an_environment_entry_cannot_take_a_built_in_s_name(monkeypatch):
    monkeypatch.setenv(plugins.ENV_OPTIMIZERS, "perseus=my_plugin:FakePerseus")
    with pytest.raises(InputError, match="'perseus' is registered twice"):
        load_optimizer("perseus")
    assert main(["optimizers"]) == 0 and main(["frontier", "-w", "gpt3-xl", "-o", "perseus"]) == 2


def test_when_every_optimizer_fails_the_message_names_the_workload(broken_plugins, tmp_path,
                                                                   capsys):
    out = tmp_path / "some_folder"
    code = reproduce.main([*XL, "--optimizers", "constructor-raises", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "first: constructor-raises on gpt3-xl: " in err and "on some_folder" not in err


@pytest.mark.parametrize("name", ["../../escape", "sub/dir", ".hidden", "a b"])
def test_a_name_that_is_not_a_plain_file_name_is_refused(monkeypatch, name):
    """Results are files named after the optimizer: a name could write outside --out."""
    from importlib.metadata import EntryPoint

    eps = [EntryPoint(name, "evil:Gen", plugins.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(plugins, "entry_points", lambda group: eps)
    with pytest.raises(InputError, match="is not a plain name"):
        plugins.registered_optimizers()


def test_a_plugin_that_exits_on_import_fails_alone(monkeypatch):
    """sys.exit() in a plugin's module is its fault (exit 1), not the run's exit status."""
    from importlib.metadata import EntryPoint

    class Exits(EntryPoint):
        def load(self):
            raise SystemExit(5)

    eps = [EntryPoint("megatron", "baselines.megatron:Megatron", plugins.ENTRY_POINT_GROUP),
           Exits("exits", "gone:Gone", plugins.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(plugins, "entry_points", lambda group: eps)
    with pytest.raises(PluginError, match="cannot be loaded: SystemExit: 5"):
        plugins.load_optimizer("exits")
    assert plugins.nanobatched_only("exits") is False


class _NoOptimize:
    name = "no-optimize"


class _NotADataclassSettings:
    name = "plain-settings"
    Settings = dict

    def optimize(self, problem):  # pragma: no cover - never run
        return []


def test_a_plugin_fault_names_what_is_missing(monkeypatch):
    """The message says which of `name` and `optimize` a class lacks, and names the plugin by
    its registered name and its module path."""
    eps = {c.name: _EntryPoint(c) for c in (_NoOptimize, _NotADataclassSettings)}
    real = plugins.registered_optimizers()
    monkeypatch.setattr(plugins, "registered_optimizers", lambda: {**real, **eps})
    with pytest.raises(PluginError, match=r"'no-optimize' \(tests\.test_plugins:_NoOptimize\) is "
                                          r"not an optimizer: it has no `optimize\(problem\)`$"):
        load_optimizer("no-optimize")
    with pytest.raises(PluginError, match=r"^plugin 'plain-settings' \(tests\.test_plugins:"
                                          r"_NotADataclassSettings\): Settings must be a dataclass"):
        load_optimizer("plain-settings")


class _RequiredNoOptimize:
    name = "required-no-optimize"
    Settings = _PlainSettings  # clock_mhz has no default

    def __init__(self, settings):
        self.settings = settings


def test_the_listing_checks_a_plugin_whose_settings_are_required(monkeypatch):
    """A setting without a default keeps the constructor from running in the listing, but a class
    without `optimize` is still named there."""
    eps = {c.name: _EntryPoint(c) for c in (_RequiredNoOptimize, _Declares)}
    real = plugins.registered_optimizers()
    monkeypatch.setattr(plugins, "registered_optimizers", lambda: {**real, **eps})
    assert "has no `optimize`" in plugins.load_error("required-no-optimize")
    assert plugins.load_error("declares") == ""
