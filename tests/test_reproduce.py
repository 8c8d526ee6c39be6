"""reproduce.py end to end on a small shape, and its bad-input behaviour."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import reproduce

ROOT = Path(__file__).resolve().parents[1]

# TP8 with 16k-token nanobatches: big enough that overlap pays (smaller partitions are
# host-bound: the fuser issues each op from Python; see docs/simulator.md)
SMALL = ["--tp", "8", "--pp", "2", "--mbs", "8", "--microbatches", "4", "--seq", "2048"]


def test_reproduce_writes_every_result(tmp_path, capsys):
    out = tmp_path / "res"
    code = reproduce.main(["--workload", "gpt3-xl", *SMALL, "--out", str(out)])
    assert code == 0
    for name in ("summary.json", "frontiers.csv", "comparison.md", "frontiers.png",
                 "energy_breakdown.png"):
        assert (out / name).stat().st_size > 0
    s = json.loads((out / "summary.json").read_text())
    assert set(s["optimizers"]) >= {"megatron", "perseus", "nanobatch", "nanobatch-perseus",
                                   "envpipe", "zeus-power-limit"}
    for obj in s["optimizers"].values():
        assert obj["status"] == "ok"
        times = [p["time_s"] for p in obj["points"]]
        assert times == sorted(times) and obj["max_throughput"] == obj["points"][0]
    c = s["comparison"]
    assert c["max_throughput_vs_megatron"]["megatron"]["time_reduction_pct"] == 0.0
    nb = c["max_throughput_vs_megatron"]["nanobatch"]
    assert nb["time_reduction_pct"] > 0  # overlap hides the TP all-reduces
    assert c["frontier_vs_perseus"]["perseus"]["iso_time_energy_reduction_pct"] == 0.0
    df = pd.read_csv(out / "frontiers.csv")
    assert list(df.columns)[:6] == ["optimizer", "time_s", "energy_j", "dynamic_energy_j",
                                    "static_energy_j", "plan_id"]
    assert (df.energy_j - df.dynamic_energy_j - df.static_energy_j).abs().max() < 1e-6
    text = capsys.readouterr().out
    assert "Max-throughput plan vs Megatron-LM" in text and "Frontier vs Perseus" in text


@pytest.mark.parametrize("args,fragment", [
    (["--workload", "gpt9"], "choose one of"),
    (["--workload", "gpt3-xl", "--optimizers", "megatron,nope"], "registered: megatron"),
    (["--workload", "gpt3-xl", "--tp", "5"], "valid TP"),
    (["--workload", "gpt3-xl", "--gpu", "tpu"], "choose one of"),
    (["--workload", "gpt3-xl", "--backend", "quantum"], "choose one of: sim, gpu"),
    ([], "--workload"),
])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, args, fragment):
    out = tmp_path / "res"
    code = reproduce.main([*args, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.slow
def test_summary_is_byte_identical_across_runs(tmp_path, capsys):
    args = ["--workload", "gpt3-xl", *SMALL, "--optimizers", "megatron,perseus,kareus"]
    assert reproduce.main([*args, "--out", str(tmp_path / "a")]) == 0
    assert reproduce.main([*args, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert (tmp_path / "a" / "summary.json").read_bytes() == \
        (tmp_path / "b" / "summary.json").read_bytes()
    assert (tmp_path / "a" / "frontiers.csv").read_bytes() == \
        (tmp_path / "b" / "frontiers.csv").read_bytes()


class _Fails:
    """An optimizer that always raises (the harness records it as failed)."""

    name = "always-fails"

    def optimize(self, problem):
        raise RuntimeError("boom")


class _EntryPoint:
    name, value = "always-fails", "tests.test_reproduce:_Fails"
    module = "tests.test_reproduce"

    def load(self):
        return _Fails


def test_every_optimizer_failing_exits_1_and_keeps_the_record(tmp_path, capsys, monkeypatch):
    """A run where no optimizer finished produced nothing: exit status 1 with one line, the
    failures still written to summary.json."""
    import kareus.plugins as plugins

    monkeypatch.setattr(plugins, "registered_optimizers", lambda: {"always-fails": _EntryPoint()})
    out = tmp_path / "res"
    code = reproduce.main(["--workload", "gpt3-xl", *SMALL, "--optimizers", "always-fails",
                           "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines()[-1].startswith("error: every optimizer failed (1 run; "
                                                   "first: always-fails on gpt3-xl: RuntimeError: boom")
    s = json.loads((out / "summary.json").read_text())
    assert s["optimizers"]["always-fails"]["status"] != "ok"


@pytest.mark.parametrize("out", ["/proc/kareus-cannot-write-here", "FILE"])
def test_an_unwritable_out_folder_is_refused_before_any_work(tmp_path, capsys, out):
    if out == "FILE":
        out = str(tmp_path / "a-file")
        (tmp_path / "a-file").write_text("x")
    code = reproduce.main(["--workload", "gpt3-xl", *SMALL, "--optimizers", "megatron",
                           "--out", out])
    o = capsys.readouterr()
    assert code == 2 and o.out == "" and len(o.err.strip().splitlines()) == 1
    assert f"--out {out!r}: cannot write results there" in o.err


def test_a_run_never_writes_into_another_kind_of_run_s_folder(tmp_path, capsys):
    """One workload's results and a suite's do not mix: a run that would write over another
    run's files (or a record's) is refused before any work, and what is there stays; a rerun of
    the same run reuses its cells."""
    suite_dir, one_dir, record_dir = tmp_path / "suite", tmp_path / "one", tmp_path / "whatif"
    suite_dir.mkdir()
    meta = {"suite": "smoke", "gpu": "a100-sxm4-40gb", "backend": "sim"}
    (suite_dir / "metadata.json").write_text(json.dumps(meta))
    (suite_dir / "gpt3-xl_tp4_small").mkdir()
    record_dir.mkdir()
    (record_dir / "summary.json").write_text(json.dumps({"paper": {"configs": {}}}))
    one = ["--workload", "gpt3-xl", *SMALL, "--optimizers", "megatron"]
    for argv, fragment in (
            ([*one, "--out", str(suite_dir)], "holds the results of suite 'smoke' on "
                                              "a100-sxm4-40gb (sim); one workload's run"),
            (["--suite", "paper", "--optimizers", "megatron", "--out", str(suite_dir)],
             "holds the results of suite 'smoke' on a100-sxm4-40gb (sim); suite 'paper'"),
            (["--suite", "smoke", "--gpu", "h100-sxm", "--optimizers", "megatron", "--out",
              str(suite_dir)], "suite 'smoke' on h100-sxm (sim) would mix"),
            ([*one, "--out", str(suite_dir / "gpt3-xl_tp4_small")], "is a configuration of"),
            ([*one, "--out", str(record_dir)], "holds no run's results")):
        assert reproduce.main(argv) == 2
        lines = [x for x in capsys.readouterr().err.splitlines() if not x.startswith("warning:")]
        assert len(lines) == 1 and fragment in lines[0], lines
    assert sorted(p.name for p in suite_dir.iterdir()) == ["gpt3-xl_tp4_small", "metadata.json"]
    assert json.loads((record_dir / "summary.json").read_text()) == {"paper": {"configs": {}}}
    # the same suite on the same preset and backend is a rerun: it writes there
    assert reproduce.main(["--suite", "smoke", "--optimizers", "megatron", "--out",
                           str(suite_dir)]) == 0
    assert (suite_dir / "gpt3-xl_tp4_small" / "summary.json").is_file()
    capsys.readouterr()
    assert reproduce.main([*one, "--out", str(one_dir)]) == 0
    before = (one_dir / "summary.json").read_bytes()
    capsys.readouterr()
    assert reproduce.main(["--suite", "smoke", "--out", str(one_dir)]) == 2
    assert "holds one workload's results; suite 'smoke'" in capsys.readouterr().err
    assert (one_dir / "summary.json").read_bytes() == before
    assert reproduce.main([*one, "--out", str(one_dir)]) == 0  # the same run again: reused
    assert "reusing 1 cell(s)" in capsys.readouterr().err
    # a damaged summary is refused with the way out; deleted, the rerun keeps the cells
    (one_dir / "summary.json").write_text('{"optimizers": ')
    assert reproduce.main([*one, "--out", str(one_dir)]) == 2
    err = capsys.readouterr().err
    assert "cannot be read as JSON" in err and "delete it and rerun" in err
    (one_dir / "summary.json").unlink()
    assert reproduce.main([*one, "--out", str(one_dir)]) == 0
    assert "reusing 1 cell(s)" in capsys.readouterr().err
    # another workload: its run would leave only its own optimizers in the summary
    other = ["--workload", "gpt3-2.7b", *SMALL, "--optimizers", "megatron", "--out", str(one_dir)]
    assert reproduce.main(other) == 2
    assert "holds the results of gpt3-xl; a run of gpt3-2.7b" in capsys.readouterr().err
    assert (one_dir / "summary.json").read_bytes() == before


def test_a_second_run_into_a_folder_being_written_is_refused(tmp_path, capsys):
    """Two runs checking one folder at once would each find it theirs; the one that comes
    second is refused while the first holds it, and writes nothing."""
    from kareus.suite.store import hold_run_folder

    out = tmp_path / "busy"
    argv = ["--workload", "gpt3-xl", *SMALL, "--optimizers", "megatron", "--out", str(out)]
    with hold_run_folder(out):
        assert reproduce.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: --out {out}: another run is writing there now; wait for it to "
                       "finish or give another --out"]
        assert list(out.iterdir()) == []
    assert reproduce.main(argv) == 0  # released with the run that held it


def test_a_run_interrupted_while_writing_its_results_does_not_pass_for_finished(
        tmp_path, capsys, monkeypatch):
    """The old summary.json goes before the new files are written: a Ctrl-C among them leaves no
    summary that would describe the other files wrongly, and the rerun writes it."""
    from kareus.suite import report

    out = tmp_path / "run"
    argv = ["--workload", "gpt3-xl", *SMALL, "--optimizers", "megatron,perseus", "--out",
            str(out)]
    assert reproduce.main(argv) == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "plot_breakdown", interrupted)
    assert reproduce.main([*argv, "--set", "unit_ms=2"]) == 130
    assert not (out / "summary.json").exists() and (out / "cells" / "perseus.json").is_file()
    monkeypatch.undo()
    capsys.readouterr()
    assert reproduce.main([*argv, "--set", "unit_ms=2"]) == 0
    assert "reusing 2 cell(s)" in capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and set(summary["optimizers"]) == {"megatron", "perseus"}


def _closed_output_run(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``argv`` with its stdout's reader gone before the first line: (status, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, wherever installed
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env=env)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=300), err


def test_a_reader_that_closes_the_output_early_leaves_the_run_to_finish(tmp_path):
    """`reproduce.py ... | head -1`: the tables go nowhere, the run writes every result and
    exits with its own status (click and rich would each exit 1 at once without a word)."""
    code, err = _closed_output_run(
        [sys.executable, str(ROOT / "reproduce.py"), "--workload", "gpt3-xl", *SMALL,
         "--optimizers", "megatron", "--out", str(tmp_path / "out")], tmp_path)
    assert code == 0, err
    assert "error" not in err and "Traceback" not in err, err
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["complete"]


def test_a_closed_output_that_stops_a_command_says_so(tmp_path):
    """A plain write to a closed output stops the command: status 1 and one line, not silence."""
    code, err = _closed_output_run([sys.executable, "-m", "kareus", "gpus", "--json"], tmp_path)
    assert code == 1
    assert err.strip().splitlines() == [
        "error: the output's reader closed it before the command finished (as `| head` does): "
        "the rest of its output is lost"]


def test_a_command_started_with_its_output_closed_is_refused_before_any_work(tmp_path):
    """`kareus workloads >&-`: Python starts with no standard output; one line, status 2, and
    `reproduce.py` writes nothing (it was an internal error in the table's width)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for argv in ([sys.executable, "-m", "kareus", "workloads"],
                 [sys.executable, str(ROOT / "reproduce.py"), "--workload", "gpt3-xl", *SMALL,
                  "--optimizers", "megatron", "--out", str(tmp_path / "out")]):
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                              env=env, timeout=300, preexec_fn=lambda: os.close(1))
        err = proc.stderr.decode()
        assert proc.returncode == 2, err
        assert len(err.strip().splitlines()) == 1 and "standard output is closed" in err, err
    assert not (tmp_path / "out").exists()
