"""Input a skeptical user tries: each refused in one line with exit status 2 before any work,
leaving nothing on disk (or, where the input is odd but valid, accepted)."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from kareus import reproduction
from kareus.atomic import check_writable_dir, check_writable_file
from kareus.cli import main
from kareus.errors import InputError
from tests.conftest import artifact_or_skip, profile_or_skip
from workloads import make_workload
from workloads.parallel import ParallelConfig


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_2(code: int, err: str, fragment: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and fragment in err, err


def _groups_by_coordinates(tp, cp, dp, pp, vary):
    """Every group of a 4-D job whose ranks differ only in the coordinates ``vary`` (of ``tp,
    cp, dp, pp``), listed from Megatron-LM's rank formula rather than from strides."""
    import itertools

    dims = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    groups: dict[tuple, list[int]] = {}
    for t, c, d, q in itertools.product(*(range(dims[k]) for k in ("tp", "cp", "dp", "pp"))):
        coord = {"tp": t, "cp": c, "dp": d, "pp": q}
        key = tuple(v for k, v in coord.items() if k not in vary)
        groups.setdefault(key, []).append(t + tp * (c + cp * (d + dp * q)))
    return list(groups.values())


def _slowest(groups, g):
    """(nodes, ranks on the emptiest node) of the group spread widest, then emptiest."""
    shapes = []
    for ranks in groups:
        per_node = {}
        for r in ranks:
            per_node[r // g] = per_node.get(r // g, 0) + 1
        shapes.append((len(per_node), -min(per_node.values())))
    nodes, neg = max(shapes)
    return nodes, -neg


@pytest.mark.parametrize("tp, cp, dp, pp", [(4, 1, 3, 2), (2, 1, 3, 4), (3, 2, 2, 2), (8, 1, 2, 2),
                                            (1, 1, 5, 3), (2, 3, 1, 2), (16, 1, 4, 1)])
@pytest.mark.parametrize("g", [1, 3, 4, 5, 6, 8, 16])
def test_group_placement_is_the_slowest_group_of_its_kind(tp, cp, dp, pp, g):
    """Groups of one kind can straddle node boundaries the first one does not (TP4 on nodes of
    6: ranks 4-7 sit two and two); the placement is the slowest group's, checked against every
    group listed from the rank formula: TP, CP, the gradient group (DP x CP) of each stage."""
    p = ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, gpus_per_node=g)
    assert p.group_placement(tp, 1) == (_slowest(_groups_by_coordinates(tp, cp, dp, pp, {"tp"}), g)
                                        if tp > 1 else (1, 1))
    if cp > 1:
        assert p.group_placement(cp, tp) == _slowest(
            _groups_by_coordinates(tp, cp, dp, pp, {"cp"}), g)
    grad = _groups_by_coordinates(tp, cp, dp, pp, {"cp", "dp"})
    for stage in range(pp):
        mine = [r for r in grad if r[0] // p.gpus_per_stage == stage]
        assert p.group_placement(dp * cp, tp, stage) == (_slowest(mine, g) if dp * cp > 1
                                                         else (1, 1))


def test_a_data_parallel_degree_past_any_cluster_is_refused(capsys):
    code, _, err = run(capsys, "simulate", "-w", "llama3.2-3b", "--dp", "99999999999999999999")
    one_line_2(code, err, "at most 1,048,576")


def test_odd_sequence_runs_without_context_parallelism():
    assert make_workload("llama3.2-3b", seq=4097).parallel.seq == 4097
    with pytest.raises(InputError, match=r"divisible by 2\*CP=4"):
        make_workload("llama3.2-3b", seq=4097, cp=2)


def test_a_nanobatched_optimizer_refuses_an_odd_micro_batch(capsys, tmp_path):
    code, out, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", "nanobatch", "--mbs", "3",
                         "--export", str(tmp_path / "plans"))
    one_line_2(code, err, "refused the job: micro-batch size 3 cannot be split")
    assert ".py:" not in err  # the user's to fix: no source location
    assert not (tmp_path / "plans").exists()
    # a run of only nanobatched optimizers is refused before any work; one of several
    # refusing is recorded, and the others run
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "nanobatch,nanobatch-perseus",
                              "--mbs", "3", "--out", str(tmp_path / "all")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "plan only nanobatched execution" in err
    assert not (tmp_path / "all").exists()
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "nanobatch", "--mbs", "3",
                              "--out", str(tmp_path / "one")]) == 2
    assert "nanobatch plans only nanobatched execution" in capsys.readouterr().err
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "nanobatch,megatron",
                              "--mbs", "3", "--out", str(tmp_path / "some")]) == 0
    capsys.readouterr()
    summary = json.loads((tmp_path / "some" / "summary.json").read_text())
    assert summary["optimizers"]["megatron"]["status"] == "ok"
    refused = summary["optimizers"]["nanobatch"]
    assert refused["status"] == "failed" and refused["refused"] is True
    assert "refused" not in summary["optimizers"]["megatron"]


