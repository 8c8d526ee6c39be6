"""``kareus frontier``: one optimizer's time-energy frontier, a plan within a budget, its export."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kareus.cli.common import (
    FRONTIER_ROWS,
    emit,
    render,
    required_optimizer,
    warn,
    workload_options,
)
from kareus.cli.simulation import breakdown_text
from kareus.hardware.presets import DEFAULT_GPU
from kareus.suite.options import SET_OPTION

if TYPE_CHECKING:
    from kareus.graph import IterationGraph
    from kareus.plan import IterationPlan
    from kareus.suite.records import Point


@click.command()
@workload_options
@click.option("--optimizer", "-o", "optimizer_name", callback=required_optimizer,
              help="Optimizer name (`kareus optimizers` lists them).  [required]")
@click.option("--gpu", default=DEFAULT_GPU, show_default=True,
              help="GPU preset (`kareus gpus`; your own files in $KAREUS_GPU_DIR).")
@click.option("--backend", default="sim", show_default=True, metavar="[sim|gpu]",
              help="Where plans run: the simulator, or this machine's GPUs.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Random seed of the optimizers' searches (Kareus's nsga2 and surrogate).")
@click.option("--time-budget-s", type=float, default=None,
              help="Return the least-energy plan finishing within this iteration time (s).")
@click.option("--energy-budget-j", type=float, default=None,
              help="Return the fastest plan within this energy per iteration (J).")
@click.option("--allow-clock-control", is_flag=True,
              help="GPU backend: lock SM clocks per instruction (admin rights; restored on exit).")
@click.option("--export", "export_dir", default=None, type=click.Path(file_okay=False),
              help="Write the chosen (or fastest) plan for deployment: freqs_pipeline.py (Zeus "
                   "pipeline-frequency PointSolution) and schedules.json (per-partition SMs/slot).")
@click.option("--solver", type=click.Choice(["fast", "exact"]), default=None,
              help="Time-cost solver (the same as --set solver=...): fast (the default) folds "
                   "long pipelines' steady state; exact solves the whole 1F1B DAG step for step "
                   "as lowtime does.")
@SET_OPTION
@click.option("--all", "all_points", is_flag=True,
              help=f"Print every frontier point (without it, at most {FRONTIER_ROWS}, evenly "
                   "spread, both ends and the choice included; --json always has them all).")
@click.option("--breakdown", is_flag=True,
              help="Also show where the chosen (or fastest) plan's time and energy go on each "
                   "stage, as `kareus simulate --breakdown` does (the simulator backend).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (its fields: docs/metrics.md).")
def frontier(workload: str, optimizer_name: str, gpu: str, backend: str, seed: int,
             time_budget_s: float | None, energy_budget_j: float | None,
             allow_clock_control: bool, export_dir: str | None, solver: str | None,
             settings: tuple[str, ...], strict: bool, all_points: bool, breakdown: bool,
             as_json: bool, **overrides: int | None) -> None:
    """Run one optimizer and print its measured time-energy frontier (or the plan within a
    time or energy budget)."""
    from kareus.errors import InputError
    from kareus.plugins import ignored_settings, load_optimizer
    from kareus.suite.harness import pick_within, run_optimizer
    from kareus.suite.problem import make_problem
    from kareus.suite.records import frontier_object
    from workloads.parallel import shape_label

    options, set_solver = _frontier_options(optimizer_name, solver, settings)
    opt = load_optimizer(optimizer_name, options)  # its settings, checked before any work
    warn([f"--set {key}: {optimizer_name} does not use it with the other settings given"
          for key in ignored_settings(optimizer_name, options)])
    if solver is not None and not set_solver:
        _check_has_solver(optimizer_name)  # refused as --set solver=... would be
    export_dir = _check_frontier_outputs(time_budget_s, energy_budget_j, breakdown, backend,
                                         export_dir)
    from kareus.suite.progress import terminal_progress

    with terminal_progress(not as_json) as progress:
        problem = make_problem(workload, gpu=gpu, backend=backend, seed=seed,
                               options=options, progress=progress,
                               backend_options={"allow_clock_control": True}
                               if allow_clock_control else None,
                               **{k: v for k, v in overrides.items() if v is not None})
        warnings = problem.workload.job_warnings_by_kind(problem.gpu.memory_bytes, strict)
        warn([m for kind in warnings.values() for m in kind])
        if breakdown:
            from kareus.backends.sim import SimulatorBackend

            if not isinstance(problem.backend, SimulatorBackend):
                raise InputError(f"--breakdown needs the simulator backend (--backend sim), not "
                                 f"{problem.backend.name}")
        run = run_optimizer(optimizer_name, opt, problem)
    if run.status != "ok":
        from kareus.errors import AllOptimizersFailed, JobRefused

        if run.refused:
            raise JobRefused(f"optimizer {optimizer_name} refused the job: {run.error}")
        raise AllOptimizersFailed(f"optimizer {optimizer_name} failed: {run.error}")
    g = problem.graph
    extra: dict[str, object] = {}
    chosen = None
    if time_budget_s is not None or energy_budget_j is not None:
        chosen = pick_within(run, time_budget_s=time_budget_s, energy_budget_j=energy_budget_j)
        extra["choice"] = {**chosen.to_dict(), "plan_id": chosen.plan_id,
                           "plan": run.plans[chosen.plan_id].to_json()}
    # what --export and --breakdown show: the budget's choice, else the fastest plan
    by_budget = chosen is not None
    pick = chosen if by_budget else run.max_throughput
    if chosen is None and run.choice is not None:  # no budget: the optimizer's own pick (Zeus's)
        chosen = run.choice.point  # reported and marked, as summary.json does
        extra["choice"] = {**run.choice.to_dict(), "plan": run.plans[chosen.plan_id].to_json()}
    assert pick is not None  # a run that finished has a frontier
    if export_dir is not None:
        _export_plan(export_dir, g, run.plans[pick.plan_id])
        extra["exported"] = {"dir": export_dir, "plan_id": pick.plan_id}
    describe = getattr(problem.backend, "describe", None)
    if callable(describe):  # the GPU backend says which clocks the plans really ran at
        extra["backend_info"] = describe()
    stages = []
    if breakdown:
        from kareus.backends.breakdown import time_breakdown

        plan = run.plans[pick.plan_id]
        stages = time_breakdown(problem.backend, g, plan, problem.backend.evaluate_plan(g, plan),
                                tuple(problem.workload.stage_layers()))
        extra["breakdown"] = {"plan_id": pick.plan_id,
                              "stages": [sb.to_dict() for sb in stages]}
    w = problem.workload
    obj = frontier_object(workload=w.name, optimizer=optimizer_name,
                          backend=problem.backend.name, gpu=problem.gpu.name,
                          num_gpus=g.num_gpus, gpus_per_stage=g.gpus_per_stage,
                          points=run.frontier, evaluated_plans=len(run.points),
                          parallel=w.parallel.job_fields(),
                          stage_layers=list(w.stage_layers()), **warnings, **extra)

    head = (f"{optimizer_name} on {w.name} ({g.num_gpus} x {problem.gpu.name}, "
            f"{shape_label(w.parallel.job_fields())}, {problem.backend.name}): "
            f"{len(run.points)} plan{'s' * (len(run.points) != 1)} "
            f"evaluated, {len(run.frontier)} on the frontier")
    label = run.plans[pick.plan_id].label
    why = "the choice within the budget" if by_budget else "the fastest" + (
        f"; {optimizer_name} picks plan_id {chosen.plan_id}: a budget exports another"
        if chosen is not None and chosen.plan_id != pick.plan_id else "")
    named = f' ("{label}", {why})' if label else f" ({why})"
    exported = (f"exported plan_id {pick.plan_id}{named} to {export_dir}: "
                "freqs_pipeline.py "
                "(Zeus's per-instruction clocks), schedules.json (each partition's window and SMs)"
                if export_dir is not None else None)
    where = ([f"\nwhere plan {extra['breakdown']['plan_id']}'s time and energy go "
              f"({'the choice' if by_budget else 'the fastest'}):",
              breakdown_text(stages, g.gpus_per_stage)] if stages else [])
    emit(obj, as_json, lambda: "\n".join(
        [head, _frontier_table(run.frontier, chosen, all_points)]
        + ([exported] if exported else []) + where))


def _check_frontier_outputs(time_budget_s: float | None, energy_budget_j: float | None,
                            breakdown: bool, backend: str, export_dir: str | None
                            ) -> str | None:
    """``kareus frontier``'s checks of what it is asked to pick and write, before any work:
    positive budgets, ``--breakdown`` only on the simulator, a writable ``--export`` folder.
    Returns the folder to export to (``~`` expanded), ``None`` without ``--export``."""
    from kareus.errors import InputError

    for label, v in (("--time-budget-s", time_budget_s), ("--energy-budget-j", energy_budget_j)):
        if v is not None and not v > 0:
            raise InputError(f"{label} must be positive, got {v}")
    if breakdown and backend != "sim":
        raise InputError(f"--breakdown needs the simulator backend (--backend sim), not {backend}")
    if export_dir is not None:
        from kareus.atomic import check_writable_dir

        export_dir = str(check_writable_dir(export_dir, "--export"))
        for name in EXPORT_FILES:
            target = Path(export_dir) / name
            if target.is_dir():
                raise InputError(f"--export {export_dir!r}: {name} there is a folder; the export "
                                 "writes a file of that name")
    return export_dir


def _frontier_options(optimizer_name: str, solver: str | None, settings: tuple[str, ...]
                      ) -> tuple[dict[str, object], bool]:
    """``kareus frontier``'s optimizer options from ``--set`` and ``--solver`` (which must
    agree), and whether ``--set`` named the solver."""
    from kareus.errors import InputError
    from kareus.suite.options import parse_settings

    given = parse_settings(settings, [optimizer_name])
    if solver is not None and given.get("solver", solver) != solver:
        raise InputError(f"--solver {solver} and --set solver={given['solver']} disagree; "
                         "give one")
    return {"solver": solver or "fast", **given}, "solver" in given


def _check_has_solver(optimizer_name: str) -> None:
    """Refuse ``--solver`` for an optimizer that declares no time-cost solver."""
    from kareus.errors import InputError
    from kareus.plugins import optimizer_names
    from kareus.suite.options import declared_settings

    have = declared_settings(optimizer_names())[0].get("solver", [])
    if optimizer_name not in have:
        raise InputError(f"--solver: {optimizer_name} has no time-cost solver to choose "
                         f"({', '.join(have)} have one)")


#: The files ``kareus frontier --export`` writes in its folder.
EXPORT_FILES = ("freqs_pipeline.py", "schedules.json")


def _export_plan(export_dir: str, graph: IterationGraph, plan: IterationPlan) -> None:
    """``--export``: ``plan`` for deployment, atomically: ``freqs_pipeline.py`` (Zeus's
    per-instruction clocks) and ``schedules.json`` (each partition's window and SMs)."""
    from kareus.atomic import atomic_write_text
    from kareus.suite.export import partition_schedules, zeus_solution_text

    zeus_file, schedules_file = (Path(export_dir) / name for name in EXPORT_FILES)
    atomic_write_text(zeus_file, zeus_solution_text(graph, plan))
    atomic_write_text(schedules_file, json.dumps(partition_schedules(graph, plan), indent=2) + "\n")


def _frontier_table(points: Sequence[Point], chosen: Point | None, all_points: bool) -> str:
    """``kareus frontier``'s table of ``points`` (fastest first): each point's time, energy and
    both against the fastest point, the ``chosen`` one marked; without ``all_points`` at most
    :data:`FRONTIER_ROWS`, evenly spread, and a line saying so."""
    from kareus.frontier import change_pct
    from kareus.frontier import fastest as fastest_index
    from kareus.suite.tables import sampled_rows, signed

    fastest = points[fastest_index([p.time_s for p in points], [p.energy_j for p in points])]
    picked = [i for i, p in enumerate(points) if chosen is not None and p.plan_id == chosen.plan_id]
    shown = list(range(len(points))) if all_points else sampled_rows(
        len(points), FRONTIER_ROWS, keep=picked)
    columns = ["time s", "energy kJ", "dynamic kJ", "static kJ", "time vs fastest",
               "energy vs fastest"] + (["choice"] if chosen is not None else [])
    rows = ([f"{p.time_s:.4f}", f"{p.energy_j / 1e3:.3f}", f"{p.dynamic_energy_j / 1e3:.3f}",
             f"{p.static_energy_j / 1e3:.3f}", f"{signed(change_pct(fastest.time_s, p.time_s))} %",
             f"{signed(change_pct(fastest.energy_j, p.energy_j))} %"]
            + (["<-" if i in picked else ""] if chosen is not None else [])
            for i, p in ((i, points[i]) for i in shown))
    more = ("" if len(shown) == len(points) else
            f"\n{len(shown)} of the {len(points)} frontier points shown, evenly spread; "
            "--all prints every one, --json the data")
    return render(columns, rows, left=("choice",)) + more
