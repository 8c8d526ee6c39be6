"""The front door stays short and its numbers come from files.

Every generated block of README.md and docs/*.md must equal what ``python -m
kareus.suite.docs_render`` renders from the committed outputs (results/paper, results/fidelity):
after new results, rerun the renderer and commit.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from kareus.suite import docs_render

ROOT = Path(__file__).resolve().parents[1]


def test_generated_blocks_match_the_files_they_render() -> None:
    stale = docs_render.run(ROOT, check=True)
    assert not stale, ("generated blocks differ from what the renderer gives; run "
                       "`python -m kareus.suite.docs_render`: " + ", ".join(stale))


def test_every_block_is_known_and_closed() -> None:
    for path in docs_render.doc_files(ROOT):
        text = path.read_text()
        opened = re.findall(r"<!-- generated: ([a-z0-9-]+) -->", text)
        assert len(opened) == text.count("<!-- end generated -->"), path
        for name in opened:
            assert name in docs_render.RENDERERS, f"{path}: unknown block {name}"


def test_the_docs_hold_the_blocks_the_numbers_live_in() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "<!-- generated: headline -->" in readme
    assert "<!-- generated: paper-tables -->" in (ROOT / "docs" / "results.md").read_text()
    assert "<!-- generated: fidelity -->" in (ROOT / "docs" / "simulator.md").read_text()


def test_front_door_lengths() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    assert len((ROOT / "docs" / "simulator.md").read_text().splitlines()) <= 300


def test_readme_keeps_the_two_commands_and_ci_runs_the_second() -> None:
    readme = (ROOT / "README.md").read_text()
    main = "pip install torch==2.13.0 -e . && python reproduce.py --workload gpt3-xl"
    tests = "pip install torch==2.13.0 -e '.[test]' && python -m pytest -q -n auto --dist loadgroup"
    assert main in readme and tests in readme
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_relative_links_in_the_docs_resolve() -> None:
    for path in docs_render.doc_files(ROOT):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            if target.startswith(("http", "mailto")):
                continue
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def test_fill_renders_a_block_and_is_idempotent(tmp_path: Path) -> None:
    text = "before\n<!-- generated: paper-run -->\nold\n<!-- end generated -->\nafter\n"
    new, changed = docs_render.fill(text, ROOT)
    assert changed == ["paper-run"] and "old" not in new and "reproduce.py --suite paper" in new
    again, changed = docs_render.fill(new, ROOT)
    assert again == new and changed == []


def test_unknown_block_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown generated block"):
        docs_render.fill("<!-- generated: nope -->\n<!-- end generated -->\n", ROOT)


def test_check_mode_names_a_stale_block_without_writing(tmp_path: Path) -> None:
    (tmp_path / "results").symlink_to(ROOT / "results")
    doc = tmp_path / "README.md"
    doc.write_text("<!-- generated: paper-run -->\nstale\n<!-- end generated -->\n")
    assert docs_render.run(tmp_path, check=True) == ["README.md: paper-run"]
    assert "stale" in doc.read_text()
    assert docs_render.run(tmp_path) == ["README.md: paper-run"]
    assert docs_render.run(tmp_path, check=True) == []


def test_the_settings_table_lists_every_built_in_setting_and_its_default() -> None:
    """docs/architecture.md's table of built-in settings: one row per field of each built-in
    optimizer's Settings, naming the optimizers that declare it and its default."""
    import dataclasses

    from kareus.plugins import BUILTIN_ORDER, optimizer_settings

    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {m.group(1): [c.strip() for c in re.split(r"(?<!\\)\|", m.group(0))]
            for m in re.finditer(r"^\s*\| `(\w+)` \|.*$", text, re.M)}
    declared: dict[str, list[str]] = {}
    for name in BUILTIN_ORDER:
        settings = optimizer_settings(name)
        for f in dataclasses.fields(settings) if settings is not None else ():
            declared.setdefault(f.name, []).append(name)
            default = "none" if f.default is None else f"`{f.default}`"
            # the row's default, or ``name: `value``` where one optimizer's differs
            cell = rows[f.name][4]
            own = re.search(rf"\b{re.escape(name)}: (`[^`]*`)", cell)
            assert (own.group(1) if own else cell.split(";")[0].strip()).startswith(default), \
                (f.name, name, default)
    assert set(rows) >= set(declared)
    for setting, owners in declared.items():
        assert rows[setting][2].split(", ") == owners, setting


def test_the_readme_shows_settings_and_set() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "Settings = UniformClockSettings" in readme and "(OptimizerSettings):" in readme
    assert re.search(r"^python reproduce\.py .*--set \w+=", readme, re.M)
    assert "holds every `GPUPreset` field," not in (ROOT / "docs" / "architecture.md").read_text()


