#!/usr/bin/env python
"""Reproduce the Kareus comparison: every built-in optimizer on a workload, tables and figures.

    python reproduce.py --workload gpt3-xl
    python reproduce.py --workload llama3.2-3b --tp 4 --cp 2 --optimizers megatron,perseus

Writes results/<workload>/ (summary.json, frontiers.csv, comparison.md, frontiers.png,
energy_breakdown.png). Exit status 0 on success, 2 on bad input, 1 on internal failure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from kareus.errors import USER_ERRORS, InputError
from kareus.hardware.presets import DEFAULT_GPU

ROOT = Path(__file__).resolve().parent


def _run(workload: str, gpu: str, backend: str, optimizers: str | None, out: str | None,
         seed: int, overrides: dict) -> Path:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from kareus import harness, report
    from kareus.plugins import optimizer_names
    from kareus.problem import make_problem

    console = Console(stderr=True)
    problem = make_problem(workload, gpu=gpu, backend=backend, seed=seed,
                           **{k: v for k, v in overrides.items() if v is not None})
    registered = optimizer_names()
    names = registered if not optimizers else [n.strip() for n in optimizers.split(",") if n.strip()]
    unknown = [n for n in names if n not in registered]
    if unknown or not names:
        raise InputError(f"unknown optimizer(s) {', '.join(unknown) or '(none given)'}; "
                         f"registered: {', '.join(registered)}")
    out_dir = Path(out) if out else ROOT / "results" / problem.workload.name
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        tasks = {n: progress.add_task(n, total=None, info="waiting", start=False) for n in names}

        def start(name: str) -> None:
            progress.start_task(tasks[name])
            progress.update(tasks[name], info="optimizing")

        def plan(name: str, done: int, total: int) -> None:
            progress.update(tasks[name], total=total, completed=done,
                            info=f"evaluating plans {done}/{total}")

        def done(run: harness.OptimizerRun) -> None:
            info = (f"{len(run.points)} plans, {len(run.frontier)} on frontier, {run.wall_s:.1f} s"
                    if run.status == "ok" else f"[red]failed: {run.error}")
            progress.update(tasks[run.name], total=1, completed=1, info=info)
            progress.stop_task(tasks[run.name])

        runs = harness.run_all(problem, names, start, plan, done)
    comparison = harness.compare(runs)
    from kareus import __version__

    summary = report.summary_object(problem, runs, comparison, suite_version=__version__,
                                    wall_s=round(time.perf_counter() - t0, 3))
    report.write_results(out_dir, summary, runs)
    out_console = Console()
    for title, frame in (("Max-throughput plan vs Megatron-LM (positive = reduction)",
                          report.max_throughput_table(summary)),
                         ("Frontier vs Perseus (n/a = not attainable)",
                          report.frontier_table(summary))):
        table = Table(title=title)
        for col in frame.columns:
            table.add_column(str(col), justify="left" if col in ("optimizer", "status") else "right")
        for _, row in frame.iterrows():
            table.add_row(*("" if (isinstance(v, float) and v != v) else str(v) for v in row))
        out_console.print(table)
    for name, run in runs.items():
        if run.status != "ok":
            out_console.print(f"[red]{name} failed:[/red] {run.error}")
    out_console.print(f"Results in {out_dir} ({time.perf_counter() - t0:.1f} s)")
    return out_dir


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workload", "-w", default=None, help="Workload name (see `kareus workloads`).")
@click.option("--suite", type=click.Choice(["paper"]), default=None,
              help="Run a predefined suite instead of one workload.")
@click.option("--gpu", default=DEFAULT_GPU, show_default=True, help="GPU preset.")
@click.option("--backend", default="sim", show_default=True, help="sim | gpu")
@click.option("--optimizers", default=None, help="Comma-separated optimizer names [all].")
@click.option("--out", default=None, help="Output folder [results/<workload>].")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--tp", type=int, default=None)
@click.option("--cp", type=int, default=None)
@click.option("--pp", type=int, default=None)
@click.option("--dp", type=int, default=None)
@click.option("--mbs", type=int, default=None)
@click.option("--seq", type=int, default=None)
@click.option("--microbatches", type=int, default=None)
def cli(workload: str | None, suite: str | None, gpu: str, backend: str, optimizers: str | None,
        out: str | None, seed: int, **overrides: int | None) -> None:
    """Run every built-in optimizer on a workload and print the paper's comparison tables."""
    if suite is not None:
        raise InputError("--suite paper is not available yet; run one --workload")
    if workload is None:
        raise InputError("give --workload NAME (see `kareus workloads`) or --suite paper")
    _run(workload, gpu, backend, optimizers, out, seed, overrides)


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
