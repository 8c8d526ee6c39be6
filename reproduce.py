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
import os
import sys
import time
from pathlib import Path

import click

from kareus.errors import USER_ERRORS, InputError
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


def _cell_key(workload: str, gpu: str, backend: str, names: list[str], seed: int,
              overrides: dict, gpu_overrides: dict) -> dict:
    from kareus import __version__

    return {"suite_version": __version__, "workload": workload, "gpu": gpu, "backend": backend,
            "optimizers": names, "seed": seed,
            "overrides": {k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in sorted(overrides.items()) if v is not None},
            "gpu_overrides": dict(sorted(gpu_overrides.items()))}


def run_cell(workload: str, gpu: str, backend: str, names: list[str], seed: int,
             overrides: dict, out_dir: Path, *, gpu_overrides: dict | None = None,
             force: bool = False, label: str | None = None) -> tuple[dict, bool]:
    """Run (or reuse) one configuration; returns its summary and whether it was reused."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from kareus import __version__, harness, report
    from kareus.problem import make_problem

    gpu_overrides = gpu_overrides or {}
    key = _cell_key(workload, gpu, backend, names, seed, overrides, gpu_overrides)
    summary_path = out_dir / "summary.json"
    if not force and summary_path.is_file():
        try:
            old = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            old = None
        if old and old.get("cell_key") == key and all(
                o["status"] == "ok" for o in old["optimizers"].values()):
            return old, True
    problem = make_problem(workload, gpu=gpu, backend=backend, seed=seed,
                           gpu_overrides=gpu_overrides,
                           **{k: v for k, v in overrides.items() if v is not None})
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description:<34}"), BarColumn(bar_width=24),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                  console=_console(stderr=True)) as progress:
        tasks = {n: progress.add_task(f"{label + ': ' if label else ''}{n}", total=None,
                                      info="waiting", start=False) for n in names}

        def start(name: str) -> None:
            progress.start_task(tasks[name])
            progress.update(tasks[name], info="optimizing")

        def plan(name: str, done: int, total: int) -> None:
            progress.update(tasks[name], total=total, completed=done,
                            info=f"measuring plans {done}/{total}")

        def done(run: harness.OptimizerRun) -> None:
            info = (f"{len(run.points)} plans, {len(run.frontier)} on frontier, {run.wall_s:.1f} s"
                    if run.status == "ok" else f"[red]failed: {run.error}")
            progress.update(tasks[run.name], total=1, completed=1, info=info)
            progress.stop_task(tasks[run.name])

        runs = harness.run_all(problem, names, start, plan, done)
    summary = report.summary_object(problem, runs, harness.compare(runs),
                                    suite_version=__version__, cell_key=key)
    report.write_results(out_dir, summary, runs,
                         report.timings_object(runs, time.perf_counter() - t0))
    return summary, False


def _print_tables(summary: dict) -> None:
    from rich.table import Table

    from kareus import report

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
              force: bool) -> Path:
    """Every configuration of a suite, then the suite's tables, figures and metadata."""
    from kareus import report
    from kareus.suites import PAPER_HEADLINES, get_suite

    configs = get_suite(suite)
    t0 = time.perf_counter()
    summaries: dict[str, dict] = {}
    frames = {}
    console = _console(stderr=True)
    for i, cfg in enumerate(configs, 1):
        cell_dir = out / cfg.label
        t_cell = time.perf_counter()
        summary, reused = run_cell(cfg.workload, gpu, backend, names, seed, cfg.overrides,
                                   cell_dir, gpu_overrides=cfg.gpu_overrides, force=force,
                                   label=f"[{i}/{len(configs)}] {cfg.label}")
        console.print(f"[{i}/{len(configs)}] {cfg.label}: "
                      f"{'reused' if reused else 'done'} ({time.perf_counter() - t_cell:.1f} s)")
        summaries[cfg.label] = summary
        import pandas as pd

        frames[cfg.label] = pd.read_csv(cell_dir / "frontiers.csv")
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
@click.option("--suite", default=None, help="paper | static-sweep | scale")
@click.option("--gpu", default=DEFAULT_GPU, show_default=True, help="GPU preset.")
@click.option("--backend", default="sim", show_default=True, help="sim | gpu")
@click.option("--optimizers", default=None, help="Comma-separated optimizer names [all].")
@click.option("--out", default=None, help="Output folder [results/<workload or suite>].")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--force", is_flag=True, help="Recompute configurations that already finished.")
@click.option("--tp", type=int, default=None)
@click.option("--cp", type=int, default=None)
@click.option("--pp", type=int, default=None)
@click.option("--dp", type=int, default=None)
@click.option("--mbs", type=int, default=None)
@click.option("--seq", type=int, default=None)
@click.option("--microbatches", type=int, default=None)
def cli(workload: str | None, suite: str | None, gpu: str, backend: str, optimizers: str | None,
        out: str | None, seed: int, force: bool, **overrides: int | None) -> None:
    """Run every built-in optimizer on a workload (or a suite) and print the comparison tables."""
    from kareus.hardware.presets import get_preset
    from kareus.suites import get_suite

    get_preset(gpu)  # validate before any work
    names = _resolve_optimizers(optimizers)
    if suite is not None:
        if workload is not None or any(v is not None for v in overrides.values()):
            raise InputError("--suite runs fixed configurations; drop --workload and the "
                             "parallelism overrides")
        get_suite(suite)
        default = ROOT / "results" / (suite if gpu == DEFAULT_GPU else f"{suite}-{gpu}")
        run_suite(suite, gpu, backend, names, seed, Path(out) if out else default, force)
        return
    if workload is None:
        raise InputError("give --workload NAME (see `kareus workloads`) or --suite paper")
    from workloads import get_model

    get_model(workload)
    out_dir = Path(out) if out else ROOT / "results" / workload
    t0 = time.perf_counter()
    summary, reused = run_cell(workload, gpu, backend, names, seed, overrides, out_dir,
                               force=True)
    _print_tables(summary)
    _console().print(f"Results in {out_dir} ({time.perf_counter() - t0:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="reproduce.py", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}".splitlines()[0], err=True)
        return 2
    except USER_ERRORS as e:
        click.echo(f"error: {e}".splitlines()[0], err=True)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except Exception as e:  # internal failure: one line (KAREUS_DEBUG=1 for the traceback)
        if os.environ.get("KAREUS_DEBUG"):
            raise
        click.echo(f"internal error: {type(e).__name__}: {e}".splitlines()[0], err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
