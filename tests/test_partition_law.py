"""The partition law: the artifact's spec in the simulator, the window semantics, the sweep and
calibration files, and the two commands (`kareus calibrate --partition-sweep`,
`kareus partition`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kareus.backends.partition_calibration import (
    PartitionCalibration,
    collective_alone_holdout,
    fit_partition,
    floor_slope,
    predict,
)
from kareus.backends.sim import SimulatorBackend
from kareus.cli import main
from kareus.errors import InputError
from kareus.hardware.partition_sweep import (
    PartitionConfigs,
    PartitionSweep,
    SweepError,
    load_configs,
    load_sweep,
)
from kareus.hardware.presets import get_preset
from kareus.suite.datasets import kareus_artifact
from workloads.errors import WorkloadError
from workloads.partition_spec import PartitionSpec

SPEC = {
    "model": {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 32,
              "intermediate_size": 8192, "attention": "causal", "position_embedding": "rope",
              "norm": "layernorm"},
    "tp": 2, "batch_size": 4, "nanobatch_size": 2, "seq_len": 4096, "dtype": "fp16",
    "ops": ["bias_dropout_add", "layernorm", "qkv_linear", "qkv_split", "rope",
            "flash_attention", "out_proj_linear"],
    "comm": {"kind": "all_reduce", "group_size": 2, "bytes": 33554432, "library": "msccl++"},
}
COLUMNS = ["overlap_start", "overlap_end", "comm_sm_number", "comm_block_size"]


@pytest.fixture()
def spec_file(tmp_path) -> Path:
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(SPEC))
    return p


@pytest.fixture(scope="module")
def spec() -> PartitionSpec:
    return PartitionSpec.from_dict(SPEC)


@pytest.fixture(scope="module")
def a100_40():
    return get_preset("a100-sxm4-40gb")


def _configs(rows: list[tuple[int, int, int, int]]) -> PartitionConfigs:
    a = np.array(rows, dtype=np.int64)
    return PartitionConfigs(a[:, 0], a[:, 1], a[:, 2], a[:, 3])


def test_the_spec_is_the_artifacts_partition(spec):
    part = spec.partition()
    # the fuser's basic ops: each Linear is its GEMM and its Bias; the QKV bias is a kernel, the
    # output projection's is returned (launches nothing), so window index 6 is the attention
    assert [op.name for op in part.compute] == ["bda", "norm", "linear_qkv", "linear_qkv_bias",
                                                "qkv_split", "rope", "flash_attention",
                                                "linear_proj"]
    assert [op.kind for op in part.compute] == ["memory", "memory", "gemm", "memory", "memory",
                                                "memory", "attention", "gemm"]
    # TE's LayerNorm and PyTorch's dropout launch grids that fill the GPU once
    assert [op.resident_grid for op in part.compute] == [True, True] + [False] * 6
    # per GPU: 2 sequences x 4096 tokens, 16 of 32 heads (TP2), head width 64
    qkv = part.compute[2]
    assert qkv.flops == 2 * 8192 * 2048 * 3072 and qkv.depth == 2048
    assert part.compute[3].bytes == 2 * 2 * 8192 * 3072  # the bias add reads and writes it
    attn = part.compute[6]
    assert attn.flops == pytest.approx(4 * 2 * 16 * 64 * 4096 * 4096 / 2)
    assert part.comm.collective == "all_reduce" and part.comm.group == 2
    assert part.comm.bytes == 33554432 and part.comm.bus_bytes == 33554432
    if kareus_artifact("attention_partition/spec.json") is not None:
        shared = PartitionSpec.load(kareus_artifact("attention_partition/spec.json"))
        assert shared.partition() == part


def test_fused_ops_put_each_bias_in_its_gemm():
    fused = PartitionSpec.from_dict({**SPEC, "fuse_ops": True})
    assert [op.name for op in fused.partition().compute] == [
        "bda", "norm", "linear_qkv", "qkv_split", "rope", "flash_attention", "linear_proj"]
    with pytest.raises(WorkloadError, match="fuse_ops must be true or false"):
        PartitionSpec.from_dict({**SPEC, "fuse_ops": "yes"})


@pytest.mark.parametrize("change,fragment", [
    ({"colour": "red"}, "unknown field"),
    ({"model": {**SPEC["model"], "rotary": 1}}, "unknown model field"),
    ({"tp": 3}, "not divisible by tp=3"),
    ({"ops": ["layernorm", "matmul"]}, "unknown op"),
    ({"comm": {**SPEC["comm"], "bytes": 1234}}, "does not match"),
    ({"nanobatch_size": 1}, "half of batch_size"),
    ({"dtype": "fp8"}, "dtype"),
    ({"comm": {**SPEC["comm"], "kind": "broadcast"}}, "comm.kind"),
    ({"model": {**SPEC["model"], "norm": "weird"}}, "model.norm 'weird' is not one of"),
    ({"model": {**SPEC["model"], "norm": "rmsnorm"}}, "model.norm is 'rmsnorm' but the ops run"),
    ({"model": {**SPEC["model"], "position_embedding": "weird"}},
     "model.position_embedding 'weird' is not one of"),
    ({"model": {**SPEC["model"], "position_embedding": "learned"}}, "but the ops run rope"),
    ({"model": {**SPEC["model"], "attention": "sliding"}}, "model.attention must be causal or full"),
    ({"model": {**SPEC["model"], "intermediate_size": 0}}, "intermediate_size must be a positive"),
])
def test_bad_specs_are_refused(change, fragment):
    with pytest.raises(WorkloadError, match=fragment):
        PartitionSpec.from_dict({**SPEC, **change})


def test_window_semantics(spec, a100_40):
    """Launched before op s, waited for after op e: overlapping more compute hides more of a
    slow collective; waiting early exposes it; running it first (-1, -1) hides nothing."""
    part = spec.partition()
    cfg = _configs([(-1, -1, 1, 1024), (0, 6, 1, 1024), (0, 0, 1, 1024), (5, 6, 1, 1024),
                    (0, 6, 12, 1024), (-1, -1, 1, 512)])
    t, e = predict(part, cfg, a100_40, harness=False)
    seq, whole, early, late, many, small_blocks = t
    assert whole < late < seq and whole < early <= seq * 1.001
    assert many < whole  # more SMs: the collective finishes sooner
    assert small_blocks > seq  # fewer threads per block move less per SM
    assert np.all(e > 0)


def test_clock_scales_compute_not_the_host(spec, a100_40):
    part = spec.partition()
    cfg = _configs([(-1, -1, 20, 1024), (2, 6, 9, 1024)])
    fast, _ = predict(part, cfg, a100_40, clock_mhz=1410, harness=False)
    slow, _ = predict(part, cfg, a100_40, clock_mhz=1005, harness=False)
    assert np.all(slow > fast) and np.all(slow < fast * 1410 / 1005)


def _sweep_csv(path: Path, spec: PartitionSpec, gpu, rows, scale: float = 1.0) -> None:
    """A sweep in the artifact's format whose 'measurements' are the preset's own predictions
    (times scaled by ``scale``), three identical repeats."""
    cfg = _configs(rows)
    t, e = predict(spec.partition(), cfg, gpu)
    df = pd.DataFrame(rows, columns=COLUMNS)
    for k in range(3):
        df[f"{k}:time (s)"] = t * scale
        df[f"{k}:total energy (J)"] = e
        df[f"{k}:rank0 energy (J)"] = e / 2
        df[f"{k}:rank1 energy (J)"] = e / 2
    df.to_csv(path, index=False)


ROWS = [(-1, -1, k, b) for k in (1, 2, 4, 8, 16) for b in (512, 1024)] + \
       [(s, e, k, 1024) for s, e in ((0, 6), (2, 4), (5, 6)) for k in (1, 3, 6, 12)]


@pytest.mark.parametrize("mutate,fragment", [
    (lambda df: df.drop(columns=["comm_block_size"]), "missing column"),
    (lambda df: df.assign(**{"1:time (s)": -1.0}), "positive number"),
    (lambda df: df.assign(**{"0:total energy (J)": 0.0}), "positive number"),
    (lambda df: pd.concat([df, df.iloc[[3]]]), "duplicate configuration"),
    (lambda df: df.assign(overlap_start=df.overlap_start.where(df.index != 12, 5),
                          overlap_end=df.overlap_end.where(df.index != 12, 4)), "window"),
    # the partition has 8 kernels (indices 0-7)
    (lambda df: df.assign(overlap_end=df.overlap_end.where(df.index != 12, 8)), "outside"),
    (lambda df: df.assign(overlap_end=df.overlap_end.where(df.index != 0, 3)), "window"),
    (lambda df: df.assign(comm_sm_number=df.comm_sm_number.where(df.index != 1, 0)), "1..32"),
    (lambda df: df.assign(comm_sm_number=df.comm_sm_number.where(df.index != 1, 33)), "1..32"),
])
def test_bad_sweeps_are_refused(tmp_path, spec, a100_40, mutate, fragment):
    good = tmp_path / "good.csv"
    _sweep_csv(good, spec, a100_40, ROWS)
    bad = tmp_path / "bad.csv"
    mutate(pd.read_csv(good)).to_csv(bad, index=False)
    with pytest.raises(SweepError, match=fragment):
        load_sweep(bad, len(spec.partition().compute), a100_40.comm_max_sms)


@pytest.mark.slow
def test_fit_recovers_a_law_it_can_express(tmp_path, spec, a100_40):
    """Measurements made by the law itself (times 8 % slower): the fit matches them closely and
    carries to another clock without refitting."""
    path = tmp_path / "sweep.csv"
    _sweep_csv(path, spec, a100_40, ROWS, scale=1.08)
    sweep = load_sweep(path, len(spec.partition().compute), a100_40.comm_max_sms)
    cal = fit_partition(spec.partition(), sweep, a100_40, spec.sha256, holdout=False)
    assert cal.fit.time_mape_pct < 1.5 and cal.fit.energy_mape_pct < 3.0
    assert cal.fit.best.measured_predicted_rank <= 3
    t, _ = predict(spec.partition(), sweep.configs, cal.apply(a100_40), 1200,
                   np.array(cal.op_work), np.array(cal.op_host))
    assert np.all(np.isfinite(t)) and np.all(t > 0)


def _run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_partition_command_predicts_every_row(tmp_path, spec_file, capsys):
    cfg = tmp_path / "configs.csv"
    pd.DataFrame([(-1, -1, 4, 1024), (2, 6, 9, 1024), (2, 6, 9, 512)],
                 columns=COLUMNS).assign(note="ignored").to_csv(cfg, index=False)
    code, out, _ = _run(["partition", "--spec", str(spec_file), "--configs", str(cfg), "--gpu",
                         "a100-sxm4-40gb", "--json"], capsys)
    assert code == 0
    pts = json.loads(out)["points"]
    assert len(pts) == 3
    assert set(pts[0]) == {*COLUMNS, "time_s", "energy_j"}
    assert pts[1]["time_s"] < pts[0]["time_s"]  # overlap pays at 9 SMs
    code, out, _ = _run(["partition", "--spec", str(spec_file), "--configs", str(cfg), "--gpu",
                         "a100-sxm4-40gb", "--clock", "1200", "--json"], capsys)
    slow = json.loads(out)["points"]
    assert code == 0 and all(s["time_s"] > p["time_s"] for s, p in zip(slow, pts))
    # a clock off the preset's 15 MHz grid runs at the grid clock below it, and says so
    code, out, _ = _run(["partition", "--spec", str(spec_file), "--configs", str(cfg), "--gpu",
                         "a100-sxm4-40gb", "--clock", "1207", "--json"], capsys)
    snapped = json.loads(out)
    assert code == 0 and snapped["clock_mhz"] == 1200.0 and snapped["points"] == slow
    code, out, _ = _run(["partition", "--spec", str(spec_file), "--configs", str(cfg), "--gpu",
                         "a100-sxm4-40gb", "--clock", "1207"], capsys)
    title = "".join(out.split())  # the table's title wraps with the terminal
    assert code == 0 and "at1200MHz(1207MHz,snappeddowntothepreset's15MHzgrid)" in title


def test_the_spec_hash_ignores_free_text_only(spec):
    described = PartitionSpec.from_dict({**SPEC, "description": "at another clock",
                                         "window": "w", "energy": "e"})
    assert described.sha256 == spec.sha256
    other = PartitionSpec.from_dict({**SPEC, "seq_len": 2048,
                                     "comm": {**SPEC["comm"], "bytes": 33554432 // 2}})
    assert other.sha256 != spec.sha256


def test_without_calibration_the_preset_predicts_its_own_sweep(tmp_path, spec_file, capsys):
    """The preset carries the per-op factors of the fit its partition law came from, so a plain
    `kareus partition` predicts the measured sweep as well as a fresh calibration does (and a
    spec the preset was not fitted on falls back to the law with counted work)."""
    sweep_path = kareus_artifact("attention_partition/default_clock.csv")
    if sweep_path is None:
        pytest.skip("needs shared/kareus_artifact")
    sweep = load_sweep(sweep_path, 7, 32)
    code, out, _ = _run(["partition", "--spec", str(spec_file), "--configs", str(sweep_path),
                         "--gpu", "a100-sxm4-40gb", "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    assert "per-op factors" in obj["parameters"]
    t = np.array([p["time_s"] for p in obj["points"]])
    e = np.array([p["energy_j"] for p in obj["points"]])
    assert np.mean(np.abs(t / sweep.time_s - 1)) < 0.01
    assert np.mean(np.abs(e / sweep.energy_j - 1)) < 0.01
    shorter = tmp_path / "short.json"
    shorter.write_text(json.dumps({**SPEC, "seq_len": 2048,
                                   "comm": {**SPEC["comm"], "bytes": 33554432 // 2}}))
    cfg = tmp_path / "configs.csv"
    pd.DataFrame([(0, 6, 4, 1024)], columns=COLUMNS).to_csv(cfg, index=False)
    code, out, _ = _run(["partition", "--spec", str(shorter), "--configs", str(cfg),
                         "--gpu", "a100-sxm4-40gb", "--json"], capsys)
    assert code == 0 and "counted per-op work" in json.loads(out)["parameters"]


def test_calibration_files_must_match_spec_and_gpu(tmp_path, spec, spec_file, capsys):
    cal = PartitionCalibration(gpu="a100-sxm4-40gb", spec_sha256=spec.sha256, clock_mhz=None,
                               law={"comm_launch_s": 5e-6}, op_work=(1.0,) * 8,
                               op_host=(1.0,) * 8)
    good = tmp_path / "calib.json"
    good.write_text(json.dumps(cal.to_dict()))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**cal.to_dict(), "spec_sha256": "0" * 64}))
    cfg = tmp_path / "configs.csv"
    pd.DataFrame([(0, 6, 4, 1024)], columns=COLUMNS).to_csv(cfg, index=False)
    base = ["partition", "--spec", str(spec_file), "--configs", str(cfg), "--json"]
    assert _run([*base, "--gpu", "a100-sxm4-40gb", "--calibration", str(good)], capsys)[0] == 0
    for args, fragment in (([*base, "--gpu", "a100-sxm4-80gb", "--calibration", str(good)],
                            "made for GPU"),
                           ([*base, "--gpu", "a100-sxm4-40gb", "--calibration", str(other)],
                            "another spec")):
        code, out, err = _run(args, capsys)
        assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1
    with pytest.raises(InputError):
        PartitionCalibration.load(tmp_path / "missing.json", "a100-sxm4-40gb", spec.sha256, 8)


@pytest.mark.parametrize("args,fragment", [
    (["--configs", "CFG"], "no such file"),
    (["--configs", "BAD"], "window (0, 9) outside the partition's 8 ops (0 bda, 1 norm, "
                           "2 linear_qkv, 3 linear_qkv_bias, 4 qkv_split, 5 rope, "
                           "6 flash_attention, 7 linear_proj): need 0 <= start <= end <= 7"),
    (["--configs", "CFG_OK", "--clock", "2000"], "outside"),
])
def test_partition_command_bad_input(tmp_path, spec_file, capsys, args, fragment):
    ok = tmp_path / "ok.csv"
    pd.DataFrame([(0, 6, 4, 1024)], columns=COLUMNS).to_csv(ok, index=False)
    bad = tmp_path / "bad.csv"
    pd.DataFrame([(0, 9, 4, 1024)], columns=COLUMNS).to_csv(bad, index=False)
    paths = {"CFG": str(tmp_path / "nope.csv"), "BAD": str(bad), "CFG_OK": str(ok)}
    argv = ["partition", "--spec", str(spec_file), "--gpu", "a100-sxm4-40gb", "--json",
            *[paths.get(a, a) for a in args]]
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_calibrate_command_writes_the_fit_atomically(tmp_path, spec, spec_file, a100_40, capsys,
                                                    monkeypatch):
    # The sweep is the preset's own law, so the fit starts at its optimum: a short budget per
    # least-squares stage keeps the three fits (all data and two hold-out halves) quick.
    monkeypatch.setattr("kareus.backends.partition_calibration.fit_partition",
                        functools.partial(fit_partition, max_nfev_per_param=2))
    sweep = tmp_path / "sweep.csv"
    _sweep_csv(sweep, spec, a100_40, ROWS)
    out_file = tmp_path / "calib.json"
    fig = tmp_path / "fit.png"
    code, out, _ = _run(["calibrate", "--partition-sweep", str(sweep), "--spec", str(spec_file),
                         "--gpu", "a100-sxm4-40gb", "--out", str(out_file), "--figure", str(fig),
                         "--json"], capsys)
    assert code == 0
    rep = json.loads(out)
    assert rep["fit"]["time_mape_pct"] < 2.0 and "holdout" in rep["fit"]
    assert fig.stat().st_size > 0
    cal = PartitionCalibration.load(out_file, "a100-sxm4-40gb", spec.sha256,
                                    len(spec.partition().compute))
    assert set(cal.law) >= {"tuned_bw_per_sm_mhz", "tuned_pipelining", "comm_launch_s",
                            "activity_comm"}
    # the text report says where the measured best ranks and what the predicted best measures
    # (the fit above is reused: the report is what is tested here)
    monkeypatch.setattr("kareus.backends.partition_calibration.fit_partition",
                        lambda *args, **kwargs: cal)
    code, text, _ = _run(["calibrate", "--partition-sweep", str(sweep), "--spec", str(spec_file),
                          "--gpu", "a100-sxm4-40gb", "--out", str(tmp_path / "c2.json")], capsys)
    assert code == 0 and "predicted rank" in text
    assert "predicted fastest: window" in text and "% over the measured fastest" in text
    assert "floor past" in text  # the floor's rise per SM (or why there is none)
    # bad input: nothing written, one line, status 2
    bad = tmp_path / "bad.csv"
    pd.read_csv(sweep).drop(columns=["0:time (s)", "1:time (s)", "2:time (s)"]).to_csv(
        bad, index=False)
    other = tmp_path / "never.json"
    code, out, err = _run(["calibrate", "--partition-sweep", str(bad), "--spec", str(spec_file),
                           "--gpu", "a100-sxm4-40gb", "--out", str(other)], capsys)
    assert code == 2 and not other.exists() and len(err.strip().splitlines()) == 1
    code, _, err = _run(["calibrate", "--partition-sweep", str(sweep), "--gpu",
                         "a100-sxm4-40gb", "--out", str(other)], capsys)
    assert code == 2 and "--spec" in err and not other.exists()


def test_configs_file_ignores_other_columns(tmp_path):
    p = tmp_path / "c.csv"
    pd.DataFrame({"overlap_start": [0], "overlap_end": [3], "comm_sm_number": [4],
                  "comm_block_size": [1024], "extra": ["x"]}).to_csv(p, index=False)
    c = load_configs(p, 7, 32)
    assert len(c) == 1 and c.windows().tolist() == [[0, 3]]


def test_sim_rejects_windows_it_cannot_run(spec, a100_40):
    sim = SimulatorBackend(a100_40)
    part = spec.partition()
    with pytest.raises(InputError, match="threads per block"):
        sim.evaluate_partition(part, np.array([1410.0]), np.array([4]), np.array([[0, 6]]), 48)


def test_collective_alone_holdout_prefers_the_law_that_made_the_data(tmp_path, spec, a100_40):
    # 'Measurements' from the preset's own (pipelined) law: fitted on 1-4 SMs, the pipelined
    # law predicts 8 and 16 SMs better than the series law can.
    sweep_path = tmp_path / "sweep.csv"
    _sweep_csv(sweep_path, spec, a100_40, ROWS)
    part = spec.partition()
    sweep = load_sweep(sweep_path, len(part.compute), a100_40.comm_max_sms)
    out = collective_alone_holdout(part, sweep, a100_40, split_sms=4)
    assert out["series"]["tuned_pipelining"] == 1.0
    assert out["pipelined"]["time_mape_pct"] < out["series"]["time_mape_pct"]
    assert out["pipelined"]["time_mape_pct"] < 1.0
    with pytest.raises(InputError, match="both sides"):
        collective_alone_holdout(part, sweep, a100_40, split_sms=16)


def test_floor_slope_is_the_rise_past_each_windows_fastest_sm_count():
    # Window (0, 3): falls to 4 SMs, then rises 2 us and 0.5 mJ per SM; the prediction is flat
    # past 4 SMs. Window (1, 3) is fastest at its last SM count (too few rows past it) and the
    # sequential window is not an overlap: neither counts.
    k = np.arange(1, 11)
    v_shape = np.where(k < 4, 140.0 - 10 * k, 100.0 + 2 * (k - 4))
    rows = [(0, 3, v_shape), (1, 3, 200.0 - k), (-1, -1, 300.0 - k)]
    configs = PartitionConfigs(*(np.concatenate([np.full(k.size, v) for v in col]) for col in (
        [r[0] for r in rows], [r[1] for r in rows])), np.tile(k, 3), np.full(3 * k.size, 1024))
    time_s = 1e-6 * np.concatenate([r[2] for r in rows])
    energy_j = 1e-3 * np.concatenate([np.where(k < 4, 9.0, 5.0 + 0.5 * (k - 4)),
                                      np.full(k.size, 7.0), np.full(k.size, 8.0)])
    sweep = PartitionSweep(configs, time_s, energy_j, repeats=3)
    flat_t = np.where(configs.sms < 4, time_s, 100e-6)
    out = floor_slope(sweep, flat_t, energy_j)
    assert out.windows == 1
    assert out.measured_us_per_sm == pytest.approx(2.0)
    assert out.predicted_us_per_sm == pytest.approx(0.0, abs=1e-9)
    assert out.measured_mj_per_sm == out.predicted_mj_per_sm == pytest.approx(0.5)
    assert out.to_dict()["by_block"] == {"1024": {
        "windows": 1, "measured_us_per_sm": pytest.approx(2.0),
        "predicted_us_per_sm": pytest.approx(0.0, abs=1e-9)}}
    assert "1024-thread blocks: measured +2.0 us" in out.text()
    none = floor_slope(sweep, time_s, energy_j, min_rows=20)
    assert none.to_dict() == {"windows": 0} and "no window has enough rows" in none.text()


def test_floor_slope_splits_the_rise_by_block_size():
    # The same window with 512- and 1024-thread blocks: fastest at 4 SMs, then rising 4 and
    # 2 us per SM; the mean is over both groups, by_block keeps them apart.
    k = np.arange(1, 11)
    rises = {512: 4.0, 1024: 2.0}
    configs = PartitionConfigs(np.zeros(2 * k.size, dtype=np.int64),
                               np.full(2 * k.size, 3), np.tile(k, 2),
                               np.repeat(list(rises), k.size))
    time_s = 1e-6 * np.concatenate([np.where(k < 4, 140.0 - 10 * k, 100.0 + r * (k - 4))
                                    for r in rises.values()])
    sweep = PartitionSweep(configs, time_s, np.full(time_s.size, 1e-3), repeats=3)
    out = floor_slope(sweep, time_s, sweep.energy_j)
    assert out.windows == 2
    assert out.measured_us_per_sm == pytest.approx(3.0)
    assert {b: v.measured_us_per_sm for b, v in out.by_block.items()} == {
        "512": pytest.approx(4.0), "1024": pytest.approx(2.0)}
    assert out.by_block["512"].predicted_us_per_sm == pytest.approx(4.0)


@pytest.mark.slow
def test_a_refit_does_not_start_from_the_previous_fit(tmp_path, spec, a100_40):
    """The fit chooses its parameters from fixed starting points, so refitting from a preset that
    already carries a fit (``cal.apply``) lands exactly where the first fit did."""
    path = tmp_path / "sweep.csv"
    _sweep_csv(path, spec, a100_40, ROWS, scale=1.08)
    sweep = load_sweep(path, len(spec.partition().compute), a100_40.comm_max_sms)
    first = fit_partition(spec.partition(), sweep, a100_40, spec.sha256, holdout=False)
    again = fit_partition(spec.partition(), sweep, first.apply(a100_40), spec.sha256,
                          holdout=False)
    assert again.law == first.law
    assert again.op_work == first.op_work and again.op_host == first.op_host


def test_one_block_size_keeps_the_presets_thread_exponent(tmp_path, spec, a100_40):
    """A sweep of 512-thread blocks alone sees ``(512 / 1024) ** exponent`` only as one factor
    of the collective's per-SM throughput: the fit keeps the preset's exponent (left out of its
    law, and said so) and fits the throughput under it, so presets with exponents 0.6 and 1.5
    come out with throughputs 2 ** 0.9 apart. Two block sizes free the exponent."""
    from kareus.backends.partition_calibration import held_by_sweep
    # two more sequential rows: at least as many rows as the law has free parameters (18)
    rows = sorted({(s, e, k, 512) for s, e, k, _ in ROWS} | {(-1, -1, 3, 512), (-1, -1, 6, 512)})
    path = tmp_path / "sweep.csv"
    _sweep_csv(path, spec, a100_40, rows, scale=1.08)
    one = load_sweep(path, len(spec.partition().compute), a100_40.comm_max_sms)
    assert held_by_sweep(spec.partition(), one) == ["tuned_block_exponent"]
    bw = {}
    for exponent in (0.6, 1.5):
        cal = fit_partition(spec.partition(), one,
                            a100_40.with_overrides(tuned_block_exponent=exponent), spec.sha256,
                            holdout=False, max_nfev_per_param=3)
        assert "tuned_block_exponent" not in cal.law
        assert cal.fit.kept_from_preset == ("tuned_block_exponent",)
        bw[exponent] = cal.law["tuned_bw_per_sm_mhz"]
    assert bw[1.5] / bw[0.6] == pytest.approx(2 ** 0.9, rel=0.02)
    both = tmp_path / "both.csv"
    _sweep_csv(both, spec, a100_40, ROWS)
    assert held_by_sweep(spec.partition(), load_sweep(both, len(spec.partition().compute),
                                                      a100_40.comm_max_sms)) == []


def test_what_the_collective_never_runs_beside_keeps_the_presets_values(tmp_path, spec, a100_40):
    """A partition without attention (an MLP's, say) cannot see the attention class's host time,
    slowdown or collective rate; one of memory ops only cannot see the GEMMs' either, nor the
    link cap beside them or the wave a tiled kernel loses; a sweep of the sequential window alone
    sees no contention at all. The fit keeps the preset's values for them."""
    from dataclasses import replace

    from kareus.backends.partition_calibration import _TIME_PARAMS, held_by_sweep
    path = tmp_path / "sweep.csv"
    _sweep_csv(path, spec, a100_40, ROWS)
    sweep = load_sweep(path, len(spec.partition().compute), a100_40.comm_max_sms)
    part = spec.partition()
    no_attention = replace(part, compute=tuple(
        replace(op, kind="gemm", uneven_tail=None) if op.kind == "attention" else op
        for op in part.compute))
    attention_names = {"host_issue_attention_s", "overlap_slowdown_attention",
                       "comm_rate_beside_attention"}
    assert set(held_by_sweep(no_attention, sweep)) == attention_names
    memory_only = replace(part, compute=tuple(replace(op, kind="memory", uneven_tail=None)
                                              for op in part.compute))
    assert set(held_by_sweep(memory_only, sweep)) == attention_names | {
        "host_issue_gemm_s", "overlap_slowdown_gemm", "comm_rate_beside_gemm",
        "tuned_link_fraction_beside_compute", "partial_wave_loss"}
    sequential = sweep.subset(sweep.configs.start < 0)
    contention = {name for name, _, _ in _TIME_PARAMS
                  if name.startswith(("overlap_slowdown_", "comm_rate_beside_"))}
    assert set(held_by_sweep(part, sequential)) == contention | {
        "tuned_link_fraction_beside_compute", "partial_wave_loss"}
    # the fit: the attention class's values stay the preset's (not the fit's starting point)
    gpu = a100_40.with_overrides(comm_rate_beside_attention=0.37, overlap_slowdown_attention=2.5)
    cal = fit_partition(no_attention, sweep, gpu, spec.sha256, holdout=False,
                        max_nfev_per_param=1)  # which values are fitted, not how well
    assert not attention_names & set(cal.law)
    assert cal.apply(gpu).comm_rate_beside_attention == 0.37
    assert set(cal.fit.kept_from_preset) == attention_names


def test_ops_after_every_wait_keep_their_counted_work():
    # the sweep's windows end at op 6 at the latest, so op 7 (the output projection) runs after
    # the compute stream's wait everywhere: the fit holds its work factor at 1
    from kareus.backends.partition_calibration import _never_overlapped
    cfg = _configs([(-1, -1, 4, 1024), (0, 6, 4, 1024), (2, 5, 9, 512)])
    assert _never_overlapped(cfg, 8).tolist() == [False] * 7 + [True]
    assert not _never_overlapped(_configs([(0, 7, 4, 1024)]), 8).any()


def test_factors_for_another_numbering_are_refused(spec, a100_40):
    # factors fitted when the spec's linears were one op each (7) do not fit its 8 kernels
    from kareus.backends.partition_calibration import predict, scaled_partition
    part = spec.partition()
    with pytest.raises(InputError, match="7 per-op work factors for a partition of 8 kernels"):
        scaled_partition(part, np.ones(7))
    with pytest.raises(InputError, match="per-op host factors"):
        predict(part, _configs([(0, 6, 4, 1024)]), a100_40, None, np.ones(8), np.ones(7))


def test_writing_fuse_ops_false_keeps_the_specs_hash():
    assert PartitionSpec.from_dict({**SPEC, "fuse_ops": False}).sha256 == \
        PartitionSpec.from_dict(SPEC).sha256 != PartitionSpec.from_dict(
            {**SPEC, "fuse_ops": True}).sha256


def test_a_sweep_of_one_overlapped_window_fits_and_says_why_it_has_no_hold_out(tmp_path, spec,
                                                                                a100_40):
    """The hold-out fits on every other window: with one overlapped window one half would hold
    the sequential window alone, so the law is fitted without it, and the calibration says so."""
    rows = [(-1, -1, k, b) for k in (1, 2, 4, 8, 16) for b in (512, 1024)] + \
        [(0, 6, k, b) for k in (1, 3, 6, 12, 16) for b in (512, 1024)]
    path = tmp_path / "sweep.csv"
    _sweep_csv(path, spec, a100_40, rows)
    sweep = load_sweep(path, len(spec.partition().compute), a100_40.comm_max_sms)
    cal = fit_partition(spec.partition(), sweep, a100_40, spec.sha256, max_nfev_per_param=1)
    assert "each half of the windows needs an overlapped one" in cal.fit.holdout.skipped
    assert "time_mape_pct" not in cal.to_dict()["fit"]["holdout"]


def test_a_fit_report_reads_back_from_its_json_and_refuses_a_malformed_one(tmp_path, spec):
    """A calibration file's ``fit`` object is the typed report's JSON form: written and read back
    it is the same report; a malformed field is named in one line."""
    from kareus.backends.partition_fit_report import (
        BestConfigurations,
        FloorSlope,
        HoldoutHalf,
        PartitionFitReport,
        PartitionHoldout,
        SweepConfiguration,
    )

    best = BestConfigurations(SweepConfiguration(2, 6, 9, 1024), 2.670e-3, 1,
                              SweepConfiguration(2, 6, 9, 1024), 2.684e-3, 2.670e-3, 0.0)
    halves = (HoldoutHalf(((0, 1), (2, 6)), ((0, 2),), 1.1, 0.7),
              HoldoutHalf(((0, 2),), ((0, 1), (2, 6)), 0.9, 0.6))
    report = PartitionFitReport(640, 3, 0.66, 0.59, 2.8, best, FloorSlope(0),
                                ("tuned_block_exponent",), PartitionHoldout(halves))
    assert report.holdout.time_mape_pct == pytest.approx(1.0)
    assert PartitionFitReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    cal = PartitionCalibration(gpu="a100-sxm4-40gb", spec_sha256=spec.sha256, clock_mhz=None,
                               law={"comm_launch_s": 5e-6}, op_work=(1.0,) * 8,
                               op_host=(1.0,) * 8, fit=report)
    path = tmp_path / "calib.json"
    path.write_text(json.dumps(cal.to_dict()))
    assert PartitionCalibration.load(path, "a100-sxm4-40gb", spec.sha256, 8) == cal
    broken = cal.to_dict()
    broken["fit"]["rows"] = "many"
    path.write_text(json.dumps(broken))
    with pytest.raises(InputError, match="malformed calibration: fit: rows is 'many', not an "
                                         "integer$"):
        PartitionCalibration.load(path, "a100-sxm4-40gb", spec.sha256, 8)


def test_calibrate_prints_the_fit_report(tmp_path, spec, spec_file, capsys, monkeypatch):
    """`kareus calibrate --partition-sweep` prints the typed report's lines: the fit, the
    hold-out, the fastest configurations and the floor."""
    from kareus.backends.partition_fit_report import (
        BestConfigurations,
        FloorSlope,
        PartitionFitReport,
        PartitionHoldout,
        SweepConfiguration,
    )

    a100 = get_preset("a100-sxm4-40gb")
    _sweep_csv(sweep := tmp_path / "sweep.csv", spec, a100, ROWS)
    best = BestConfigurations(SweepConfiguration(0, 3, 4, 1024), 1e-3, 2,
                              SweepConfiguration(0, 3, 5, 1024), 0.99e-3, 1.01e-3, 1.0)
    report = PartitionFitReport(len(ROWS), 1, 0.5, 0.4, 1.5, best, FloorSlope(0),
                                holdout=PartitionHoldout(skipped="skipped: too few windows"))
    cal = PartitionCalibration("a100-sxm4-40gb", spec.sha256, None, {"comm_launch_s": 5e-6},
                               (1.0,) * 8, (1.0,) * 8, report)
    monkeypatch.setattr("kareus.backends.partition_calibration.fit_partition",
                        lambda *a, **k: cal)
    code, out, _ = _run(["calibrate", "--partition-sweep", str(sweep), "--spec", str(spec_file),
                         "--gpu", "a100-sxm4-40gb", "--out", str(tmp_path / "c.json")], capsys)
    assert code == 0
    for line in report.lines():
        assert "  " + line in out
    assert "hold-out (fit on half the windows" in out and "skipped: too few windows" in out
    assert "predicted rank 2 of" in out and "+1.0 % over the measured fastest" in out