def test_writable_folder_check_leaves_nothing_and_refuses_an_empty_path(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    assert check_writable_dir(target, "--out") == target
    assert not (tmp_path / "a").exists()
    check_writable_dir(tmp_path / "d" / ".." / "e", "--out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="cannot write results there"):
        check_writable_dir(tmp_path / "file" / "x", "--out")
    with pytest.raises(InputError, match="--out: empty path"):
        check_writable_dir("", "--out")


def test_a_tilde_the_shell_left_is_the_home_folder_not_a_folder_named_tilde(tmp_path,
                                                                           monkeypatch):
    """`--out=~/res` reaches the command unexpanded; it must not create ./~/res."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert check_writable_dir("~/res", "--out") == tmp_path / "home" / "res"
    assert check_writable_file("~/plots/f.png", "--plot") == tmp_path / "home" / "plots" / "f.png"
    assert not (tmp_path / "~").exists()


def test_writable_file_check_refuses_a_folder_an_empty_path_and_an_unwritable_folder(tmp_path):
    target = tmp_path / "new" / "plot.png"
    assert check_writable_file(target, "--plot") == target
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing, the folder included
    with pytest.raises(InputError, match="--plot .* is a folder"):
        check_writable_file(tmp_path, "--plot")
    with pytest.raises(InputError, match="--plot: empty path"):
        check_writable_file(" ", "--plot")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="--plot's folder .*cannot write results there"):
        check_writable_file(tmp_path / "file" / "plot.png", "--plot")


def test_writable_file_check_refuses_a_file_the_command_also_reads_or_writes(tmp_path,
                                                                            monkeypatch):
    data = tmp_path / "sweep.csv"
    data.write_text("measured\n")
    monkeypatch.chdir(tmp_path)
    for same in (data, "sweep.csv", "./sub/../sweep.csv"):
        with pytest.raises(InputError, match="--out .* is also the --sweep file"):
            check_writable_file(same, "--out", {"--sweep": str(data), "--spec": None})
    with pytest.raises(InputError, match="is also the --out file"):  # neither exists yet
        check_writable_file("fit.png", "--figure", {"--out": str(tmp_path / "fit.png")})
    assert check_writable_file("fit.json", "--out", {"--sweep": str(data)}) == Path("fit.json")
    assert data.read_text() == "measured\n"


@pytest.mark.parametrize("args,fragment", [
    (["frontier", "-w", "gpt3-xl", "-o", "perseus", "--export", ""], "--export: empty path"),
    (["simulate", "-w", ""], "unknown workload ''"),
    (["workloads", "--show", "/dev/null"], "is not a regular file"),
])
def test_empty_and_odd_paths(capsys, args, fragment):
    code, _, err = run(capsys, *args)
    one_line_2(code, err, fragment)


def test_reproduce_refuses_an_empty_out_and_names_each_optimizer_once(capsys, tmp_path,
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "megatron", "--out", ""]) == 2
    assert "--out: empty path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "", "--out", "x"]) == 2
    assert "--optimizers is empty" in capsys.readouterr().err
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "megatron,,perseus",
                              "--out", "x"]) == 2
    assert "has an empty item" in capsys.readouterr().err
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "megatron,megatron",
                              "--out", str(tmp_path / "twice")]) == 0
    assert "computing 1 cell(s)" in capsys.readouterr().err


@pytest.mark.parametrize("damage,fragment", [
    (lambda d: (d / "cells").write_text(""), "cells: should be a folder"),
    (lambda d: (d / ".lock").mkdir(), ".lock: should be a regular file"),
    (lambda d: (d / "summary.json").mkdir(), "summary.json: should be a regular file"),
    (lambda d: os.mkfifo((d / "cells").mkdir() or d / "cells" / "megatron.json"),
     "megatron.json: should be a regular file"),  # opening a FIFO would block the run
    (lambda d: (d / "cells" / "megatron.json").mkdir(parents=True), "megatron.json: should be"),
])
def test_a_damaged_results_folder_is_refused(capsys, tmp_path, damage, fragment):
    (out := tmp_path / "run").mkdir()
    damage(out)
    assert reproduction.main(["-w", "gpt3-xl", "--optimizers", "megatron",
                              "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and fragment in err


def test_calibrate_refuses_options_its_mode_does_not_read(capsys, tmp_path):
    prof = str(profile_or_skip("gpt3-175b+a100_sxm_bf16.csv"))
    for extra, fragment in ((["--out", str(tmp_path / "x.json")], "--out applies to"),
                            (["-w", "gpt3-xl"], "--workload applies to --gpu-measure only"),
                            (["--figure", str(tmp_path / "f.png")], "--figure applies to"),
                            (["--no-partitions"], "--partitions/--no-partitions applies to"),
                            (["--static-power", "600"], "is not below the power limit 500 W")):
        code, _, err = run(capsys, "calibrate", "--profile", prof, "--gpu", "a100-sxm4-80gb",
                           *extra)
        one_line_2(code, err, fragment)


def test_partition_calibration_checks_its_files_before_the_fit(capsys, tmp_path):
    spec = str(artifact_or_skip("attention_partition/spec.json"))
    sweep = artifact_or_skip("attention_partition/default_clock.csv")
    base = ["calibrate", "--gpu", "a100-sxm4-40gb", "--spec", spec]
    out = str(tmp_path / "cal.json")
    code, _, err = run(capsys, *base, "--partition-sweep", str(sweep), "--out", out,
                       "--figure", str(tmp_path / "fig.txt"))
    one_line_2(code, err, "cannot tell the figure's format from its suffix")
    copy = tmp_path / "sweep.csv"  # the measured sweep is never overwritten (a copy, to be safe)
    copy.write_bytes(sweep.read_bytes())
    for option in ("--out", "--figure"):
        other = ("--out", out) if option == "--figure" else ()
        code, _, err = run(capsys, *base, "--partition-sweep", str(copy), *other, option,
                           str(copy))
        one_line_2(code, err, f"{option} {copy} is also the --partition-sweep file")
    assert copy.read_bytes() == sweep.read_bytes()
    rows = pd.read_csv(sweep)
    sequential = tmp_path / "sequential.csv"
    rows[rows.overlap_start < 0].to_csv(sequential, index=False)
    code, _, err = run(capsys, *base, "--partition-sweep", str(sequential), "--out", out)
    one_line_2(code, err, "no row with the collective beside compute")
    long_rows = tmp_path / "long.csv"
    long_rows.write_text("overlap_start,overlap_end,comm_sm_number,comm_block_size\n"
                         "0,6,4,512,9\n")
    code, _, err = run(capsys, "partition", "--gpu", "a100-sxm4-40gb", "--spec", spec,
                       "--configs", str(long_rows), "--json")
    one_line_2(code, err, "more fields than the header's 4 columns")
    assert not (tmp_path / "cal.json").exists()


def test_the_solver_unit_bounds():
    from kareus.methods.solver_units import MAX_UNITS_PER_INSTRUCTION, unit_problem

    times = [0.004, 0.1]  # s
    assert unit_problem(0.004, times, exact=True) == ""  # the fastest is one unit
    assert "longer than the fastest" in unit_problem(0.0041, times, exact=True)
    finest = 0.1 / MAX_UNITS_PER_INSTRUCTION
    assert unit_problem(finest, times, exact=True) == ""
    assert "at most 10,000" in unit_problem(finest * 0.99, times, exact=True)
    assert unit_problem(finest * 0.99, times, exact=False) == ""  # the fast solver coarsens
    assert "not a positive number" in unit_problem(float("nan"), times, exact=False)


def test_a_solver_unit_the_job_cannot_use_is_refused(capsys):
    code, _, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", "perseus",
                       "--set", "unit_ms=1e9")
    one_line_2(code, err, "refused the job: --set unit_ms=1e+09: 1e+09 ms is longer than the "
                          "fastest instruction")


@pytest.mark.parametrize("unit,fragment", [
    ("inf", "--unit-ms inf is not a positive number of ms"),
    ("1e9", "longer than the fastest instruction (50.16 ms)"),
    ("0.001", "at most 10,000"),
])
def test_the_solver_unit_must_fit_the_profile(capsys, unit, fragment):
    prof = str(profile_or_skip("gpt3-175b+a100_sxm_bf16.csv"))
    for command in ("perseus", "envpipe"):
        code, _, err = run(capsys, command, "--profile", prof, "--stages", "8",
                           "--microbatches", "12", "--p-static", "83.64", "--unit-ms", unit)
        one_line_2(code, err, fragment)


@pytest.mark.parametrize("edit,fragment", [
    ({"n_embed": 0}, "n_embed must be a positive integer, got 0"),
    ({"hidden_size": 2048}, "n_embed = 1024 and hidden_size = 2048 contradict each other"),
    ({"model_type": 5}, "model_type must be a family's name, got 5"),
])
def test_hugging_face_config_wording(capsys, tmp_path, edit, fragment):
    pytest.importorskip("transformers")
    raw = {"model_type": "bloom", "n_embed": 1024, "n_head": 16, "n_layer": 24,
           "vocab_size": 250880, **edit}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    code, _, err = run(capsys, "workloads", "--show", str(tmp_path))
    one_line_2(code, err, fragment)


def test_a_shared_dir_that_is_not_a_folder_is_refused(tmp_path, monkeypatch):
    """``$KAREUS_SHARED_DIR`` naming no folder is the user's mistake, not a cue to read
    ``../shared`` instead."""
    from kareus.errors import InputError
    from kareus.suite.datasets import shared_dir, vtrain_runs

    monkeypatch.setenv("KAREUS_SHARED_DIR", str(tmp_path / "nope"))
    with pytest.raises(InputError, match=r"\$KAREUS_SHARED_DIR=.*nope: not a folder"):
        vtrain_runs("single_node.csv")
    monkeypatch.setenv("KAREUS_SHARED_DIR", str(tmp_path))
    assert shared_dir() == tmp_path and vtrain_runs("single_node.csv") is None


def test_a_partition_sweep_too_small_for_the_law_is_refused(capsys, tmp_path):
    spec = str(artifact_or_skip("attention_partition/spec.json"))
    sweep = artifact_or_skip("attention_partition/default_clock.csv")
    rows = pd.read_csv(sweep)
    seq, win = rows[rows.overlap_start < 0], rows[(rows.overlap_start == 0)
                                                  & (rows.overlap_end == 6)]
    out = tmp_path / "cal.json"
    for name, part, fragment in (("few", pd.concat([seq.head(2), win.head(1)]), "needs at least"),
                                 ("overlapped_only", win.head(3), "needs at least")):
        path = tmp_path / f"{name}.csv"
        part.to_csv(path, index=False)
        code, _, err = run(capsys, "calibrate", "--gpu", "a100-sxm4-40gb", "--spec", spec,
                           "--partition-sweep", str(path), "--out", str(out))
        one_line_2(code, err, fragment)
    assert not out.exists()


@pytest.mark.parametrize("edit,fragment", [
    (lambda d: d.update(fit=[1]), "fit is a list"),
    (lambda d: d.update(fit="abc"), "fit is a str"),
    (lambda d: d.update(law={}), "names no parameter"),
    (lambda d: d.update(law={"sms": 100}), "'sms' is not a parameter"),
    (lambda d: d.update(law={"tuned_pipelining": True}), "tuned_pipelining = True"),
    (lambda d: d.update(law={"tuned_link_fraction": 1.5}), "tuned_link_fraction = 1.5"),
    (lambda d: d.update(law={"comm_launch_s": -1e-6}), "comm_launch_s = -1e-06"),
    (lambda d: d.update(clock_mhz="fast"), "clock_mhz 'fast'"),
])
def test_a_malformed_partition_calibration_file_is_refused(capsys, tmp_path, edit, fragment):
    from kareus.backends.partition_calibration import PartitionCalibration
    from workloads.partition_spec import PartitionSpec

    spec_path = artifact_or_skip("attention_partition/spec.json")
    spec = PartitionSpec.load(spec_path)
    n = len(spec.partition().compute)
    record = PartitionCalibration(gpu="a100-sxm4-40gb", spec_sha256=spec.sha256, clock_mhz=None,
                                  law={"comm_launch_s": 5e-6}, op_work=(1.0,) * n,
                                  op_host=(1.0,) * n).to_dict()
    edit(record)
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(record))
    configs = tmp_path / "configs.csv"
    configs.write_text("overlap_start,overlap_end,comm_sm_number,comm_block_size\n0,2,8,1024\n")
    code, out, err = run(capsys, "partition", "--gpu", "a100-sxm4-40gb", "--spec", str(spec_path),
                         "--configs", str(configs), "--calibration", str(cal))
    assert out == ""
    one_line_2(code, err, fragment)


def test_a_profile_whose_power_no_gpu_draws_is_refused(capsys, tmp_path):
    prof = pd.read_csv(profile_or_skip("bloom+a100_sxm_bf16.csv"))
    for name, scale, fragment in (("kj", 1000.0, "291,014.0 W"), ("mj", 1e-3, "0.3 W")):
        path = tmp_path / f"{name}.csv"
        prof.assign(energy=prof.energy * scale).to_csv(path, index=False)
        code, _, err = run(capsys, "calibrate", "--profile", str(path), "--gpu", "a100-sxm4-40gb",
                           "--write-preset")
        one_line_2(code, err, fragment)
        assert "joules per instruction of one GPU" in err


def test_a_profile_time_past_an_hour_is_a_unit_mistake(capsys, tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text("stage,instruction,frequency,time,energy\n0,forward,1410,1e308,24\n"
                    "0,backward,1410,0.1,24\n0,forward,1200,0.2,20\n0,backward,1200,0.2,20\n")
    code, _, err = run(capsys, "perseus", "--profile", str(path), "--stages", "1",
                       "--microbatches", "2", "--p-static", "60")
    one_line_2(code, err, "over 3600 s; time must be seconds")


def test_a_precision_the_gpu_lacks_is_refused_before_any_cell(capsys, tmp_path, monkeypatch):
    from kareus.hardware.presets import BUILTIN_DIR

    gpus = tmp_path / "gpus"
    gpus.mkdir()
    preset = json.loads((BUILTIN_DIR / "a100-sxm4-40gb.json").read_text())
    preset["name"] = "fp16-only"
    preset["compute"]["precisions"]["value"] = ["fp16", "fp32"]
    (gpus / "fp16-only.json").write_text(json.dumps(preset))
    monkeypatch.setenv("KAREUS_GPU_DIR", str(gpus))
    for args in (["-w", "gpt3-xl"], ["--suite", "smoke"]):
        assert reproduction.main([*args, "--gpu", "fp16-only", "--optimizers", "megatron",
                                  "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err.strip() == "error: fp16-only cannot run bf16; choose --precision from fp16, fp32"
    assert not (tmp_path / "out").exists()
    code, out, _ = run(capsys, "gpus")  # the listing shows it all the same
    assert code == 0 and "fp16-only" in out


def test_solver_for_an_optimizer_without_one_is_refused_as_set_solver_is(capsys):
    """``--solver`` is ``--set solver=``: an optimizer that solves no time-cost tradeoff refuses
    both (one line, exit 2, before any work), naming the optimizers that have one."""
    code, out, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", "megatron", "--solver",
                         "exact", "--json")
    one_line_2(code, err, "--solver: megatron has no time-cost solver to choose (perseus, "
                          "nanobatch-perseus, kareus have one)")
    assert out == ""
    code, _, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", "megatron", "--set",
                       "solver=exact", "--json")
    one_line_2(code, err, "--set solver: no optimizer of this run (megatron) has that setting")


def test_a_share_above_one_in_a_gpu_file_is_refused(capsys, tmp_path, monkeypatch):
    """An efficiency is a share of a peak: 1.5 would run the network past its line rate."""
    from kareus.hardware.presets import BUILTIN_DIR

    gpus = tmp_path / "gpus"
    gpus.mkdir()
    preset = json.loads((BUILTIN_DIR / "a100-sxm4-40gb.json").read_text())
    preset["name"] = "fast-net"
    preset["links_collectives"]["network_efficiency"]["value"] = 1.5
    (gpus / "fast-net.json").write_text(json.dumps(preset))
    monkeypatch.setenv("KAREUS_GPU_DIR", str(gpus))
    code, _, err = run(capsys, "simulate", "-w", "gpt3-xl", "--gpu", "fast-net", "--dp", "4")
    one_line_2(code, err, "network_efficiency is a fraction, at most 1, got 1.5")


def test_hostile_input_files_are_refused_before_they_are_read(capsys, tmp_path):
    """A device never ends (/dev/zero) and JSON nested past the parser's recursion limit would
    end in a traceback: each is one line, exit 2."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for args, fragment in (
            (("workloads", "--show", str(deep)), "is not valid JSON: nested too deeply"),
            (("simulate", "-w", str(deep)), "is not valid JSON: nested too deeply"),
            (("partition", "--spec", "/dev/zero", "--configs", str(deep), "--gpu",
              "a100-sxm4-40gb"), "/dev/zero: is not a regular file"),
            (("partition", "--spec", str(deep), "--configs", str(deep), "--gpu",
              "a100-sxm4-40gb"), "not a JSON spec"),
            (("calibrate", "--profile", "/dev/zero", "--gpu", "a100-sxm4-40gb"),
             "profile '/dev/zero' is not a regular file")):
        code, _, err = run(capsys, *args)
        one_line_2(code, err, fragment)
    folder = tmp_path / "model"
    (folder / "config.json").mkdir(parents=True)
    code, _, err = run(capsys, "workloads", "--show", str(folder))
    one_line_2(code, err, "config.json is a folder, not a file")


def test_flash_attention_asked_for_with_32_bit_tensors_is_refused(capsys):
    code, _, err = run(capsys, "simulate", "-w", "gpt3-xl", "--precision", "fp32",
                       "--attention", "flash")
    one_line_2(code, err, "--attention flash needs 16-bit tensors")
    code, _, _ = run(capsys, "simulate", "-w", "gpt3-xl", "--precision", "fp32")
    assert code == 0  # without --attention the 32-bit job runs the unfused path


def test_input_paths_the_system_will_not_look_at_are_refused(tmp_path):
    from kareus.inputs import file_problem

    assert file_problem("x" * 300).startswith("cannot be read (")  # ENAMETOOLONG
    good = tmp_path / "spec.json"
    good.write_text("{}")
    (tmp_path / "link.json").symlink_to(good)
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    assert file_problem(tmp_path / "link.json") is None
    assert file_problem(tmp_path / "zero.json") == "is not a regular file"
    assert file_problem("~/surely-not-here.json") == "does not exist"  # ``~`` is the caller's


def test_an_empty_clock_and_a_power_out_of_range_are_named(capsys, tmp_path):
    code, _, err = run(capsys, "calibrate", "--gpu", "a100-sxm4-40gb", "--gpu-measure",
                       "--clocks", "1410,,1200", "-w", "qwen3-1.7b")
    one_line_2(code, err, "--clocks '1410,,1200' has an empty item")
    profile = tmp_path / "p.csv"
    profile.write_text("stage,instruction,frequency,time,energy\n" + "".join(
        f"0,{ins},{f},1,1\n" for ins in ("forward", "backward") for f in (1200, 1410)))
    for value in ("0", "20000"):
        code, _, err = run(capsys, "perseus", "--profile", str(profile), "--stages", "1",
                           "--microbatches", "2", "--p-static", value)
        one_line_2(code, err, "--p-static must be watts above 0 and below 10,000")


def test_a_sequence_past_the_learned_positions_is_warned_about(capsys):
    code, out, _ = run(capsys, "simulate", "-w", "gpt3-xl", "--seq", "4096", "--json")
    assert code == 0 and json.loads(out)["position_warnings"] == [
        "--seq 4096 is longer than the 2048 positions gpt3-xl learned: the model itself cannot "
        "run it (the simulator does, as if its table were longer)"]
    code, out, _ = run(capsys, "simulate", "-w", "llama3.2-3b", "--seq", "8192", "--json")
    assert code == 0 and json.loads(out)["position_warnings"] == []  # RoPE sets no table


def test_a_clock_step_that_makes_a_billion_clocks_is_refused(capsys, tmp_path, monkeypatch):
    """Every optimizer sweeps the clock grid: a step of 1e-6 MHz would make 1.5 billion clocks
    (24 GB, minutes) from a file that otherwise looks right."""
    from kareus.hardware.presets import BUILTIN_DIR

    raw = json.loads((BUILTIN_DIR / "a40.json").read_text())
    raw["name"] = "tiny-steps"
    raw["compute"]["clock_step_mhz"]["value"] = 1e-6
    (tmp_path / "tiny-steps.json").write_text(json.dumps(raw))
    monkeypatch.setenv("KAREUS_GPU_DIR", str(tmp_path))
    code, _, err = run(capsys, "simulate", "-w", "gpt3-xl", "--gpu", "tiny-steps")
    one_line_2(code, err, "1,530,000,001 lockable clocks")


def test_a_negative_seed_is_refused_before_any_cell(capsys, tmp_path):
    code, _, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", "kareus", "--seed", "-1")
    one_line_2(code, err, "--seed")
    assert reproduction.main(["-w", "gpt3-xl", "--seed", "-1", "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_names_too_long_for_the_system_are_refused_in_one_line(capsys, tmp_path):
    long = "x" * 300
    for args, fragment in ((["simulate", "-w", long], "File name too long"),
                           (["frontier", "-w", "gpt3-xl", "-o", "megatron", "--export",
                             str(tmp_path / long)], "--export"),
                           (["perseus", "--profile", str(tmp_path / long), "--stages", "2",
                             "--microbatches", "4", "--p-static", "80"], "File name too long")):
        code, _, err = run(capsys, *args)
        one_line_2(code, err, fragment)
    assert reproduction.main(["-w", "gpt3-xl", "--out", str(tmp_path / long)]) == 2
    capsys.readouterr()
    # folders made on the way to a refused one are removed again
    code, _, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", "megatron", "--export",
                       str(tmp_path / "a" / long / "b"))
    one_line_2(code, err, "--export")
    assert not (tmp_path / "a").exists()


def test_an_export_over_a_folder_of_the_same_name_writes_nothing(capsys, tmp_path):
    (tmp_path / "schedules.json").mkdir()
    code, _, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", "megatron", "--export",
                       str(tmp_path))
    one_line_2(code, err, "schedules.json there is a folder")
    assert [p.name for p in tmp_path.iterdir()] == ["schedules.json"]


@pytest.mark.parametrize("optimizer, args, fragment", [
    ("envpipe", ["--microbatches", "100000"], "(EnvPipe: about"),
    ("perseus", ["--solver", "exact", "--microbatches", "5000"], "--solver exact: 2 stages"),
])
def test_a_whole_dag_procedure_past_its_size_is_refused(capsys, optimizer, args, fragment):
    """As the profile commands do: their work grows with the square of the pipeline's pairs."""
    code, _, err = run(capsys, "frontier", "-w", "gpt3-xl", "-o", optimizer, "--pp", "2",
                       "--tp", "8", "--mbs", "1", *args)
    one_line_2(code, err, fragment)


def test_a_hugging_face_config_without_kv_heads_gets_transformers_default(capsys, tmp_path):
    """transformers' Qwen2 config gives 32 KV heads when the file gives none; the refusal says
    where the 32 comes from."""
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "hidden_size": 1024, "num_attention_heads": 16,
        "num_hidden_layers": 4, "vocab_size": 1000, "intermediate_size": 2816}))
    code, _, err = run(capsys, "simulate", "-w", str(tmp_path))
    one_line_2(code, err, "gives no num_key_value_heads, and transformers' qwen2 default, 32")


