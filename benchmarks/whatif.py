"""The what-if studies' figures, recorded for docs/results.md.

Runs each what-if suite with ``reproduce.py`` (its cells reused where they are current, so a
rerun after a run costs seconds) and records, per configuration, what docs/results.md shows:
Kareus's and Nanobatching + Perseus's frontier against Perseus's (iso-time energy and iso-energy
time reductions, %), their fastest plans against Megatron-LM's (time and energy reductions, %),
and how far down the clock range Perseus's most frugal plan runs (its time over its fastest
plan's). The suites' own folders (``results/<suite>[-<gpu>]/``, 25 MB each with figures) are not
committed; this record is, and ``python -m kareus.suite.docs_render`` renders it::

    python benchmarks/whatif.py --jobs 2 --write results/whatif/summary.json   # ~15 min, 2 cores
    python benchmarks/whatif.py --no-run --write results/whatif/summary.json   # record what ran
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]

#: Each what-if study (and the paper suite on A100, beside which the docs read them): its
#: results folder and ``reproduce.py``'s arguments.
STUDIES: dict[str, list[str]] = {
    "paper": ["--suite", "paper"],  # the A100 testbed, to compare with (results/paper: committed)
    "paper-h100-sxm": ["--suite", "paper", "--gpu", "h100-sxm"],
    "paper-h200": ["--suite", "paper", "--gpu", "h200"],
    "static-sweep": ["--suite", "static-sweep"],
    "scale": ["--suite", "scale"],
}


def _reduction(summary: dict, block: str, name: str, key: str) -> float | None:
    """One comparison metric of a configuration's summary (%), ``None`` when not attainable;
    unrounded, so that the docs round it once, as they round the suite's own tables."""
    value = summary["comparison"][block].get(name, {}).get(key)
    return None if value is None else float(value)


def configuration_record(summary: dict) -> dict[str, float | None]:
    """What docs/results.md shows of one configuration's ``summary.json``."""
    out: dict[str, float | None] = {}
    for name, short in (("kareus", "kareus"), ("nanobatch-perseus", "nb_perseus")):
        for key, field in (("iso_time_energy_reduction_pct", "iso_time_pct"),
                           ("iso_energy_time_reduction_pct", "iso_energy_pct")):
            out[f"{short}_{field}"] = _reduction(summary, "frontier_vs_perseus", name, key)
        for key, field in (("time_reduction_pct", "fastest_time_pct"),
                           ("energy_reduction_pct", "fastest_energy_pct")):
            out[f"{short}_{field}"] = _reduction(summary, "max_throughput_vs_megatron", name, key)
    from kareus.frontier import change_pct, fastest, least_energy

    def least_energy_point(name: str) -> tuple[float, float] | None:
        """(time s, energy J) of optimizer ``name``'s least-energy plan, None without one."""
        points = summary["optimizers"].get(name, {}).get("points") or []
        if not points:
            return None
        times, energies = [p["time_s"] for p in points], [p["energy_j"] for p in points]
        k = least_energy(times, energies)
        return float(times[k]), float(energies[k])

    points = summary["optimizers"].get("perseus", {}).get("points") or []
    if points:
        times, energies = [p["time_s"] for p in points], [p["energy_j"] for p in points]
        out["perseus_fastest_s"] = float(times[fastest(times, energies)])
        out["perseus_least_energy_s"] = float(times[least_energy(times, energies)])
    # a single power cap's least energy against the clock-setting methods' least energy (%)
    zeus = least_energy_point("zeus-power-limit")
    for name, short in (("perseus", "perseus"), ("kareus", "kareus")):
        ref = least_energy_point(name)
        out[f"zeus_least_energy_vs_{short}_pct"] = (
            None if zeus is None or ref is None else float(change_pct(ref[1], zeus[1])))
    return out


def study_record(folder: Path, args: list[str], wall_s: float | None, jobs: int = 2) -> dict:
    """The record of one study's results folder (``results/<study>/``), run with ``--jobs
    jobs`` in ``wall_s`` seconds (``None``: the run that wrote it, as its metadata says)."""
    meta = json.loads((folder / "metadata.json").read_text())
    import pandas as pd

    # the suite's own order, as its tables list the configurations
    order = pd.read_csv(folder / "frontier.csv")["config"].tolist()
    configs = {name: configuration_record(json.loads((folder / name / "summary.json").read_text()))
               for name in order}
    # the run's own date and --jobs where its metadata has them (a file's time is its checkout's)
    written = meta.get("date_this_run") or dt.date.fromtimestamp(
        (folder / "metadata.json").stat().st_mtime).isoformat()
    jobs = meta.get("jobs_this_run", jobs) if wall_s is None else jobs
    return {"command": "python reproduce.py " + " ".join(args) + f" --jobs {jobs}",
            "gpu": meta["gpu"], "git_commit": meta["git_commit"],
            "date": written,
            "wall_s": round(wall_s if wall_s is not None else meta.get("wall_s_this_run", 0.0), 1),
            "configs": configs}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--run/--no-run", default=True, show_default=True,
              help="Run the suites first (cells reused where current) [record what is there].")
@click.option("--jobs", type=click.IntRange(min=1), default=2, show_default=True,
              help="reproduce.py --jobs.")
@click.option("--only", default=",".join(STUDIES), show_default=True,
              help="Comma-separated studies.")
@click.option("--write", "write_path", type=click.Path(dir_okay=False), default=None,
              help="Merge the record into this JSON file (results/whatif/summary.json).")
def main(run: bool, jobs: int, only: str, write_path: str | None) -> None:
    from kareus.atomic import check_json_record, merge_json_record
    from kareus.errors import InputError, KareusError
    from kareus.suite.options import comma_list

    names = comma_list(only, "--only")
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        raise InputError(f"--only: unknown study {unknown[0]!r}; choose from "
                         f"{', '.join(STUDIES)}")
    check_json_record(write_path, "--write")
    record = {}
    for name in names:
        args = STUDIES[name]
        wall = None
        if run:
            click.echo(f"== {name}: python reproduce.py {' '.join(args)} --jobs {jobs}", err=True)
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, str(REPO / "reproduce.py"), *args,
                                   "--jobs", str(jobs)], cwd=REPO, check=False)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                raise KareusError(f"{name}: reproduce.py exited {done.returncode}")
        folder = REPO / "results" / name
        if not (folder / "metadata.json").is_file():
            raise InputError(f"{folder} holds no results; run without --no-run")
        record[name] = study_record(folder, args, wall, jobs)
        click.echo(json.dumps({name: record[name]}, indent=1))
    if write_path:
        merge_json_record(write_path, record, indent=1, sort_keys=False)


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "whatif.py"))
