#!/usr/bin/env python
"""Reproduce the Kareus comparison: every built-in optimizer on a workload, tables and figures.

    python reproduce.py --workload gpt3-xl
    python reproduce.py --workload llama3.2-3b --tp 4 --cp 2 --optimizers megatron,perseus
    python reproduce.py --suite paper [--gpu h100-sxm]      # the paper's configurations
    python reproduce.py --suite static-sweep | scale        # what-if studies

A single workload writes results/<workload>/ (summary.json, frontiers.csv, comparison.md,
frontiers.png, energy_breakdown.png). A suite writes results/<suite>[-<gpu>]/ with one such folder
per configuration plus the cross-configuration tables and figures; finished configurations are
reused on a rerun (``--force`` recomputes). Exit status 0 on success, 2 on bad input, 1 on
internal failure.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import click

from kareus.errors import InputError
from kareus.hardware.presets import DEFAULT_GPU

ROOT = Path(__file__).resolve().parent


def _console(stderr: bool = False):  # noqa: ANN202
    from rich.console import Console

    return Console(stderr=stderr, width=120 if not sys.stdout.isatty() else None)


def _resolve_optimizers(optimizers: str | None) -> list[str]:
    from kareus.plugins import optimizer_names

    registered = optimizer_names()
    names = registered if not optimizers else [n.strip() for n in optimizers.split(",")
                                               if n.strip()]
    unknown = [n for n in names if n not in registered]
    if unknown or not names:
        raise InputError(f"unknown optimizer(s) {', '.join(unknown) or '(none given)'}; "
                         f"registered: {', '.join(registered)}")
    return names


def _cell_key(workload: str, gpu: str, backend: str, optimizer: str, seed: int,
              overrides: dict, gpu_overrides: dict, options: dict | None = None) -> dict:
    """Everything that determines one cell's result."""
    from kareus import __version__

    return {"suite_version": __version__, "workload": workload, "gpu": gpu, "backend": backend,
            "optimizer": optimizer, "options": dict(sorted((options or {}).items())),
            "seed": seed,
            "overrides": {k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in sorted(overrides.items()) if v is not None},
            "gpu_overrides": dict(sorted(gpu_overrides.items()))}


