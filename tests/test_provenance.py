"""Results never go stale: a cell's key holds the hashes of the code that made it, an edited
plugin is recomputed, and a run of a few optimizers adds to a folder instead of replacing it."""

import json
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

import reproduce
from kareus.suite.provenance import CodeHasher, code_fields, stale_reasons
from kareus.suite.sweep import cell_key, reuse_lines

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "uniform_clock"
SMALL = ["--workload", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2", "--microbatches", "4"]


@pytest.fixture()
def plugin(tmp_path, monkeypatch):
    """A copy of the example plugin, installed as `pip install` would (a dist-info with its entry
    points on sys.path); returns the copy's source file, to edit."""
    site = tmp_path / "site"
    dist = site / "kareus_uniform_clock-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kareus-uniform-clock\n"
                                   "Version: 0.1.0\n")
    eps = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    (dist / "entry_points.txt").write_text(
        "[kareus.optimizers]\n" + "".join(f"{k} = {v}\n"
                                          for k, v in eps["kareus.optimizers"].items()))
    shutil.copytree(EXAMPLE / "src" / "uniform_clock", site / "uniform_clock")
    monkeypatch.syspath_prepend(str(site))
    yield site / "uniform_clock" / "__init__.py"
    sys.modules.pop("uniform_clock", None)


def test_the_closure_follows_the_project_and_stops_at_third_party():
    files = CodeHasher().closure("baselines.perseus")
    assert {"baselines", "baselines.perseus", "kareus.plugins", "kareus.plan"} <= set(files)
    assert not any(m.startswith(("numpy", "pandas", "kareus.cli", "kareus.suite"))
                   for m in files)
    sim = CodeHasher().closure("kareus.backends.sim")
    assert "kareus.hardware.presets" in sim
    # a parent package's lazy imports run only when called: the GPU backend is not the simulator
    assert not any(m.startswith("kareus.backends.gpu") for m in sim)


def test_a_plugin_edit_changes_its_hash_and_only_its_own(plugin):
    before = {n: code_fields(CodeHasher(), n, "sim") for n in ("uniform-clock", "perseus")}
    plugin.write_text(plugin.read_text() + "\n# tuned\n")
    after = {n: code_fields(CodeHasher(), n, "sim") for n in ("uniform-clock", "perseus")}
    assert after["uniform-clock"]["optimizer"] != before["uniform-clock"]["optimizer"]
    assert after["perseus"] == before["perseus"]
    assert after["uniform-clock"]["backend"] == before["uniform-clock"]["backend"]


def _edited(hasher: CodeHasher, module: str, tmp_path: Path) -> CodeHasher:
    """``hasher`` seeing an edited copy of ``module``'s source file."""
    source = CodeHasher()._path(module)
    assert source is not None
    copy = tmp_path / f"{module}.py"
    copy.write_text(source.read_text() + "\n# edited\n")
    hasher._paths[module] = copy
    return hasher


@pytest.mark.parametrize("module, changes, keeps", [
    ("kareus.suite.problem", {("sim", "harness"), ("gpu", "harness")},
     {("sim", "backend"), ("gpu", "backend")}),
    ("kareus.backends.gpu.worker", {("gpu", "backend")}, {("sim", "backend"), ("sim", "harness")}),
])
def test_code_run_by_name_or_beside_the_harness_counts(module, changes, keeps, tmp_path):
    """The problem's maker and the GPU worker (started by name: nothing imports it) are in the
    cells' keys; the simulator's cells do not depend on the GPU backend's code."""
    before = {b: code_fields(CodeHasher(), "perseus", b) for b in ("sim", "gpu")}
    after = {b: code_fields(_edited(CodeHasher(), module, tmp_path), "perseus", b)
             for b in ("sim", "gpu")}
    assert all(after[b][part] != before[b][part] for b, part in changes)
    assert all(after[b][part] == before[b][part] for b, part in keeps)


def test_stale_reasons_name_what_changed():
    new = cell_key("gpt3-xl", "a100-sxm4-40gb", "sim", "perseus", 0, {}, {})
    assert stale_reasons(new, new) == []
    old = {**new, "code": {**new["code"], "optimizer": "0" * 16}, "seed": 1}
    assert stale_reasons(old, new) == ["optimizer code changed", "settings changed"]
    other = cell_key("qwen3-1.7b", "h100-sxm", "sim", "perseus", 0, {}, {})
    assert stale_reasons(new, other) == ["workload changed", "GPU changed"]
    legacy = {k: v for k, v in new.items() if k != "code"}
    assert stale_reasons(legacy, new) == ["made before cells recorded their code"]
    assert stale_reasons(None, new) == ["unreadable cell"]


