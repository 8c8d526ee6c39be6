"""Progress of long work: counted by the work, shown only on a terminal."""

from dataclasses import replace

from kareus.cli import main
from kareus.plugins import load_optimizer
from kareus.progress import SILENT
from kareus.suite.harness import run_optimizer
from kareus.suite.problem import make_problem
from kareus.suite.progress import terminal_progress


class Recorder:
    """A Progress that remembers every task and how far it got."""

    def __init__(self):
        self.tasks = []

    def start(self, description, total=None):
        task = {"description": description, "total": total, "done": 0, "closed": False}
        self.tasks.append(task)

        class Task:
            def advance(self, amount=1):
                task["done"] += amount

            def done(self):
                task["closed"] = True

        return Task()


def test_kareus_reports_partitions_solver_steps_and_plans():
    rec = Recorder()
    problem = replace(make_problem("gpt3-xl", gpu="a100-sxm4-40gb", tp=4, pp=2, mbs=2,
                                   microbatches=4), progress=rec)
    run = run_optimizer("kareus", load_optimizer("kareus"), problem)
    assert run.status == "ok"
    names = [t["description"] for t in rec.tasks]
    # three solves: over every option, and over each baseline's set (see Kareus.optimize)
    assert names == ["kareus: partition searches", "kareus: solver steps",
                     "kareus sequential: solver steps", "kareus default schedules: solver steps",
                     "kareus: evaluating plans"]
    partitions, *solves, plans = rec.tasks
    assert partitions["done"] == partitions["total"] > 0
    for solve in solves:
        assert solve["done"] > 0
        assert abs(solve["done"] - solve["total"]) <= 0.2 * solve["total"] + 2
    assert plans["done"] == plans["total"] == len(run.plans)
    assert all(t["closed"] for t in rec.tasks)


def test_nothing_is_shown_off_a_terminal(capsys):
    with terminal_progress(True) as progress:  # pytest captures: not a terminal
        assert progress is SILENT
    with terminal_progress(False) as progress:
        assert progress is SILENT
    assert main(["frontier", "-w", "gpt3-xl", "--tp", "4", "--pp", "2", "--mbs", "2",
                 "--microbatches", "4", "-o", "perseus", "--json"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and out.out.lstrip().startswith("{")


def test_a_sweep_piped_to_a_file_shows_no_progress_bar(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, str(root / "reproduce.py"), "--suite", "smoke",
                           "--optimizers", "megatron,perseus", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "━" not in proc.stderr and "cells (configuration" not in proc.stderr


def test_a_progress_bar_whose_terminal_goes_away_lets_the_work_finish(monkeypatch):
    """The bar's stream broken under it: the bar goes quiet and the block runs to its end (rich's
    own console would exit 1 at once, whatever work was left)."""
    import os

    import kareus.suite.progress as progress_module

    monkeypatch.setattr(progress_module, "on_terminal", lambda: True)
    read_end, write_end = os.pipe()
    os.close(read_end)
    finished = False
    with progress_module.terminal_progress(True) as progress:
        console = progress._bar.console
        console.file = os.fdopen(write_end, "w")
        task = progress.start("work", total=2)
        console.print("a line its reader never sees")  # EPIPE: the console goes quiet
        task.advance()
        task.advance()
        task.done()
        finished = True
    assert finished and console.quiet
    console.file.close()