def run_configs(configs: list, root: Path, gpu: str, backend: str, names: list[str], seed: int,
                *, force: bool = False, jobs: int = 1, executor: str = "local",
                backend_options: dict | None = None) -> dict[str, dict]:
    """Run (or reuse) every (configuration, optimizer) cell, then write each configuration's
    results; returns the summaries by configuration label. Interrupted runs (SIGINT/SIGTERM)
    write summaries of what finished, marking the rest, and re-raise."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kareus.suite.executors import CellTask, execute
    from kareus.suite.store import ResultsStore

    store = ResultsStore(root)
    records: dict[tuple[str, str], dict] = {}
    tasks: list[CellTask] = []
    for cfg in configs:
        for name in names:
            key = _cell_key(cfg.workload, gpu, backend, name, seed, cfg.overrides,
                            cfg.gpu_overrides)
            old = None if force else store.load(cfg.label, name, key)
            if old is not None:
                records[(cfg.label, name)] = old
            else:
                tasks.append(CellTask(config=cfg.label, workload=cfg.workload, optimizer=name,
                                      gpu=gpu, backend=backend, seed=seed, key=key,
                                      store_root=str(root),
                                      overrides={k: (list(v) if isinstance(v, tuple) else v)
                                                 for k, v in cfg.overrides.items()},
                                      gpu_overrides=dict(cfg.gpu_overrides),
                                      backend_options=dict(backend_options or {})))
    console = _console(stderr=True)
    reused = len(records)
    if reused:
        console.print(f"reusing {reused} finished cell(s); computing {len(tasks)}")
    interrupted: BaseException | None = None
    with Progress(TextColumn("{task.description:<58}"), BarColumn(bar_width=24),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        bar = progress.add_task("cells (configuration x optimizer)", total=len(tasks))

        def done(task: CellTask, record: dict) -> None:
            records[(task.config, task.optimizer)] = record
            status = "ok" if record["status"] == "ok" else "FAILED"
            progress.update(bar, advance=1,
                            description=f"{task.config}: {task.optimizer} {status}")

        try:
            execute(tasks, executor=executor, jobs=jobs, on_done=done)
        except KeyboardInterrupt as e:
            interrupted = e
    summaries = {}
    for cfg in configs:
        summaries[cfg.label] = _write_config(cfg, root / cfg.label, gpu, backend, names, seed,
                                             records, store)
    if interrupted is not None:
        raise interrupted
    return summaries


def _write_config(cfg, out_dir: Path, gpu: str, backend: str, names: list[str], seed: int,  # noqa: ANN001
                  records: dict, store) -> dict:  # noqa: ANN001
    """Summary, tables and figures of one configuration from its cell records."""
    from kareus import __version__
    from kareus.suite import harness, report
    from kareus.suite.problem import make_problem
    from kareus.suite.store import record_to_run

    problem = make_problem(cfg.workload, gpu=gpu, backend=backend, seed=seed,
                           gpu_overrides=cfg.gpu_overrides,
                           **{k: v for k, v in cfg.overrides.items() if v is not None})
    runs = {}
    for name in names:
        rec = records.get((cfg.label, name))
        runs[name] = record_to_run(rec) if rec is not None else harness.OptimizerRun(
            name=name, status="missing", error="not run (the sweep was interrupted)")
    complete = all(r.status != "missing" for r in runs.values())
    summary = report.summary_object(problem, runs, harness.compare(runs),
                                    suite_version=__version__, complete=complete)
    with store.lock(cfg.label):
        report.write_results(out_dir, summary, runs, report.timings_object(
            runs, sum(r.wall_s for r in runs.values())))
    return summary


def _print_tables(summary: dict) -> None:
    from rich.table import Table

    from kareus.suite import report

    console = _console()
    for title, frame in (("Max-throughput plan vs Megatron-LM (positive = reduction)",
                          report.max_throughput_table(summary)),
                         ("Frontier vs Perseus (n/a = not attainable)",
                          report.frontier_table(summary))):
        table = Table(title=title)
        for col in frame.columns:
            table.add_column(str(col), justify="left" if col in ("optimizer", "status") else "right")
        for _, row in frame.iterrows():
            table.add_row(*("" if (isinstance(v, float) and v != v) else str(v) for v in row))
        console.print(table)
    for name, obj in summary["optimizers"].items():
        if obj["status"] != "ok":
            console.print(f"[red]{name} failed:[/red] {obj['error']}")


def run_suite(suite: str, gpu: str, backend: str, names: list[str], seed: int, out: Path,
              force: bool, jobs: int = 1, executor: str = "local",
              backend_options: dict | None = None) -> Path:
    """Every configuration of a suite, then the suite's tables, figures and metadata."""
    from kareus.suite import report
    from kareus.suite.suites import PAPER_HEADLINES, get_suite

    configs = get_suite(suite)
    t0 = time.perf_counter()
    summaries = run_configs(configs, out, gpu, backend, names, seed, force=force, jobs=jobs,
                            executor=executor, backend_options=backend_options)
    console = _console(stderr=True)
    import pandas as pd

    frames = {label: pd.read_csv(out / label / "frontiers.csv") for label in summaries}
    mt, fr_ = report.suite_tables(summaries)
    title = f"suite {suite}, {gpu} ({backend})"
    report.atomic_write_text(out / "max_throughput.csv", mt.to_csv(index=False))
    report.atomic_write_text(out / "frontier.csv", fr_.to_csv(index=False))
    focus = [n for n in ("perseus", "nanobatch-perseus", "kareus") if n in names]
    mt_cols = ["config"] + [c for n in focus for c in (f"{n} ΔT %", f"{n} ΔE %") if c in mt]
    fr_cols = ["config"] + [c for n in focus if n != "perseus"
                            for c in (f"{n} iso-time ΔE %", f"{n} iso-energy ΔT %") if c in fr_]
    fr_show = fr_[fr_cols].copy()
    if {"nanobatch-perseus iso-time ΔE %", "kareus iso-time ΔE %"} <= set(fr_show.columns):
        fr_show["Kareus ≥ NB-Perseus ≥ Perseus"] = [
            "yes" if all(v is not None and v == v for v in (k1, k2, n1, n2))
            and k1 >= n1 - 1e-9 and k2 >= n2 - 1e-9 and n1 >= 0 and n2 >= 0 else "no"
            for k1, k2, n1, n2 in zip(fr_["kareus iso-time ΔE %"],
                                      fr_["kareus iso-energy ΔT %"],
                                      fr_["nanobatch-perseus iso-time ΔE %"],
                                      fr_["nanobatch-perseus iso-energy ΔT %"])]
    lines = [f"# Suite `{suite}` on {gpu} ({backend} backend)", "",
             "Every optimizer's numbers are in max_throughput.csv and frontier.csv; the tables "
             "below show the methods the paper compares.", "",
             "## Max-throughput plan vs Megatron-LM (ΔT %, ΔE %; positive = reduction)", "",
             report.format_pct_table(mt[mt_cols]), "",
             "## Frontier vs Perseus (iso-time ΔE %, iso-energy ΔT %; n/a = not attainable)", "",
             report.format_pct_table(fr_show), ""]
    if suite == "paper" and "kareus" in names:
        k_time = [v for v in fr_.get("kareus iso-time ΔE %", []) if v == v and v is not None]
        k_energy = [v for v in fr_.get("kareus iso-energy ΔT %", []) if v == v and v is not None]
        big = fr_[fr_.config.str.startswith("llama3.3-70b")]
        lines += ["## Beside the paper's headline numbers", "",
                  "| metric | paper | this suite |", "|---|---|---|",
                  f"| best iso-time energy reduction vs Perseus | up to "
                  f"{PAPER_HEADLINES['iso_time_energy_reduction_pct_max']} % | "
                  f"{max(k_time):.1f} % |" if k_time else "",
                  f"| best iso-energy time reduction vs Perseus | up to "
                  f"{PAPER_HEADLINES['iso_energy_time_reduction_pct_max']} % | "
                  f"{max(k_energy):.1f} % |" if k_energy else ""]
        if not big.empty:
            lines += [
                f"| Llama 3.3 70B iso-time energy reduction | "
                f"{PAPER_HEADLINES['llama3.3-70b_iso_time_energy_reduction_pct']} % | "
                f"{big['kareus iso-time ΔE %'].iloc[0]:.1f} % |",
                f"| Llama 3.3 70B iso-energy time reduction | "
                f"{PAPER_HEADLINES['llama3.3-70b_iso_energy_time_reduction_pct']} % | "
                f"{big['kareus iso-energy ΔT %'].iloc[0]:.1f} % |"]
        lines.append("")
    report.atomic_write_text(out / "tables.md", "\n".join(line for line in lines) + "\n")
    report.plot_suite_frontiers(frames, out / "frontiers_grid.png", title)
    report.plot_suite_breakdown(summaries, out / "energy_breakdown.png", title)
    report.atomic_write_text(out / "metadata.json", json.dumps(
        _metadata(suite, gpu, backend, names, time.perf_counter() - t0), indent=2) + "\n")
    console.print(f"Suite {suite}: {len(configs)} configurations in "
                  f"{time.perf_counter() - t0:.1f} s -> {out}")
    _console().print((out / "tables.md").read_text())
    return out