def test_reuse_lines_say_who_made_the_cells_and_why_others_run():
    key = cell_key("gpt3-xl", "a100-sxm4-40gb", "sim", "megatron", 0, {}, {})
    rec = {"key": key, "made_by": {"suite": "kareus-suite 0.1.0", "git_commit": "abcdef1234567"}}
    lines = reuse_lines([rec, rec], {"optimizer code changed": ["kareus", "kareus"]},
                        {"optimizer not installed": ["cfg: gone"]}, 0)
    assert lines[0].startswith("reusing 2 cell(s) made by kareus-suite 0.1.0 at code ")
    assert "(git abcdef1234)" in lines[0]
    assert lines[1] == "computing 2 cell(s): optimizer code changed (kareus x2)"
    assert "leaving out 1 cell(s)" in lines[2] and "cfg: gone" in lines[2]


def test_an_edited_plugin_is_recomputed(plugin, tmp_path, capsys):
    out = tmp_path / "res"
    args = [*SMALL, "--optimizers", "megatron,uniform-clock", "--out", str(out)]
    assert reproduce.main(args) == 0
    first = json.loads((out / "summary.json").read_text())["optimizers"]["uniform-clock"]
    capsys.readouterr()
    assert reproduce.main(args) == 0
    err = capsys.readouterr().err
    assert "reusing 2 cell(s) made by kareus-suite" in err and "computing" not in err
    # keep every other clock: a different result from the same suite version, preset and seed
    source = plugin.read_text()
    edited = source.replace("for c in problem.knobs.clocks_mhz if",
                            "for c in problem.knobs.clocks_mhz[::2] if")
    assert edited != source
    plugin.write_text(edited)
    sys.modules.pop("uniform_clock", None)
    assert reproduce.main(args) == 0
    err = capsys.readouterr().err
    assert "reusing 1 cell(s)" in err
    assert "computing 1 cell(s): optimizer code changed (uniform-clock)" in err
    second = json.loads((out / "summary.json").read_text())["optimizers"]["uniform-clock"]
    assert second["evaluated_plans"] < first["evaluated_plans"]
    assert second["made_by"]["code"]["optimizer"] != first["made_by"]["code"]["optimizer"]
    # a setting recomputes only the cells of the optimizers that declare it (megatron has none)
    assert reproduce.main([*args, "--set", "min_clock_mhz=1000"]) == 0
    err = capsys.readouterr().err
    assert "reusing 1 cell(s)" in err
    assert "computing 1 cell(s): settings changed (uniform-clock)" in err
    third = json.loads((out / "summary.json").read_text())["optimizers"]["uniform-clock"]
    assert 0 < third["evaluated_plans"] < second["evaluated_plans"]
    cell = json.loads((out / "cells" / "uniform-clock.json").read_text())
    assert cell["key"]["options"] == {"min_clock_mhz": 1000.0}  # typed, as the plugin reads it


def test_a_setting_at_its_default_reuses_the_cells(tmp_path, capsys):
    out = tmp_path / "res"
    args = [*SMALL, "--optimizers", "megatron,zeus-power-limit", "--out", str(out)]
    assert reproduce.main(args) == 0
    before = json.loads((out / "cells" / "zeus-power-limit.json").read_text())["key"]
    assert before["options"] == {}
    capsys.readouterr()
    assert reproduce.main([*args, "--set", "eta=0.5"]) == 0
    err = capsys.readouterr().err
    assert "reusing 2 cell(s)" in err and "computing" not in err
    assert reproduce.main([*args, "--set", "eta=0.25"]) == 0
    assert "computing 1 cell(s): settings changed (zeus-power-limit)" in capsys.readouterr().err
    cell = json.loads((out / "cells" / "zeus-power-limit.json").read_text())
    assert cell["key"]["options"] == {"eta": 0.25}