def test_a_partition_config_past_int64_is_named_as_written(capsys, tmp_path):
    spec = artifact_or_skip("attention_partition/spec.json")
    configs = tmp_path / "configs.csv"
    configs.write_text("overlap_start,overlap_end,comm_sm_number,comm_block_size\n"
                       "0,6,9,99999999999999999999\n")
    code, _, err = run(capsys, "partition", "--spec", str(spec),
                       "--configs", str(configs), "--gpu", "a100-sxm4-40gb", "--clock", "1200")
    one_line_2(code, err, "comm_block_size 99999999999999999999 is out of range")


def test_a_record_file_is_checked_before_the_run_and_merged_after_it(tmp_path):
    """The benchmarks' record files (results/fidelity/summary.json): a file that holds no JSON
    object is refused (exit 2, one line) before any work; a merge replaces only its entries."""
    from kareus.atomic import check_json_record, merge_json_record
    from kareus.errors import InputError

    record = tmp_path / "summary.json"
    check_json_record(record, "--write")  # no file yet: fine, and nothing is created
    assert not record.exists()
    merge_json_record(record, {"b": {"x": 1}, "a": {"y": 2}})
    merge_json_record(record, {"b": {"x": 3}})
    assert record.read_text().endswith("\n")
    assert list(json.loads(record.read_text()).items()) == [("a", {"y": 2}), ("b", {"x": 3})]
    merge_json_record(record, {"0": {}}, sort_keys=False)
    assert list(json.loads(record.read_text())) == ["a", "b", "0"]
    for text, fragment in (("[1, 2]", "not an object"), ("{oops", "JSONDecodeError")):
        record.write_text(text)
        with pytest.raises(InputError, match=fragment):
            check_json_record(record, "--write")
    with pytest.raises(InputError, match="--write"):
        check_json_record("/proc/nowhere/summary.json", "--write")
