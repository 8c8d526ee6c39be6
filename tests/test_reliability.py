"""Crash-safe, resumable, parallel sweeps: SIGTERM halfway, rerun, and executors giving the same
summaries as a serial run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OPTS = "megatron,perseus,nanobatch,kareus"
CONFIGS = ("gpt3-xl_tp4_small", "qwen3-1.7b_tp4_small")

# one worker runs this module (with pytest-xdist's --dist loadgroup, as .ci/run has it): its
# reference sweep is made once, and its parallel sweeps and signals share no core with another's
pytestmark = pytest.mark.xdist_group("reliability")


def _cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "reproduce.py"), "--suite", "smoke", "--optimizers", OPTS,
            "--out", str(out), *extra]


def _env():
    return {**os.environ, "MPLBACKEND": "Agg", "COLUMNS": "200"}


def _cells(out: Path) -> list[Path]:
    return sorted(out.glob("*/cells/*.json"))


def _summaries(out: Path) -> dict[str, bytes]:
    return {c: (out / c / "summary.json").read_bytes() for c in CONFIGS}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    proc = subprocess.run(_cmd(out), env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_sigterm_halfway_then_resume(tmp_path, reference):
    out = tmp_path / "sweep"
    proc = subprocess.Popen(_cmd(out), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while len(_cells(out)) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "rerun the same command to resume" in err
    finished = _cells(out)
    total = len(CONFIGS) * len(OPTS.split(","))
    assert 3 <= len(finished) < total
    for cell in finished:  # every finished cell is intact
        assert json.loads(cell.read_text())["status"] == "ok"
    # the summaries say what finished and what did not
    s = json.loads((out / CONFIGS[0] / "summary.json").read_text())
    statuses = {n: o["status"] for n, o in s["optimizers"].items()}
    assert s["complete"] is False or all(v == "ok" for v in statuses.values())
    assert "missing" in json.dumps([json.loads((out / c / "summary.json").read_text())
                                    for c in CONFIGS if (out / c / "summary.json").exists()])

    rerun = subprocess.run(_cmd(out), env=_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"reusing {len(finished)} cell(s) made by kareus-suite" in rerun.stderr
    assert f"computing {total - len(finished)} cell(s): not run before" in rerun.stderr
    assert _summaries(out) == _summaries(reference)


@pytest.mark.slow
def test_ctrl_c_on_a_process_pool_keeps_its_cells_and_stops_its_workers(tmp_path, reference):
    """Ctrl-C reaches the whole process group: the parent keeps what finished, writes the
    summaries, stops the pool's workers and exits 130; a rerun completes the sweep."""
    out = tmp_path / "pool"
    proc = subprocess.Popen(_cmd(out, "--jobs", "2"), env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while len(_cells(out)) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "internal error" not in err and "Traceback" not in err
    assert all((out / c / "summary.json").is_file() for c in CONFIGS)
    deadline = time.time() + 30  # the workers (and the pool's resource tracker) are gone
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("processes of the interrupted run's group are still alive")
    rerun = subprocess.run(_cmd(out, "--jobs", "2"), env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert _summaries(out) == _summaries(reference)


@pytest.mark.slow
def test_parallel_jobs_give_the_serial_summaries(tmp_path, reference):
    out = tmp_path / "jobs2"
    proc = subprocess.run(_cmd(out, "--jobs", "2"), env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _summaries(out) == _summaries(reference)


def _ray_or_skip():
    try:
        import ray  # noqa: F401
    except Exception as e:  # ImportError, or a broken optional dependency of Ray
        pytest.skip(f"ray unavailable: {type(e).__name__}: {e}".splitlines()[0])


@pytest.mark.slow
def test_ray_executor_gives_the_serial_summaries(tmp_path, reference):
    _ray_or_skip()
    out = tmp_path / "ray"
    proc = subprocess.run(_cmd(out, "--executor", "ray", "--jobs", "2"), env=_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _summaries(out) == _summaries(reference)


@pytest.mark.parametrize("args,fragment", [
    (["--jobs", "0"], "--jobs must be a positive integer"),
    (["--executor", "spark"], "choose one of: local, ray"),
])
def test_bad_executor_settings(tmp_path, args, fragment):
    out = tmp_path / "bad"
    proc = subprocess.run(_cmd(out, *args), env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and fragment in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_recalibrated_preset_invalidates_finished_cells(monkeypatch):
    """A cell is reused only under the preset that computed it: a refit of any preset parameter
    (the partition law, the frontier efficiencies) changes the cell's key."""
    import kareus.hardware.presets as presets
    from kareus.suite.sweep import cell_key

    def key():
        return cell_key("gpt3-xl", "a100-sxm4-40gb", "sim", "perseus", 0, {}, {})

    before = key()
    assert key() == before
    original = presets.get_preset
    monkeypatch.setattr(presets, "get_preset", lambda name: original(name).with_overrides(
        comm_rate_beside_gemm=original(name).comm_rate_beside_gemm * 1.01))
    after = key()
    assert after["preset"] != before["preset"]
    assert {k: v for k, v in after.items() if k != "preset"} == \
        {k: v for k, v in before.items() if k != "preset"}


@pytest.mark.parametrize("edit", [
    lambda d: d.update(points="abc"),
    lambda d: d.update(points=[]),
    lambda d: d["points"][0].update(time_s=-1),
    lambda d: d["points"][0].update(energy_j="x"),
    lambda d: d.update(frontier=None),
    lambda d: d.update(choice=[1]),
    lambda d: d.update(key=3),
    lambda d: d.pop("spread"),
    lambda d: d.update(spread=[[0]]),
    lambda d: d.update(choice={"note": 1}),
    lambda d: d["choice"].update(time_s="fast"),
    lambda d: d.update(made_by={"git_commit": 12345}),
])
def test_a_cell_that_is_json_but_not_a_run_is_recomputed(tmp_path, capsys, edit):
    """A hand-edited cell is unreadable, like one that is not JSON: computed again when asked
    for, left out of the summary when only shown beside the others; never a crash."""
    from kareus import reproduction

    out = tmp_path / "run"
    args = ["-w", "gpt3-xl", "--microbatches", "4", "--out", str(out)]
    assert reproduction.main([*args, "--optimizers", "megatron,zeus-power-limit"]) == 0
    cell = out / "cells" / "zeus-power-limit.json"
    record = json.loads(cell.read_text())
    edit(record)
    cell.write_text(json.dumps(record))
    capsys.readouterr()
    assert reproduction.main([*args, "--optimizers", "megatron", "--force"]) == 0
    assert "unreadable cell" in capsys.readouterr().err  # left out of the summary, and why
    assert json.loads(cell.read_text()) == record  # its file stays
    assert reproduction.main([*args, "--optimizers", "megatron,zeus-power-limit"]) == 0
    assert "computing 1 cell(s): unreadable cell (zeus-power-limit)" in capsys.readouterr().err
    assert json.loads(cell.read_text())["status"] == "ok"


def test_a_plugin_that_kills_its_pool_worker_fails_alone(tmp_path):
    """A plugin whose process dies (a native crash; here ``os._exit``) breaks a process pool and
    every cell in it: those cells run again one by one, each in a process of its own, so only
    the plugin's cell fails, saying why, and the run writes its summary."""
    dist = tmp_path / "kareus_crash-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kareus-crash\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[kareus.optimizers]\ncrash = crash_plugin:Crash\n")
    (tmp_path / "crash_plugin.py").write_text(
        "import os\n\n\nclass Crash:\n    name = 'crash'\n\n"
        "    def optimize(self, problem):\n        os._exit(3)\n")
    out = tmp_path / "out"
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "reproduce.py"), "--workload", "gpt3-xl", "--pp", "2",
         "--microbatches", "4", "--optimizers", "megatron,crash,perseus", "--jobs", "2",
         "--out", str(out)], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = json.loads((out / "summary.json").read_text())["optimizers"]
    assert runs["megatron"]["status"] == "ok" and runs["perseus"]["status"] == "ok"
    assert runs["crash"]["status"] == "failed"
    assert "its process died (exit status 3)" in runs["crash"]["error"]
