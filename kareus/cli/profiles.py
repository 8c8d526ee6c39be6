"""``kareus perseus`` and ``kareus envpipe``: the baselines on a measured per-stage profile."""

from __future__ import annotations

from pathlib import Path

import click

from kareus.cli.common import FRONTIER_ROWS, emit, render, warn


def _profile_options(fn):
    """The options ``kareus perseus`` and ``kareus envpipe`` share."""
    for opt in reversed([
        click.option("--profile", "profile_path", required=True, type=click.Path(dir_okay=False),
                     help="Zeus-format CSV: stage,instruction,frequency,time,energy."),
        click.option("--stages", type=int, required=True, help="Pipeline stages in the profile."),
        click.option("--microbatches", type=int, required=True,
                     help="Microbatches per iteration."),
        click.option("--p-static", type=float, required=True,
                     help="Static (blocked-on-P2P) power per GPU, W."),
        click.option("--unit-ms", type=float, default=1.0, show_default=True,
                     help="The solver's time unit (quantum), ms; Perseus's is 1."),
    ]):
        fn = opt(fn)
    return fn


def _profile_command(optimizer: str, profile_path: str, stages: int, microbatches: int,
                     p_static: float, unit_ms: float, as_json: bool,
                     **kwargs: object) -> None:
    """Load and check the profile, run ``optimizer`` on it, print its points."""
    from kareus.errors import InputError
    from kareus.frontier import fastest
    from kareus.hardware.profile import load_profile
    from kareus.plugins import ProfileRunner, load_optimizer
    from workloads.parallel import pipeline_fill_warnings

    runner = load_optimizer(optimizer)
    if not isinstance(runner, ProfileRunner):
        raise InputError(f"optimizer {optimizer!r} cannot run on a measured profile")
    from kareus.suite.progress import terminal_progress

    df = load_profile(profile_path)  # refused in one line before any warning
    warn(pipeline_fill_warnings(microbatches, stages))
    with terminal_progress(not as_json) as progress:
        points = runner.on_profile(df, profile_path, stages, microbatches, p_static,
                                   unit_time_s=unit_ms / 1e3, progress=progress, **kwargs)
    # the frontier object's fields (a profile is one GPU per stage, on no preset of the suite's)
    obj = {"workload": Path(profile_path).stem, "optimizer": optimizer, "backend": "profile",
           "gpu": None, "num_gpus": stages, "gpus_per_stage": 1,
           "profile": profile_path, "stages": stages, "microbatches": microbatches,
           "p_static_w": p_static, "unit_ms": unit_ms, **kwargs, "points": points,
           "max_throughput": points[fastest([p["time_s"] for p in points],
                                            [p["energy_j"] for p in points])]
           if points else None}

    def text() -> str:
        from kareus.suite.tables import sampled_rows

        what = "solver steps" if kwargs.get("all_iterations") else "frontier points"
        step = "iteration" if optimizer == "perseus" else "steps"
        shown = (list(range(len(points))) if kwargs.get("all_iterations")
                 else sampled_rows(len(points), FRONTIER_ROWS))
        header = "solver step" if step == "iteration" else step  # lowtime's name, in --json
        table = render([header, "time s", "energy J", "replayed time s", "replayed energy J"],
                       ([p.get(step, ""), f"{p['time_s']:.4f}", f"{p['energy_j']:.2f}",
                         f"{p['replayed_time_s']:.4f}", f"{p['replayed_energy_j']:.2f}"]
                        for p in (points[i] for i in shown)),
                       title=f"{optimizer} on {profile_path}: {len(points)} "
                             f"{what if optimizer == 'perseus' else 'point'}")
        table += (f"\nenergy: one iteration on all {stages} GPUs (one per stage), each blocked "
                  f"one at --p-static {p_static:g} W")
        if len(shown) < len(points):
            table += (f"\n{len(shown)} of the {len(points)} shown, evenly spread; --json prints "
                      "every one")
        return table

    emit(obj, as_json, text)


@click.command()
@_profile_options
@click.option("--prefilter", "--filter", "prefilter", type=click.Choice(["raw", "effective"]),
              default="raw", show_default=True,
              help="Pareto pre-filter on raw or static-adjusted energy (--set prefilter=... "
                   "in a run).")
@click.option("--all-iterations", is_flag=True, help="Every solver step, in solver order.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def perseus(profile_path: str, stages: int, microbatches: int, p_static: float, unit_ms: float,
            prefilter: str, all_iterations: bool, as_json: bool) -> None:
    """Perseus's time-energy frontier of an external Zeus-format profile (lowtime)."""
    _profile_command("perseus", profile_path, stages, microbatches, p_static, unit_ms, as_json,
                     prefilter=prefilter, all_iterations=all_iterations)


@click.command()
@_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def envpipe(profile_path: str, stages: int, microbatches: int, p_static: float, unit_ms: float,
            as_json: bool) -> None:
    """EnvPipe's plan (one point) on an external Zeus-format profile."""
    _profile_command("envpipe", profile_path, stages, microbatches, p_static, unit_ms, as_json)
