"""Presets as data: the GPU files load to exactly the frozen copy in
tests/data/presets_frozen.json (dumped from the code presets before they became files; a value
changed on purpose, such as a refit or a better source, is changed in both), a user adds a GPU by
adding a file, a malformed file is refused in one line, and a refit rewrites one file."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from kareus.cli import main
from kareus.errors import PresetError
from kareus.hardware import presets as P

FROZEN = json.loads((Path(__file__).parent / "data" / "presets_frozen.json").read_text())


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    (d := tmp_path / "gpus").mkdir()
    monkeypatch.setenv(P.USER_DIR_ENV, str(d))
    P.reload_presets()
    yield d
    monkeypatch.delenv(P.USER_DIR_ENV)
    P.reload_presets()


def test_files_hold_exactly_the_code_presets():
    assert set(P.PRESETS) == set(FROZEN["presets"])
    for name, frozen in FROZEN["presets"].items():
        p = P.get_preset(name)
        assert [f.name for f in fields(p) if f.name != "sources"] == list(frozen["fields"])
        for field, want in frozen["fields"].items():
            v = getattr(p, field)
            assert type(v).__name__ == want["type"], (name, field)
            assert (list(v) if isinstance(v, tuple) else v) == want["value"], (name, field)
            if isinstance(v, float):
                assert repr(v) == repr(want["value"])  # bit-identical, not just close
        assert dict(p.sources) == frozen["sources"], name
    factors = {f"{g}|{h}": f for (g, h), f in P._loaded()[1].items()}
    assert set(factors) == set(FROZEN["partition_op_factors"])
    for key, want in FROZEN["partition_op_factors"].items():
        f = factors[key]
        assert (list(f.op_work), list(f.op_host), f.source) == \
            (want["op_work"], want["op_host"], want["source"])


def test_every_field_has_a_group_and_files_are_written_canonically():
    assert sorted(n for g in P.GROUPS.values() for n in g) == sorted(
        f.name for f in fields(P.GPUPreset) if f.name not in ("name", "sources"))
    for path in P.preset_files():
        preset, own = P.load_preset_file(path)
        assert P._dumps(P.preset_to_dict(preset, own)) == path.read_text(), path


def _copy(name: str, new: str, dest: Path, edit=None) -> Path:
    raw = json.loads(P.preset_path(name).read_text())
    raw["name"] = new
    if edit:
        edit(raw)
    path = dest / f"{new}.json"
    path.write_text(json.dumps(raw))
    return path


def test_user_gpu_file_appears(user_dir, capsys):
    def edit(raw):
        raw["power"]["power_limit_w"] = {"value": 350.0, "source": "datasheet: my card"}
    _copy("a100-sxm4-40gb", "my-gpu", user_dir, edit)
    P.reload_presets()
    assert main(["gpus", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["my-gpu"]["power_limit_w"] == {"value": 350.0, "source": "datasheet: my card"}
    assert main(["simulate", "-w", "qwen3-1.7b", "--gpu", "my-gpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"] == "my-gpu"


@pytest.mark.parametrize("edit, message", [
    (lambda raw: raw["power"].pop("knee_mhz"), "missing field power.knee_mhz"),
    (lambda raw: raw["compute"].__setitem__("sms", {"value": 1.5, "source": "x: y"}),
     "compute.sms must be a non-negative integer"),
    (lambda raw: raw["memory"]["hbm_bw"].pop("source"), "memory.hbm_bw must be"),
    (lambda raw: raw["host"].__setitem__("knee_mhz", {"value": 1, "source": "x: y"}),
     "unknown field host.knee_mhz; it belongs in 'power'"),
    (lambda raw: raw.pop("overlap"), "missing group 'overlap'"),
    # well-formed numbers that describe no GPU
    (lambda raw: raw["compute"].__setitem__("sms", {"value": 0, "source": "x: y"}),
     "sms must be above zero, got 0"),
    (lambda raw: raw["memory"].__setitem__("memory_bytes", {"value": 0, "source": "x: y"}),
     "memory_bytes must be above zero"),
    (lambda raw: raw["compute"].__setitem__("clock_min_mhz", {"value": 2000, "source": "x: y"}),
     "clock_min_mhz 2000 is above clock_max_mhz"),
    (lambda raw: raw["compute"].__setitem__("clock_min_mhz", {"value": 200, "source": "x: y"}),
     "clock_max_mhz 1740 is not clock_min_mhz 200 plus whole 15 MHz steps"),
    (lambda raw: raw["power"].__setitem__("static_power_w", {"value": 400, "source": "x: y"}),
     "static power 400 W is not below the power limit 300 W"),
    (lambda raw: raw["power"].__setitem__("v_ratio", {"value": 0, "source": "x: y"}),
     "must be at least 1, got 0"),
    (lambda raw: raw["power"].__setitem__("v_ratio", {"value": 0.5, "source": "x: y"}),
     "must be at least 1, got 0.5"),  # a voltage that falls as the clock rises
    (lambda raw: raw["links_collectives"].__setitem__("comm_max_sms",
                                                      {"value": 200, "source": "x: y"}),
     "comm_max_sms 200 is more than the GPU's 84 SMs"),
])
def test_malformed_file_is_refused_in_one_line(user_dir, capsys, edit, message):
    """A user's file that cannot be read is refused in one line where its GPU is asked for;
    the other GPUs go on working, and the listing says which file it skipped."""
    path = _copy("a40", "bad-gpu", user_dir, edit)
    P.reload_presets()
    with pytest.raises(PresetError, match=message):
        P.get_preset("bad-gpu")
    assert P.get_preset("a40").name == "a40"
    with pytest.raises(PresetError, match="unreadable there: bad-gpu.json"):
        P.get_preset("no-such-gpu")
    assert main(["simulate", "-w", "gpt3-xl", "--gpu", "bad-gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and message in err
    assert main(["gpus"]) == 0
    out, err = capsys.readouterr()
    assert "bad-gpu" not in out and "a40" in out
    assert len(err.strip().splitlines()) == 1 and "skipped bad-gpu.json" in err and message in err


def test_not_json_and_duplicate_names(user_dir, capsys):
    (user_dir / "broken.json").write_text("{\"name\": ")
    P.reload_presets()
    assert main(["simulate", "-w", "gpt3-xl", "--gpu", "broken"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.json: not valid JSON" in err
    (user_dir / "broken.json").rename(user_dir / "a40.json")  # a built-in GPU's name
    P.reload_presets()
    with pytest.raises(PresetError, match="a40.json: not valid JSON"):
        P.get_preset("a40")
    (user_dir / "a40.json").unlink()
    P.reload_presets()
    _copy("a40", "a40", user_dir)
    P.reload_presets()
    with pytest.raises(PresetError, match="already defined by"):
        P.get_preset("a40")


def test_refit_is_a_one_file_diff(tmp_path):
    path = tmp_path / "a100-sxm4-40gb.json"
    path.write_text(P.preset_path("a100-sxm4-40gb").read_text())
    diff = P.update_preset_file(
        "a100-sxm4-40gb", {"gemm_efficiency": (P.fitted_value(0.712345), "fitted: a test")},
        path=path)
    changed = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert len(changed) == 2 and '"value": 0.7123' in changed[1]
    preset, _ = P.load_preset_file(path)
    assert preset.gemm_efficiency == 0.7123 and preset.sources["gemm_efficiency"] == "fitted: a test"
    # the packaged preset is untouched
    packaged = FROZEN["presets"]["a100-sxm4-40gb"]["fields"]["gemm_efficiency"]["value"]
    assert P.get_preset("a100-sxm4-40gb").gemm_efficiency == packaged != 0.7123
    with pytest.raises(PresetError, match="unknown preset parameter"):
        P.update_preset_file("a100-sxm4-40gb", {"nope": (1.0, "x: y")}, path=path)


def test_calibrate_write_preset_rewrites_the_gpu_file(user_dir, capsys, monkeypatch, tmp_path):
    from kareus.backends.partition_calibration import PartitionCalibration
    from tests.test_partition_law import ROWS, SPEC, _sweep_csv
    from workloads.partition_spec import PartitionSpec

    _copy("a100-sxm4-40gb", "my-a100", user_dir)
    P.reload_presets()
    builtin = {p: p.read_text() for p in P.BUILTIN_DIR.glob("*.json")}
    spec = PartitionSpec.from_dict(SPEC)
    (spec_file := tmp_path / "spec.json").write_text(json.dumps(SPEC))
    _sweep_csv(sweep := tmp_path / "sweep.csv", spec, P.get_preset("my-a100"), ROWS)
    n = len(spec.partition().compute)
    cal = PartitionCalibration("my-a100", spec.sha256, None,
                               {"tuned_pipelining": 1.91234, "comm_launch_s": 3.61234e-05},
                               (1.5,) * n, (0.5,) * n)
    monkeypatch.setattr("kareus.backends.partition_calibration.fit_partition",
                        lambda *a, **k: cal)
    assert main(["calibrate", "--partition-sweep", str(sweep), "--spec", str(spec_file), "--gpu",
                 "my-a100", "--out", str(tmp_path / "c.json"), "--write-preset", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["preset_file"] == str(user_dir / "my-a100.json")
    assert '+    "tuned_pipelining": {"value": 1.912, "source": "fitted: `kareus calibrate' \
        in rep["preset_diff"]
    p = P.get_preset("my-a100")
    assert (p.tuned_pipelining, p.comm_launch_s) == (1.912, 3.612e-05)
    assert P.partition_op_factors("my-a100", spec.sha256).op_work == (1.5,) * n
    assert {p: p.read_text() for p in P.BUILTIN_DIR.glob("*.json")} == builtin
    assert main(["calibrate", "--gpu-measure", "--gpu", "my-a100", "--write-preset"]) == 2


def test_calibrate_profile_above_the_knee_leaves_the_voltage_curve_in_the_preset(
        user_dir, capsys, tmp_path):
    """A profile whose clocks all lie above the knee: `--write-preset` writes the SM power it
    fitted but not the knee and voltage ratio it kept, whose values and sources stay; the JSON
    and the text report say what was kept."""
    from tests.test_calibration import synthetic_profile

    _copy("a100-sxm4-40gb", "my-a100", user_dir)
    P.reload_presets()
    before = P.get_preset("my-a100")
    synthetic_profile(before, 1200).to_csv(profile := tmp_path / "profile.csv", index=False)
    assert main(["calibrate", "--profile", str(profile), "--gpu", "my-a100", "--write-preset",
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["fit"]["kept_from_preset"] == ["knee_mhz", "v_ratio"]
    after = P.get_preset("my-a100")
    assert after.sources["sm_dyn_power_w"] == f"fitted: `kareus calibrate --profile {profile}`"
    assert (after.knee_mhz, after.v_ratio) == (before.knee_mhz, before.v_ratio)
    assert after.sources["knee_mhz"] == before.sources["knee_mhz"]
    assert after.sources["v_ratio"] == before.sources["v_ratio"]
    assert main(["calibrate", "--profile", str(profile), "--gpu", "my-a100"]) == 0
    assert "kept from the preset, not fitted: knee_mhz, v_ratio" in capsys.readouterr().out


def test_calibrate_profile_does_not_write_a_fit_that_misses_the_profile(user_dir, capsys,
                                                                          tmp_path):
    """A profile whose time rises with the clock and whose energy falls (columns swapped, say)
    follows no GPU's law: the fit misses it, and `--write-preset` refuses to write that fit."""
    from tests.test_calibration import synthetic_profile

    _copy("a100-sxm4-40gb", "my-a100", user_dir)
    P.reload_presets()
    before = (user_dir / "my-a100.json").read_text()
    good = synthetic_profile(P.get_preset("my-a100"), 855)
    inverted = good.assign(time=good.energy / 300.0, energy=good.time * 300.0)
    inverted.to_csv(profile := tmp_path / "inverted.csv", index=False)
    assert main(["calibrate", "--profile", str(profile), "--gpu", "my-a100",
                 "--write-preset"]) == 2
    err = capsys.readouterr().err
    assert "--write-preset: the fit misses" in err and len(err.strip().splitlines()) == 1
    assert (user_dir / "my-a100.json").read_text() == before