def test_a_subset_run_adds_to_the_folder_and_says_why_a_metric_is_missing(tmp_path, capsys):
    out = tmp_path / "res"
    assert reproduce.main([*SMALL, "--optimizers", "megatron,perseus", "--out", str(out)]) == 0
    capsys.readouterr()
    assert reproduce.main([*SMALL, "--optimizers", "nanobatch", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "also showing 2 current cell(s) of other optimizers" in captured.err
    s = json.loads((out / "summary.json").read_text())
    assert list(s["optimizers"]) == ["megatron", "perseus", "nanobatch"]
    assert "nanobatch" in s["comparison"]["frontier_vs_perseus"]
    # alone in a fresh folder, the reference was not run: the tables say so, not "unattainable"
    solo = tmp_path / "solo"
    assert reproduce.main([*SMALL, "--optimizers", "nanobatch", "--out", str(solo)]) == 0
    text = capsys.readouterr().out
    assert "Perseus not run" in text and "Megatron-LM not run" in text
    assert "not attainable" not in text.split("Frontier vs Perseus")[1].split("\n", 1)[1]


def test_kareus_reproduce_is_the_reproduce_py_command(tmp_path, capsys):
    from kareus import reproduction
    from kareus.cli import cli, main

    assert cli.commands["reproduce"] is reproduction.command
    assert reproduce.main is reproduction.main
    assert main(["reproduce", "--workload", "gpt9", "--out", str(tmp_path / "x")]) == 2
    assert "choose one of" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_figures_give_every_method_one_style_and_print_nothing(tmp_path, capsys):
    """Every figure draws a method in its one style, and no library warning is raised."""
    import warnings

    import pandas as pd

    from kareus.suite import report
    from kareus.suite.style import STYLES, method_style

    assert len({(s.color, s.marker) for s in STYLES.values()}) == len(STYLES)
    assert method_style("my-plugin") == method_style("my-plugin")
    assert method_style("my-plugin").color not in {s.color for s in STYLES.values()}
    out = tmp_path / "res"
    assert reproduce.main([*SMALL, "--optimizers", "megatron,perseus,zeus-power-limit",
                           "--out", str(out)]) == 0
    capsys.readouterr()
    frame = pd.read_csv(out / "frontiers.csv")
    summary = json.loads((out / "summary.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report.plot_frontiers(frame, tmp_path / "f.png", "t")
        report.plot_breakdown(summary, tmp_path / "b.png", "t")
        report.plot_suite_frontiers({"a": frame, "b": frame}, tmp_path / "g.png", "t")
        report.plot_suite_breakdown({"a": summary}, tmp_path / "sb.png", "t",
                                    optimizers=("perseus", "zeus-power-limit"))
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    for name in ("f.png", "b.png", "g.png", "sb.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_figure_s_title_names_the_job_s_shape_and_the_preset_s_changes():
    """Figures of one model at several shapes (the paper suite) or static powers (the static
    sweep) tell themselves apart."""
    from kareus.suite.report import figure_title

    summary = {"workload": "qwen3-1.7b", "num_gpus": 16, "gpu": "a100-sxm4-40gb", "backend": "sim",
               "parallel": {"tp": 4, "cp": 2, "pp": 2, "dp": 1, "mbs": 8, "microbatches": 8,
                            "seq": 8192}}
    assert figure_title(summary) == ("qwen3-1.7b: TP4 CP2 PP2, MBS 8 x 8, seq 8192\n"
                                     "16 x a100-sxm4-40gb (sim)")
    assert figure_title(summary, {"static_power_w": 40.0}).endswith("(sim), static_power_w 40")


def test_the_breakdown_is_relative_to_megatron():
    from kareus.suite.report import _breakdown_rows

    def plan(t, dyn, sta):
        return {"max_throughput": {"time_s": t, "energy_j": dyn + sta, "dynamic_energy_j": dyn,
                                   "static_energy_j": sta}}

    summary = {"optimizers": {"megatron": plan(1.0, 60.0, 40.0), "kareus": plan(0.95, 57.0, 38.0)}}
    ref, rows = _breakdown_rows(summary)
    k = rows[1]
    assert ref == "megatron" and rows[0]["energy_pct"] == 0.0
    assert k["time_pct"] == pytest.approx(-5.0) and k["energy_pct"] == pytest.approx(-5.0)
    assert k["dynamic_pct"] == pytest.approx(-3.0) and k["static_pct"] == pytest.approx(-2.0)