def _metadata(suite: str, gpu: str, backend: str, names: list[str], wall_s: float) -> dict:
    import platform
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    from kareus import __version__

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    packages = {}
    for pkg in ("numpy", "pandas", "scipy", "lowtime", "pymoo", "scikit-learn", "torch"):
        try:
            packages[pkg] = version(pkg)
        except PackageNotFoundError:
            packages[pkg] = None
    return {"suite": suite, "suite_version": __version__, "git_commit": commit, "gpu": gpu,
            "backend": backend, "optimizers": names, "python": platform.python_version(),
            "packages": packages, "wall_s_this_run": round(wall_s, 1)}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workload", "-w", default=None, help="Workload name (see `kareus workloads`).")
@click.option("--suite", default=None, help="paper | static-sweep | scale | smoke")
@click.option("--gpu", default=DEFAULT_GPU, show_default=True, help="GPU preset.")
@click.option("--backend", default="sim", show_default=True, help="sim | gpu")
@click.option("--optimizers", default=None, help="Comma-separated optimizer names [all].")
@click.option("--out", default=None, help="Output folder [results/<workload or suite>].")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--force", is_flag=True, help="Recompute cells that already finished.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True,
              help="Cells to run in parallel (local process pool, or Ray CPUs).")
@click.option("--executor", default="local", show_default=True, help="local | ray")
@click.option("--allow-clock-control", is_flag=True,
              help="GPU backend: lock SM clocks per instruction (needs admin rights; restored "
                   "on exit). Without it, plans run at the card's current clocks.")