# --- The shared file: the host's and the framework's values, once ------------------------------

SHARED_FIELDS = ("host_eager_op_s", "host_issue_call_s", "iteration_host_fraction",
                 "comm_step_latency_s", "tuned_latency_s")


def test_shared_values_live_in_one_file_and_every_gpu_takes_them():
    text = P.SHARED_FILE.read_text()
    assert P._dumps(json.loads(text)) == text  # canonical, like the GPU files
    shared = P.load_shared()
    assert set(shared) == set(SHARED_FIELDS)
    for path in P.preset_files():
        raw = json.loads(path.read_text())
        preset, _ = P.load_preset_file(path)
        for n in SHARED_FIELDS:
            group = P._GROUP_OF[n]
            own = raw.get(group, {}).get(n)
            assert own != shared[n], (path, n)  # a GPU's own value, never a copy
            if own is None:
                assert (getattr(preset, n), preset.sources[n]) == \
                    (shared[n]["value"], shared[n]["source"])
            else:
                assert (getattr(preset, n), preset.sources[n]) == (own["value"], own["source"])


def test_a_new_gpu_file_takes_the_shared_values_or_sets_its_own(user_dir):
    _copy("a40", "plain-gpu", user_dir)

    def own(raw):
        raw["host"]["host_eager_op_s"] = {"value": 9e-05, "source": "measured: my host"}
    path = _copy("a40", "own-host", user_dir, own)
    P.reload_presets()
    shared = P.load_shared()
    assert P.get_preset("plain-gpu").host_eager_op_s == shared["host_eager_op_s"]["value"]
    mine = P.get_preset("own-host")
    assert (mine.host_eager_op_s, mine.sources["host_eager_op_s"]) == (9e-05, "measured: my host")
    assert mine.iteration_host_fraction == shared["iteration_host_fraction"]["value"]
    # written back, a GPU file keeps its own value and leaves the shared ones out
    assert P.preset_to_dict(mine)["host"] == json.loads(path.read_text())["host"]