def test_the_summary_says_where_nanobatching_is_slower_and_where_not() -> None:
    """The paragraph over the configurations where the order fails counts each direction of
    nanobatching's time change instead of calling them all slower."""
    from kareus.suite.docs_render import _nanobatch_clause

    assert _nanobatch_clause([], [0.1]) == ""
    assert _nanobatch_clause([0.9, 9.0], []).endswith("0.9–9.0 % slower")
    both = _nanobatch_clause([0.9, 2.0, 9.0], [0.07])
    assert "slower on 3 of them" in both and both.endswith("faster on the other")
    assert _nanobatch_clause([1.0], [0.1, 0.2]).endswith("faster on the other 2")


def test_the_renderer_s_command_line_asks_before_it_writes(capsys, monkeypatch):
    """``--help`` shows the help and an unknown option is refused (exit 2, one line): neither
    rewrites the docs."""
    monkeypatch.setattr(docs_render, "run", lambda *a, **k: pytest.fail("rendered the docs"))
    assert docs_render.main(["--help"]) == 0
    assert "--check" in capsys.readouterr().out
    assert docs_render.main(["--chek"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--chek" in err


def test_the_per_instruction_plan_example_in_the_architecture_doc_runs() -> None:
    """docs/architecture.md's worked example builds a plan that validates on a nanobatched job."""
    from kareus.suite.problem import make_problem

    text = (ROOT / "docs" / "architecture.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                 if "PartitionSchedule(" in b)
    namespace: dict = {}
    exec(textwrap.dedent(block), namespace)
    problem = make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=2, mbs=2, microbatches=4)
    (plan,) = namespace["optimize"](None, problem)
    plan.validate(problem.graph, problem.gpu)
    assert problem.backend.evaluate_plan(problem.graph, plan).time_s > 0


def test_the_first_principles_record_is_a_fresh_run_s() -> None:
    """docs/calibration.md renders the first-principles check from the committed record
    (``benchmarks/sanity.py --write``): its figures must be what the simulator gives today."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("sanity", ROOT / "benchmarks" / "sanity.py")
    sanity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sanity)
    recorded = json.loads((ROOT / "results" / "fidelity" / "summary.json").read_text())[
        "first-principles"]
    fresh = sanity.figures(recorded["workload"], recorded["gpu"])
    assert fresh["time_s"] > 0 and fresh["stages"]
    del recorded["date"], recorded["command"]

    def flat(x: object, at: str = "") -> dict[str, object]:
        if isinstance(x, dict):
            return {k: v for key, val in x.items() for k, v in flat(val, f"{at}.{key}").items()}
        if isinstance(x, list):
            return {k: v for i, val in enumerate(x) for k, v in flat(val, f"{at}[{i}]").items()}
        return {at: x}

    got, want = flat(recorded), flat(fresh)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == (pytest.approx(value, rel=1e-9) if isinstance(value, float)
                            else value), key


def test_the_what_if_record_reads_the_suites_as_their_tables_do() -> None:
    """benchmarks/whatif.py reads each suite's summaries; its record of the paper suite must be
    the committed results/paper's (a stale record, or a reader that took another field, shows)."""
    import importlib.util
    import json

    import pandas as pd

    spec = importlib.util.spec_from_file_location("whatif", ROOT / "benchmarks" / "whatif.py")
    whatif = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(whatif)
    fresh = whatif.study_record(ROOT / "results" / "paper", whatif.STUDIES["paper"], None)
    frontier = pd.read_csv(ROOT / "results" / "paper" / "frontier.csv").set_index("config")
    fastest = pd.read_csv(ROOT / "results" / "paper" / "max_throughput.csv").set_index("config")
    assert list(fresh["configs"]) == list(frontier.index)
    for config, r in fresh["configs"].items():  # unrounded: the docs round once, as the tables
        for table, column, field in (
                (frontier, "kareus iso-time ΔE %", "kareus_iso_time_pct"),
                (frontier, "kareus iso-energy ΔT %", "kareus_iso_energy_pct"),
                (frontier, "nanobatch-perseus iso-time ΔE %", "nb_perseus_iso_time_pct"),
                (frontier, "nanobatch-perseus iso-energy ΔT %", "nb_perseus_iso_energy_pct"),
                (fastest, "kareus ΔT %", "kareus_fastest_time_pct"),
                (fastest, "kareus ΔE %", "kareus_fastest_energy_pct")):
            want = table.loc[config, column]
            if pd.isna(want):
                assert r[field] is None, (config, field)
            else:
                assert r[field] == pytest.approx(want, rel=1e-12, abs=1e-12), (config, field)
    recorded = json.loads((ROOT / "results" / "whatif" / "summary.json").read_text())["paper"]
    assert recorded["configs"] == fresh["configs"]
