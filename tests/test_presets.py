"""Presets as data: the GPU files load to exactly the presets the suite had in code (a frozen
copy, tests/data/presets_frozen.json, dumped from the code presets before they became files),
a user adds a GPU by adding a file, a malformed file is refused in one line, and a refit
rewrites one file."""

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
])
def test_malformed_file_is_refused_in_one_line(user_dir, capsys, edit, message):
    path = _copy("a40", "bad-gpu", user_dir, edit)
    P.reload_presets()
    with pytest.raises(PresetError, match=message):
        P.get_preset("a40")
    assert main(["gpus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and message in err


def test_not_json_and_duplicate_names(user_dir, capsys):
    (user_dir / "broken.json").write_text("{\"name\": ")
    P.reload_presets()
    assert main(["gpus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "broken.json: not valid JSON" in err
    (user_dir / "broken.json").unlink()
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
    assert P.get_preset("a100-sxm4-40gb").gemm_efficiency == 0.7085
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
                               (1.5,) * n, (0.5,) * n, {})
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