def test_refitting_a_shared_value_is_a_one_file_diff(tmp_path):
    gpu = tmp_path / "a100-sxm4-80gb.json"
    gpu.write_text(P.preset_path("a100-sxm4-80gb").read_text())
    shared = tmp_path / "host.json"
    shared.write_text(P.SHARED_FILE.read_text())
    before = gpu.read_text()
    diff = P.update_preset_file(
        "a100-sxm4-80gb", {"host_eager_op_s": (8.1e-05, "fitted: a test"),
                           "hbm_efficiency": (0.7, "fitted: a test")},
        path=gpu, shared_path=shared)
    files = [ln[4:] for ln in diff.splitlines() if ln.startswith("+++ ")]
    assert files == [str(shared), str(gpu)]  # the shared value in the shared file only
    moved = [ln for ln in diff.splitlines() if ln[:1] == "+" and ln[:3] != "+++"]
    assert len(moved) == 2 and '"host_eager_op_s": {"value": 8.1e-05' in moved[0]
    assert gpu.read_text() != before and "host_eager_op_s" not in gpu.read_text()
    values = P.load_shared(shared)
    for other in ("a40", "h100-sxm"):  # every GPU follows
        preset, _ = P.load_preset_file(P.preset_path(other), values)
        assert preset.host_eager_op_s == 8.1e-05
    # the packaged files are untouched
    assert P.get_preset("a100-sxm4-80gb").host_eager_op_s == P.load_shared()["host_eager_op_s"]["value"]
    # a GPU file that sets the field itself is where its refit goes
    raw = json.loads(gpu.read_text())
    raw["host"]["host_eager_op_s"] = {"value": 9e-05, "source": "measured: this host"}
    gpu.write_text(P._dumps(raw))
    shared_before = shared.read_text()
    diff = P.update_preset_file("a100-sxm4-80gb", {"host_eager_op_s": (9.5e-05, "fitted: b")},
                                path=gpu, shared_path=shared)
    assert [ln[4:] for ln in diff.splitlines() if ln.startswith("+++ ")] == [str(gpu)]
    assert shared.read_text() == shared_before


