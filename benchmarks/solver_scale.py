"""Wall time and peak memory of the three frontier methods, from the paper's size to 1,024 GPUs.

    python benchmarks/solver_scale.py [--repo PATH] [--timeout-s 600] [--jobs LABEL,...]
        [--methods perseus,nanobatch-perseus,kareus] [--solver fast|exact] [--csv OUT]

Each (job, method) runs ``kareus frontier`` in its own process, so that the peak resident memory
(``ru_maxrss`` of the child, from ``os.wait4``) is that run's alone; the wall time is the child's
from start to exit, command start-up included. ``--repo`` runs another checkout of the suite
(e.g. the commit before a change) with the same jobs, for before/after tables; a run past
``--timeout-s`` is killed and reported as such. ``--csv`` gets each row as it finishes, so an
interrupted run keeps the rows it finished. Jobs (A100 SXM4 80 GB):

- ``PP2x8``: GPT-3 2.7B, TP8 PP2, 8 microbatches (the paper's scale);
- ``PP8x32``: GPT-3 13B, TP8 PP8 DP2, 32 microbatches;
- ``PP16x64``: GPT-3 175B, TP8 PP16 DP4, 64 microbatches;
- ``gpt3-175b-1024``: GPT-3 175B on 1,024 GPUs, TP8 PP16 DP8, MBS 2, 128 microbatches, seq 2048;
- ``llama3.3-70b-512``: Llama 3.3 70B on 512 GPUs, TP8 PP8 DP8, MBS 2, 64 microbatches.
"""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]

JOBS: dict[str, list[str]] = {
    "PP2x8": ["-w", "gpt3-2.7b", "--tp", "8", "--pp", "2", "--mbs", "2", "--microbatches", "8"],
    "PP8x32": ["-w", "gpt3-13b", "--tp", "8", "--pp", "8", "--dp", "2", "--mbs", "2",
               "--microbatches", "32"],
    "PP16x64": ["-w", "gpt3-175b", "--tp", "8", "--pp", "16", "--dp", "4", "--mbs", "2",
                "--microbatches", "64", "--seq", "2048"],
    "gpt3-175b-1024": ["-w", "gpt3-175b", "--tp", "8", "--pp", "16", "--dp", "8", "--mbs", "2",
                       "--microbatches", "128", "--seq", "2048"],
    "llama3.3-70b-512": ["-w", "llama3.3-70b", "--tp", "8", "--pp", "8", "--dp", "8", "--mbs",
                         "2", "--microbatches", "64"],
}


#: The columns of a result row (and of ``--csv``).
ROW_FIELDS = ("job", "method", "status", "wall_s", "peak_mib")


def run_one(repo: Path, job: str, method: str, timeout_s: float, solver: str | None
            ) -> dict[str, object]:
    """One ``kareus frontier`` run in a child process: wall (s), peak RSS (MiB), status."""
    args = [sys.executable, "-m", "kareus", "frontier", *JOBS[job], "-o", method,
            "--gpu", "a100-sxm4-80gb", "--json"]
    if solver is not None:
        args += ["--solver", solver]
    env = dict(os.environ, PYTHONPATH=str(repo))
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a chatty child cannot block
        start = time.perf_counter()
        child = subprocess.Popen(args, cwd=repo, env=env, stdout=subprocess.DEVNULL,
                                 stderr=stderr, start_new_session=True)
        status, pid = "ok", 0
        deadline = start + timeout_s
        try:
            while True:
                pid, code, usage = os.wait4(child.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    status = f"killed after {timeout_s:.0f} s"
                    break
                time.sleep(0.05)
        finally:  # timed out, or this script interrupted: the child's group goes with it
            if not pid:
                os.killpg(child.pid, signal.SIGKILL)
                pid, code, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        exit_code = os.waitstatus_to_exitcode(code)
        if status == "ok" and exit_code != 0:
            stderr.seek(0)
            err = stderr.read().decode(errors="replace").strip().splitlines()
            status = (f"exit {exit_code}: {err[-1] if err else ''}" if exit_code > 0
                      else f"killed by signal {-exit_code}")
    row = {"job": job, "method": method, "status": status, "wall_s": round(wall, 1),
           "peak_mib": round(usage.ru_maxrss / 1024, 0)}
    assert tuple(row) == ROW_FIELDS
    return row


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--repo", type=click.Path(exists=True, file_okay=False), default=str(ROOT),
              show_default=True, help="Checkout of the suite to run.")
@click.option("--timeout-s", type=click.FloatRange(min=0, min_open=True), default=600.0,
              show_default=True, help="Kill a run after this many seconds.")
@click.option("--jobs", "jobs", default=",".join(JOBS), show_default=True)
@click.option("--methods", default="perseus,nanobatch-perseus,kareus", show_default=True)
@click.option("--solver", type=click.Choice(["fast", "exact"]), default=None,
              help="The solver (default: the suite's default).")
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False),
              help="Write the rows to this CSV, each as it finishes.")
def main(repo: str, timeout_s: float, jobs: str, methods: str, solver: str | None,
         csv_path: str | None) -> None:
    from kareus.atomic import check_writable_file
    from kareus.errors import InputError
    from kareus.plugins import optimizer_names
    from kareus.suite.options import comma_list

    if not (Path(repo) / "kareus" / "__init__.py").is_file():
        raise InputError(f"--repo {repo}: not a checkout of the suite (no kareus/__init__.py)")
    job_list, method_list = comma_list(jobs, "--jobs"), comma_list(methods, "--methods")
    unknown = [j for j in job_list if j not in JOBS]
    if unknown:
        raise InputError(f"--jobs: unknown job {unknown[0]!r}; choose from {', '.join(JOBS)}")
    # another checkout may register other optimizers: its own runs then say what they refuse
    known = optimizer_names()
    unknown = [m for m in method_list if m not in known]
    if unknown and Path(repo).resolve() == ROOT:
        raise InputError(f"--methods: unknown optimizer {unknown[0]!r}; choose from "
                         f"{', '.join(known)}")
    if csv_path:
        csv_path = str(check_writable_file(csv_path, "--csv"))
    with contextlib.ExitStack() as stack:
        writer = None
        if csv_path:
            out = stack.enter_context(open(csv_path, "w", newline=""))
            writer = csv.DictWriter(out, fieldnames=list(ROW_FIELDS))
            writer.writeheader()
        for job in job_list:
            for method in method_list:
                row = run_one(Path(repo), job, method, timeout_s, solver)
                print(f"{job:18s} {method:18s} {row['wall_s']:8.1f} s {row['peak_mib']:7.0f} MiB  "
                      f"{row['status']}", flush=True)
                if writer is not None:
                    writer.writerow(row)
                    out.flush()


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "solver_scale.py"))