@click.option("--tp", type=int, default=None)
@click.option("--cp", type=int, default=None)
@click.option("--pp", type=int, default=None)
@click.option("--dp", type=int, default=None)
@click.option("--mbs", type=int, default=None)
@click.option("--seq", type=int, default=None)
@click.option("--microbatches", type=int, default=None)
def cli(workload: str | None, suite: str | None, gpu: str, backend: str, optimizers: str | None,
        out: str | None, seed: int, force: bool, jobs: int, executor: str,
        allow_clock_control: bool, **overrides: int | None) -> None:
    """Run every built-in optimizer on a workload (or a suite) and print the comparison tables."""
    from kareus.hardware.presets import get_preset
    from kareus.suite.suites import get_suite

    from kareus.backends import make_backend

    from kareus.suite.executors import check_settings

    backend_options = {"allow_clock_control": True} if allow_clock_control else {}
    make_backend(backend, get_preset(gpu), **backend_options)  # validate before any work
    names = _resolve_optimizers(optimizers)
    check_settings(executor, jobs)
    if suite is not None:
        if workload is not None or any(v is not None for v in overrides.values()):
            raise InputError("--suite runs fixed configurations; drop --workload and the "
                             "parallelism overrides")
        get_suite(suite)
        default = ROOT / "results" / (suite if gpu == DEFAULT_GPU else f"{suite}-{gpu}")
        run_suite(suite, gpu, backend, names, seed, Path(out) if out else default, force,
                  jobs, executor, backend_options)
        return
    if workload is None:
        raise InputError("give --workload NAME (see `kareus workloads`) or --suite paper")
    from workloads import get_model

    get_model(workload)
    from kareus.suite.suites import SuiteConfig
    from workloads import make_workload

    clean = {k: v for k, v in overrides.items() if v is not None}
    make_workload(workload, **clean)  # validate before any work
    out_dir = Path(out) if out else ROOT / "results" / workload
    t0 = time.perf_counter()
    cfg = SuiteConfig(label=out_dir.name, workload=workload, overrides=clean)
    summary = run_configs([cfg], out_dir.parent, gpu, backend, names, seed, force=force,
                          jobs=jobs, executor=executor,
                          backend_options=backend_options)[cfg.label]
    _print_tables(summary)
    _console().print(f"Results in {out_dir} ({time.perf_counter() - t0:.1f} s)")


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _interrupted(cause: BaseException | None) -> int:
    click.echo("interrupted: finished cells are kept; rerun the same command to resume", err=True)
    return 143 if cause is not None and "SIGTERM" in str(cause) else 130


def main(argv: list[str] | None = None) -> int:
    from kareus.exit_status import run_command

    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        return run_command(cli, argv, "reproduce.py", _interrupted)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