def test_a_malformed_shared_file_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "host.json"
    raw = json.loads(P.SHARED_FILE.read_text())
    raw["host"]["host_eager_op_s"]["value"] = -1.0
    bad.write_text(json.dumps(raw))
    with pytest.raises(PresetError) as e:
        P.load_shared(bad)
    assert len(str(e.value).splitlines()) == 1 and str(bad) in str(e.value)
    assert "host.host_eager_op_s must be a non-negative number" in str(e.value)
    bad.write_text(json.dumps({"host": {}, "name": "x"}))
    with pytest.raises(PresetError, match="the shared file holds"):
        P.load_shared(bad)
    bad.write_text(json.dumps({"host": {"knee_mhz": {"value": 1, "source": "x: y"}}}))
    with pytest.raises(PresetError, match="unknown field host.knee_mhz; it belongs in 'power'"):
        P.load_shared(bad)


# --- The loaded presets: cached by path, no module state --------------------------------------


def test_the_loaders_keep_no_global_state():
    """The presets and shared values are cached on pure loaders keyed by path
    (functools.cache), not in module variables set with ``global``."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(P))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Global)]
    assert P._loaded() is P._loaded()  # read once
    assert P._shared() is P._shared()


def test_a_written_or_newly_pointed_to_gpu_file_is_read_without_a_reload(tmp_path, monkeypatch,
                                                                          user_dir):
    from dataclasses import replace

    P.write_preset(replace(P.get_preset("a40"), name="written-gpu"), user_dir / "written-gpu.json")
    assert P.get_preset("written-gpu").name == "written-gpu"  # the writer forgot the cache
    (other := tmp_path / "other").mkdir()
    _copy("a40", "elsewhere", other)
    monkeypatch.setenv(P.USER_DIR_ENV, str(other))
    assert P.get_preset("elsewhere").name == "elsewhere"  # keyed by the folder
    with pytest.raises(PresetError, match="unknown GPU 'written-gpu'"):
        P.get_preset("written-gpu")


def test_refitting_a_user_preset_s_shared_field_overrides_it_in_the_user_s_file(user_dir):
    """A user's GPU file that leaves a shared field out gets the refit value itself; the
    package's host.json (every built-in preset's) is not touched."""
    path = _copy("a40", "my-gpu", user_dir)
    shared_before = P.SHARED_FILE.read_text()
    P.reload_presets()
    change = {"host_eager_op_s": (8.2e-05, "fitted: my host")}
    diff = P.update_preset_file("my-gpu", change, write=False)
    assert [ln[4:] for ln in diff.splitlines() if ln.startswith("+++ ")] == [str(path)]
    P.update_preset_file("my-gpu", change)
    assert P.SHARED_FILE.read_text() == shared_before
    raw = json.loads(path.read_text())
    assert raw["host"]["host_eager_op_s"] == {"value": 8.2e-05, "source": "fitted: my host"}
    mine = P.get_preset("my-gpu")
    assert (mine.host_eager_op_s, mine.sources["host_eager_op_s"]) == (8.2e-05, "fitted: my host")
    shared = P.load_shared()
    assert P.get_preset("a40").host_eager_op_s == shared["host_eager_op_s"]["value"] != 8.2e-05


def test_one_fit_holds_one_value_in_every_file_that_carries_it():
    """A value fitted once (one source) is the same in every built-in GPU file that carries it."""
    seen: dict[tuple[str, str], dict[str, object]] = {}
    for path in sorted(P.BUILTIN_DIR.glob("*.json")):
        raw = json.loads(path.read_text())
        for group in P.GROUPS:
            for field_name, entry in raw.get(group, {}).items():
                if entry["source"].startswith("fitted"):
                    seen.setdefault((field_name, entry["source"]), {})[path.stem] = entry["value"]
    drifted = {k: v for k, v in seen.items() if len({json.dumps(x) for x in v.values()}) > 1}
    assert not drifted


def test_a_refit_carries_over_to_the_copies_beside_it(tmp_path):
    for name in ("a100-sxm4-80gb", "a100-pcie-80gb", "a40"):
        (tmp_path / f"{name}.json").write_text(P.preset_path(name).read_text())
    (tmp_path / "broken.json").write_text("{\"name\": ")  # not a preset: left alone
    shared = tmp_path / "host.json"
    shared.write_text(P.SHARED_FILE.read_text())
    a40_before = (tmp_path / "a40.json").read_text()
    source = P.get_preset("a100-sxm4-80gb").sources["gemm_depth_half"]
    # a refit by the same procedure (its source kept): the fit and its copy follow
    diff = P.update_preset_file("a100-sxm4-80gb", {"gemm_depth_half": (500.0, source)},
                                path=tmp_path / "a100-sxm4-80gb.json", shared_path=shared)
    files = [ln[4:] for ln in diff.splitlines() if ln.startswith("+++ ")]
    assert sorted(files) == sorted(str(tmp_path / f"{n}.json") for n in ("a100-sxm4-80gb",
                                                                            "a100-pcie-80gb"))
    for name in ("a100-sxm4-80gb", "a100-pcie-80gb"):
        preset, _ = P.load_preset_file(tmp_path / f"{name}.json", P.load_shared(shared))
        assert preset.gemm_depth_half == 500.0 and preset.sources["gemm_depth_half"] == source
    assert (tmp_path / "a40.json").read_text() == a40_before  # its own value (an assumption) stays
    assert P.get_preset("a100-pcie-80gb").gemm_depth_half != 500.0  # the packaged files untouched
    # a fit under a new source (another measurement) is this file's alone
    diff = P.update_preset_file("a100-pcie-80gb", {"gemm_depth_half": (400.0, "fitted: a test")},
                                path=tmp_path / "a100-pcie-80gb.json", shared_path=shared)
    assert [ln[4:] for ln in diff.splitlines() if ln.startswith("+++ ")] == \
        [str(tmp_path / "a100-pcie-80gb.json")]
    sxm, _ = P.load_preset_file(tmp_path / "a100-sxm4-80gb.json", P.load_shared(shared))
    assert sxm.gemm_depth_half == 500.0


def test_a_gpu_file_from_before_the_ring_law_still_loads(user_dir):
    """A user's GPU file written before ``comm_step_latency_s`` and ``tuned_latency_s`` existed
    takes their shared defaults (no step latency, the 25 µs fixed cost of a tuned collective)."""
    def old(raw):
        raw["links_collectives"].pop("comm_step_latency_s", None)
        raw["links_collectives"].pop("tuned_latency_s", None)
    _copy("a100-sxm4-80gb", "older-gpu", user_dir, old)
    P.reload_presets()
    g = P.get_preset("older-gpu")
    shared = P.load_shared()
    assert g.comm_step_latency_s == shared["comm_step_latency_s"]["value"] == 0.0
    assert g.tuned_latency_s == shared["tuned_latency_s"]["value"]
    assert P.get_preset("a100-sxm4-80gb").comm_step_latency_s > 0  # its own, measured


def test_every_preset_says_where_its_numbers_come_from(capsys):
    """Each preset counts its numbers by kind of source, and `simulate` prints that line: a
    what-if on a GPU nothing was measured on says how much of it is assumed."""

    for name in ("a100-sxm4-40gb", "h100-sxm", "a100-pcie-80gb"):
        p = P.get_preset(name)
        kinds = p.source_kinds()
        assert sum(kinds.values()) == len(p.sources) and "unstated" not in kinds
        assert set(kinds) <= {"datasheet", "published", "measured", "fitted", "derived",
                              "assumed", "definition"}
    h100 = P.get_preset("h100-sxm")
    assert h100.source_kinds()["assumed"] > P.get_preset("a100-sxm4-40gb").source_kinds()["assumed"]
    assert main(["simulate", "-w", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2",
                 "--microbatches", "4", "--gpu", "h100-sxm"]) == 0
    assert h100.provenance() in capsys.readouterr().out


def test_the_default_clocks_reach_below_every_preset_s_knee():
    """The paper's A100 space, 900-1410 MHz, is kept; on every preset the space reaches a little
    below the V-f knee, where an instruction's least-energy clock lies (Hopper's knee sits low in
    its range: a floor at 64 % of its top clock would cut its frugal clocks off)."""
    from kareus.hardware.knobs import KnobSpace

    a100 = KnobSpace.default(P.get_preset("a100-sxm4-40gb")).clocks_mhz
    assert (a100[0], a100[-1], len(a100)) == (900.0, 1410.0, 18)
    for name in P.PRESETS:
        gpu = P.get_preset(name)
        clocks = KnobSpace.default(gpu).clocks_mhz
        assert clocks[-1] == gpu.clock_max_mhz
        assert clocks[0] <= 0.85 * gpu.knee_mhz, name
        assert clocks[0] >= gpu.clock_min_mhz
