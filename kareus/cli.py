"""The ``kareus`` command line: list what exists, simulate an iteration, calibrate a preset.

Exit status: 0 success; 2 bad input (one line naming the problem and the valid choices);
1 internal failure.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from kareus import reproduction
from kareus.hardware.presets import DEFAULT_GPU, get_preset
from kareus.suite.options import (JOB_SHAPE_OPTIONS, PARALLEL_OPTIONS, SET_OPTION, WORKLOAD_HELP,
                                  comma_list)

if TYPE_CHECKING:
    from kareus.backends.breakdown import StageBreakdown
    from kareus.graph import IterationGraph
    from kareus.hardware.presets import GPUPreset
    from kareus.json_types import JsonObject
    from kareus.plan import IterationPlan
    from kareus.suite.records import Point

#: A click command function being decorated.
F = TypeVar("F", bound=Callable[..., object])



STRICT_OPTION = click.option(
    "--strict", is_flag=True,
    help="Refuse (exit 2) a layout whose estimated memory exceeds the GPU's, instead of warning.")


def warn(messages: list[str]) -> None:
    """Print each of a job's warnings on stderr (one line each)."""
    for m in messages:
        click.echo(f"warning: {m}", err=True)


def workload_options(f: F) -> F:
    """``--workload``, the parallelism overrides, the job's shape and ``--strict``, shared by
    every command taking a workload (``strict`` is passed as its own argument, the overrides as
    keywords)."""
    options = [
        click.option("--workload", "-w", required=True, help=WORKLOAD_HELP),
        *PARALLEL_OPTIONS,
        *JOB_SHAPE_OPTIONS,
        STRICT_OPTION,
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _where(path: str) -> str:
    """``path`` as a preset's source records it, the same from any working directory:
    ``shared/...`` inside the shared measurement folder, else absolute."""
    from kareus.suite.datasets import shared_dir

    full, shared = Path(path).resolve(), shared_dir()
    if shared is not None and full.is_relative_to(shared.resolve()):
        return f"shared/{full.relative_to(shared.resolve()).as_posix()}"
    return str(full)


def build_workload(workload: str, **overrides: object):  # noqa: ANN201
    """Validated :class:`~workloads.Workload` from CLI values (raises WorkloadError)."""
    from workloads import make_workload

    return make_workload(workload, **overrides)


#: Frontier points ``kareus frontier`` prints without ``--all``.
FRONTIER_ROWS = 15


def render(columns: Sequence[str], rows: Iterable[Sequence[object]], *,
           title: str | None = None, caption: str | None = None,
           left: Iterable[str] = ()) -> str:
    """A table as text (:func:`kareus.suite.tables.render`, imported when first used)."""
    from kareus.suite.tables import render as _render

    return _render(columns, rows, title=title, caption=caption, left=left)


def _emit(obj: object, as_json: bool, text: Callable[[], str]) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2, sort_keys=False))
    else:
        click.echo(text())


class _Commands(click.Group):
    """The command group; an unknown command names the valid ones."""

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and not args[0].startswith("-") and not ctx.resilient_parsing \
                and self.get_command(ctx, args[0]) is None:
            raise click.UsageError(f"no command {args[0]!r}; choose one of: "
                                   f"{', '.join(self.list_commands(ctx))}", ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Energy-optimal large-model training: Kareus, baselines, simulator and harness."""


@cli.command()
@click.option("--show", "show", default=None, metavar="NAME|PATH",
              help="Show one workload's derived shape: a built-in name, or a Hugging Face "
                   "config.json or its folder.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def workloads(show: str | None, as_json: bool) -> None:
    """List the workloads and their default shape (the paper testbed's degrees; layers split
    by FLOPs), or --show one."""
    from workloads import MODELS, make_workload

    if show is not None:
        _show_workload(show, as_json)
        return

    rows = []
    for name, m in MODELS.items():
        w = make_workload(name)
        p = w.parallel
        rows.append({
            "name": name, "params_b": round(m.total_params() / 1e9, 2), "layers": m.layers,
            "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "ffn": m.ffn,
            "vocab": m.vocab, "mlp": m.mlp, "qk_norm": m.qk_norm, "seq": p.seq,
            "default": f"TP{p.tp} PP{p.pp} CP{p.cp} DP{p.dp} MBS{p.mbs} x{p.microbatches} "
                       f"({p.num_gpus} GPUs, layers {'+'.join(map(str, w.stage_layers()))})",
        })

    def text() -> str:
        return render(
            ["workload", "params", "L", "hidden", "heads/kv", "ffn", "vocab", "mlp",
             "default shape"],
            ([r["name"], f"{r['params_b']:.2f}B", r["layers"], r["hidden"],
              f"{r['heads']}/{r['kv_heads']}", r["ffn"], r["vocab"],
              r["mlp"] + ("+qkn" if r["qk_norm"] else ""), f"seq {r['seq']}, {r['default']}"]
             for r in rows), left=("workload", "mlp", "default shape"))

    _emit(rows, as_json, text)


def _show_workload(name: str, as_json: bool) -> None:
    """``kareus workloads --show``: the model's fields, parameters and default parallel shape."""
    from dataclasses import asdict

    from workloads import MODELS, make_workload, workload_ref

    w = make_workload(name)
    m, p = w.model, w.parallel
    obj = {
        "name": w.name, "source": None if name in MODELS else workload_ref(name),
        "model": asdict(m), "params": m.total_params(),
        "default_parallel": p.job_fields(),
        "num_gpus": p.num_gpus, "stage_layers": list(w.stage_layers()),
    }

    def text() -> str:
        rows = [["source", obj["source"] or "built-in"]]
        rows += [[k, v] for k, v in obj["model"].items()
                 if not (k == "gelu" and m.mlp != "gelu")]  # which GELU: only a GELU MLP has one
        rows += [["params", f"{m.total_params() / 1e9:.3f}B ({m.total_params():,})"],
                 ["default shape",
                  f"TP{p.tp} PP{p.pp} CP{p.cp} DP{p.dp} MBS{p.mbs} x{p.microbatches}, "
                  f"seq {p.seq} ({p.num_gpus} GPUs, layers "
                  f"{'+'.join(map(str, w.stage_layers()))})"]]
        return render(["field", "value"], rows, title=f"workload {w.name}",
                      left=("field", "value"))

    _emit(obj, as_json, text)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON with every source.")
def gpus(as_json: bool) -> None:
    """List the GPU presets; each number carries its source (datasheet/published/fitted/...)."""
    from dataclasses import fields

    from kareus.hardware.presets import PRESETS

    out = {}
    for name, p in PRESETS.items():
        out[name] = {
            f.name: {"value": getattr(p, f.name), "source": p.sources.get(f.name, "")}
            for f in fields(p) if f.name not in ("name", "sources")
        }

    def text() -> str:
        return render(
            ["gpu", "SMs", "peak bf16 TF", "clock MHz", "HBM TB/s", "limit W", "static W", "knee",
             "default"],
            ([name, p.sms, f"{p.peak_flops / 1e12:.0f}",
              f"{p.clock_min_mhz:.0f}-{p.clock_max_mhz:.0f}", f"{p.hbm_bw / 1e12:.2f}",
              f"{p.power_limit_w:.0f}", f"{p.static_power_w:.2f}", f"{p.knee_mhz:.0f}",
              "*" if name == DEFAULT_GPU else ""] for name, p in PRESETS.items()),
            left=("gpu",), caption="peak: dense bf16 tensor FLOP/s at the top clock (datasheets "
                                   "may quote a lower sustained clock). Sources of every number: "
                                   "`kareus gpus --json`.")

    _emit(out, as_json, text)


@cli.command()
@workload_options
@click.option("--gpu", default=DEFAULT_GPU, show_default=True, help="GPU preset.")
@click.option("--breakdown", is_flag=True,
              help="Also show where the time goes on each stage: one micro-batch's kernels by "
                   "kind, collectives and waits for the host; the iteration's waits between "
                   "instructions, optimizer step and gradient synchronisation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (its fields: docs/metrics.md).")
def simulate(workload: str, gpu: str, breakdown: bool, strict: bool, as_json: bool,
             **overrides: int | None) -> None:
    """Simulate one iteration of the default (Megatron-LM) plan: max clock, no overlap."""
    from kareus.backends.sim import SimulatorBackend
    from kareus.plan import IterationPlan
    from kareus.suite.records import Point, frontier_object, iteration_details
    from workloads.graph_builder import build_iteration_graph

    from kareus.suite.problem import check_precision

    preset = get_preset(gpu)
    w = build_workload(workload, **overrides)
    check_precision(w, preset)
    fits = w.memory_warnings(preset.memory_bytes, strict)
    fill = w.pipeline_fill_warnings()
    positions = w.position_warnings()
    sequence = w.sequence_parallel_warnings()
    graph = build_iteration_graph(w)
    sim = SimulatorBackend(preset)
    plan = IterationPlan.uniform(graph, preset.clock_max_mhz, label="megatron")
    result = sim.evaluate_plan(graph, plan)
    details = iteration_details(result, preset, w.parallel.precision)
    stages = []
    if breakdown:
        from kareus.backends.breakdown import time_breakdown

        stages = time_breakdown(sim, graph, plan, result, tuple(w.stage_layers()))
    obj = frontier_object(
        workload=w.name, optimizer="megatron", backend=sim.name, gpu=preset.name,
        num_gpus=result.num_gpus, gpus_per_stage=result.gpus_per_stage,
        points=[Point.from_result(result)], details=details,
        parallel=w.parallel.job_fields(),
        stage_layers=list(w.stage_layers()), memory_warnings=fits, pipeline_warnings=fill,
        position_warnings=positions, sequence_parallel_warnings=sequence,
        **({"breakdown": [sb.to_dict() for sb in stages]} if breakdown else {}),
    )

    def text() -> str:
        e = result.energy
        lines = [
            f"{w.name} on {result.num_gpus} x {preset.name} (layers {list(w.stage_layers())}), "
            f"Megatron-LM plan at {preset.clock_max_mhz:.0f} MHz",
            f"  iteration time   {e.time_s:.3f} s",
            f"  energy           {e.total_j / 1e3:.2f} kJ (dynamic {e.dynamic_j / 1e3:.2f}, "
            f"static {e.static_j / 1e3:.2f}; static share {details['static_share']:.1%})",
            f"  avg power / GPU  {details['avg_power_per_gpu_w']:.0f} W",
            f"  MFU              {details['mfu']:.1%}",
            f"  {preset.provenance()}",
        ]
        lines += [f"  warning: {m}"
                  for m in fits + fill + positions + sequence]
        if stages:
            lines += ["", _breakdown_text(stages, result.gpus_per_stage)]
        return "\n".join(lines)

    _emit(obj, as_json, text)


#: ``kareus simulate --breakdown``'s names for the parts of a micro-batch.
_PART_NAMES = {"gemm": "GEMM", "attention": "attention", "memory": "memory-bound",
               "collective": "collectives", "overlapped": "overlapped", "host_wait": "host wait"}


def _breakdown_text(stages: Sequence[StageBreakdown], gpus_per_stage: int) -> str:
    """``--breakdown``'s two tables: the mean micro-batch's forward and backward on each stage
    by part (ms, share), and the iteration on one GPU of each stage (s, J), then the job's
    energy (every stage's GPU energy times the ``gpus_per_stage``)."""
    parts = [p for p in _PART_NAMES if any(p in sb.forward_s or p in sb.backward_s
                                           for sb in stages)]

    def cell(sb: StageBreakdown, part: str) -> str:
        t = sb.forward_s.get(part, 0.0) + sb.backward_s.get(part, 0.0)
        total = sum(sb.forward_s.values()) + sum(sb.backward_s.values())
        return f"{t * 1e3:.1f} ({t / total:.0%})"

    micro = render(
        ["stage", "layers", "forward ms", "backward ms"] + [_PART_NAMES[p] for p in parts],
        ([sb.stage, sb.layers, f"{sum(sb.forward_s.values()) * 1e3:.1f}",
          f"{sum(sb.backward_s.values()) * 1e3:.1f}"] + [cell(sb, p) for p in parts]
         for sb in stages),
        title="The mean micro-batch on one GPU of each stage: forward + backward by part, ms "
              "(share)",
        caption=("overlapped: a nanobatched plan's partitions, compute and collectives together"
                 if "overlapped" in parts else None))
    iteration = render(
        ["stage", "instructions", "waits", "host run-ahead", "optimizer + grad sync",
         "after its work", "iteration", "energy J (dynamic)"],
        ([sb.stage] + [f"{0.0 if abs(x) < 5e-4 else x:.3f}" for x in (
            sb.instructions_s, sb.waiting_s, -sb.run_ahead_s, sb.tail_s, sb.after_s,
            sb.iteration_s)] + [f"{sb.energy_j:.0f} ({sb.dynamic_j:.0f})"] for sb in stages),
        title="The iteration on one GPU of each stage, s; its energy, J",
        caption="waits: before and between its instructions (the pipeline filling, its "
                "neighbours, transfers between stages, an exposed --overlap-param-gather); "
                "host run-ahead: without stages the host "
                "issues ahead across micro-batches; after its work: until the iteration ends (in "
                "1F1B the first stage ends last, so for the others the pipeline draining)")
    energy = sum(sb.energy_j for sb in stages) * gpus_per_stage
    per_stage = " + ".join(f"{sb.energy_j:.0f}" for sb in stages)
    return (micro + "\n" + iteration + f"\nthe job's energy: the stages' ({per_stage}) J x "
            f"{gpus_per_stage} GPUs each = {energy / 1e3:.3f} kJ")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def optimizers(as_json: bool) -> None:
    """List the registered optimizers (built-ins and installed plugins) and the settings each
    takes (``--set NAME=VALUE``), each built once with its default settings so that a plugin that
    cannot be imported or constructed says so here rather than in a run."""
    from kareus.plugins import load_error, optimizer_names, registered_optimizers, setting_names

    eps = registered_optimizers()
    rows: list[dict[str, object]] = []
    for n in optimizer_names():
        why = load_error(n)
        rows.append({"name": n, "target": eps[n].value, "loads": not why,
                     "settings": setting_names(n), **({"error": why} if why else {})})

    def line(r: dict[str, object]) -> str:
        settings = r["settings"]
        out = f"{r['name']:20s} {r['target']}"
        if isinstance(settings, list) and settings:
            out += "  --set " + ", ".join(str(k) for k in settings)
        return out + (f"  (cannot be loaded: {r['error']})" if not r["loads"] else "")

    _emit(rows, as_json, lambda: "\n".join(line(r) for r in rows))


@cli.command()
@workload_options
@click.option("--optimizer", "-o", "optimizer_name", required=True, help="Optimizer name.")
@click.option("--gpu", default=DEFAULT_GPU, show_default=True, help="GPU preset.")
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

    options, set_solver = _frontier_options(optimizer_name, solver, settings)
    opt = load_optimizer(optimizer_name, options)  # its settings, checked before any work
    warn([f"--set {key}: {optimizer_name} does not use it with the other settings given"
          for key in ignored_settings(optimizer_name, options)])
    if solver is not None and not set_solver:
        _check_has_solver(optimizer_name)  # refused as --set solver=... would be
    _check_frontier_outputs(time_budget_s, energy_budget_j, breakdown, backend, export_dir)
    from kareus.suite.progress import terminal_progress

    with terminal_progress(not as_json) as progress:
        problem = make_problem(workload, gpu=gpu, backend=backend, seed=seed,
                               options=options, progress=progress,
                               backend_options={"allow_clock_control": True}
                               if allow_clock_control else None,
                               **{k: v for k, v in overrides.items() if v is not None})
        warn(problem.workload.job_warnings(problem.gpu.memory_bytes, strict))
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
    # what --export and --breakdown show: the choice, else the fastest plan
    pick = chosen if chosen is not None else run.max_throughput
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
                          stage_layers=list(w.stage_layers()), **extra)

    head = (f"{optimizer_name} on {w.name} ({g.num_gpus} x {problem.gpu.name}, "
            f"{problem.backend.name}): {len(run.points)} plan{'s' * (len(run.points) != 1)} "
            f"evaluated, {len(run.frontier)} on the frontier")
    label = run.plans[pick.plan_id].label
    named = f' ("{label}")' if label else ""
    exported = (f"exported plan_id {pick.plan_id}{named} to {export_dir}: "
                "freqs_pipeline.py "
                "(Zeus's per-instruction clocks), schedules.json (each partition's window and SMs)"
                if export_dir is not None else None)
    where = ([f"\nwhere plan {extra['breakdown']['plan_id']}'s time and energy go "
              f"({'the choice' if chosen is not None else 'the fastest'}):",
              _breakdown_text(stages, g.gpus_per_stage)] if stages else [])
    _emit(obj, as_json, lambda: "\n".join(
        [head, _frontier_table(run.frontier, chosen, all_points)]
        + ([exported] if exported else []) + where))


def _check_frontier_outputs(time_budget_s: float | None, energy_budget_j: float | None,
                            breakdown: bool, backend: str, export_dir: str | None) -> None:
    """``kareus frontier``'s checks of what it is asked to pick and write, before any work:
    positive budgets, ``--breakdown`` only on the simulator, a writable ``--export`` folder."""
    from kareus.errors import InputError

    for label, v in (("--time-budget-s", time_budget_s), ("--energy-budget-j", energy_budget_j)):
        if v is not None and not v > 0:
            raise InputError(f"{label} must be positive, got {v}")
    if breakdown and backend != "sim":
        raise InputError(f"--breakdown needs the simulator backend (--backend sim), not {backend}")
    if export_dir is not None:
        from kareus.atomic import check_writable_dir

        check_writable_dir(export_dir, "--export")
        for name in EXPORT_FILES:
            target = Path(export_dir) / name
            if target.is_dir():
                raise InputError(f"--export {export_dir!r}: {name} there is a folder; the export "
                                 "writes a file of that name")


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
    from kareus.suite.tables import sampled_rows

    fastest = points[fastest_index([p.time_s for p in points], [p.energy_j for p in points])]
    picked = [i for i, p in enumerate(points) if chosen is not None and p.plan_id == chosen.plan_id]
    shown = list(range(len(points))) if all_points else sampled_rows(
        len(points), FRONTIER_ROWS, keep=picked)
    columns = ["time s", "energy kJ", "dynamic kJ", "static kJ", "time vs fastest",
               "energy vs fastest"] + (["choice"] if chosen is not None else [])
    rows = ([f"{p.time_s:.4f}", f"{p.energy_j / 1e3:.3f}", f"{p.dynamic_energy_j / 1e3:.3f}",
             f"{p.static_energy_j / 1e3:.3f}", f"{change_pct(fastest.time_s, p.time_s):+.1f} %",
             f"{change_pct(fastest.energy_j, p.energy_j):+.1f} %"]
            + (["<-" if i in picked else ""] if chosen is not None else [])
            for i, p in ((i, points[i]) for i in shown))
    more = ("" if len(shown) == len(points) else
            f"\n{len(shown)} of the {len(points)} frontier points shown, evenly spread; "
            "--all prints every one, --json the data")
    return render(columns, rows, left=("choice",)) + more


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

    warn(pipeline_fill_warnings(microbatches, stages))
    runner = load_optimizer(optimizer)
    if not isinstance(runner, ProfileRunner):
        raise InputError(f"optimizer {optimizer!r} cannot run on a measured profile")
    from kareus.suite.progress import terminal_progress

    df = load_profile(profile_path)
    with terminal_progress(not as_json) as progress:
        points = runner.on_profile(df, profile_path, stages, microbatches, p_static,
                                   unit_time_s=unit_ms / 1e3, progress=progress, **kwargs)
    obj = {"profile": profile_path, "optimizer": optimizer, "stages": stages,
           "microbatches": microbatches, "p_static_w": p_static, "unit_ms": unit_ms, **kwargs,
           "num_gpus": stages, "points": points,
           "max_throughput": points[fastest([p["time_s"] for p in points],
                                            [p["energy_j"] for p in points])]
           if points else None}

    def text() -> str:
        from kareus.suite.tables import sampled_rows

        what = "solver steps" if kwargs.get("all_iterations") else "frontier points"
        step = "iteration" if optimizer == "perseus" else "steps"
        shown = (list(range(len(points))) if kwargs.get("all_iterations")
                 else sampled_rows(len(points), FRONTIER_ROWS))
        table = render([step, "time s", "energy J", "replayed time s", "replayed energy J"],
                       ([p.get(step, ""), f"{p['time_s']:.4f}", f"{p['energy_j']:.2f}",
                         f"{p['replayed_time_s']:.4f}", f"{p['replayed_energy_j']:.2f}"]
                        for p in (points[i] for i in shown)),
                       title=f"{optimizer} on {profile_path}: {len(points)} "
                             f"{what if optimizer == 'perseus' else 'point'}")
        if len(shown) < len(points):
            table += (f"\n{len(shown)} of the {len(points)} shown, evenly spread; --json prints "
                      "every one")
        return table

    _emit(obj, as_json, text)


@cli.command()
@_profile_options
@click.option("--filter", "prefilter", type=click.Choice(["raw", "effective"]), default="raw",
              show_default=True, help="Pareto pre-filter on raw or static-adjusted energy.")
@click.option("--all-iterations", is_flag=True, help="Every solver step, in solver order.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def perseus(profile_path: str, stages: int, microbatches: int, p_static: float, unit_ms: float,
            prefilter: str, all_iterations: bool, as_json: bool) -> None:
    """Perseus's time-energy frontier of an external Zeus-format profile (lowtime)."""
    _profile_command("perseus", profile_path, stages, microbatches, p_static, unit_ms, as_json,
                     prefilter=prefilter, all_iterations=all_iterations)


@cli.command()
@_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def envpipe(profile_path: str, stages: int, microbatches: int, p_static: float, unit_ms: float,
            as_json: bool) -> None:
    """EnvPipe's plan (one point) on an external Zeus-format profile."""
    _profile_command("envpipe", profile_path, stages, microbatches, p_static, unit_ms, as_json)


@cli.command()
@click.option("--profile", "profile_path", default=None, type=click.Path(dir_okay=False),
              help="Zeus-format CSV: stage,instruction,frequency,time,energy.")
@click.option("--partition-sweep", "sweep_path", default=None, type=click.Path(dir_okay=False),
              help="Measured partition sweep (the Kareus artifact's format); needs --spec, --out.")
@click.option("--spec", "spec_path", default=None, type=click.Path(dir_okay=False),
              help="--partition-sweep: the partition's spec.json.")
@click.option("--gpu", required=True, help="Preset whose curves are fitted.")
@click.option("--static-power", type=float, default=None,
              help="Static (blocked-on-P2P) power of the measured GPUs, W [preset's].")
@click.option("--power-limit", type=float, default=None,
              help="Power limit of the measured GPUs, W [preset's].")
@click.option("--gpu-measure", is_flag=True,
              help="Measure a profile on this machine's GPU first (GPU backend), then fit.")
@click.option("--workload", "-w", default="qwen3-1.7b", show_default=True,
              help="--gpu-measure: workload to profile (a name, or a Hugging Face config.json "
                   "or its folder).")
@STRICT_OPTION
@click.option("--layers", type=int, default=None, help="--gpu-measure: layers to run per stage.")
@click.option("--tp", type=int, default=None, help="--gpu-measure: tensor-parallel degree.")
@click.option("--pp", type=int, default=None, help="--gpu-measure: pipeline stages.")
@click.option("--dp", type=int, default=None, help="--gpu-measure: data-parallel replicas.")
@click.option("--mbs", type=int, default=None, help="--gpu-measure: micro-batch size.")
@click.option("--seq", type=int, default=None, help="--gpu-measure: sequence length (tokens).")
@click.option("--microbatches", type=int, default=None,
              help="--gpu-measure: microbatches per iteration.")
@click.option("--clocks", default=None, help="--gpu-measure: comma-separated clocks, MHz.")
@click.option("--out", "out_path", default=None,
              help="--gpu-measure: output folder [results/calibration]; --partition-sweep: the "
                   "calibration JSON to write.")
@click.option("--partitions/--no-partitions", default=False,
              help="--gpu-measure: also profile partition configurations.")
@click.option("--figure", "figure_path", default=None, type=click.Path(dir_okay=False),
              help="--partition-sweep: also plot measured against predicted time (PNG).")
@click.option("--allow-clock-control", is_flag=True,
              help="--gpu-measure: lock each clock (admin rights; restored on exit).")
@click.option("--write-preset", is_flag=True,
              help="--profile, --partition-sweep: also write the fitted values, with their "
                   "source, into the GPU's preset file (kareus/hardware/gpus/GPU.json or "
                   "$KAREUS_GPU_DIR's) and print the diff.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def calibrate(profile_path: str | None, sweep_path: str | None, spec_path: str | None, gpu: str,
              static_power: float | None, power_limit: float | None, gpu_measure: bool,
              workload: str, layers: int | None, tp: int | None, pp: int | None,
              dp: int | None, mbs: int | None, seq: int | None, microbatches: int | None,
              clocks: str | None, out_path: str | None,
              partitions: bool, figure_path: str | None, allow_clock_control: bool,
              write_preset: bool, strict: bool, as_json: bool) -> None:
    """Fit a preset's clock->time and clock->power curves to a measured profile (or measure one
    on this machine's GPU with --gpu-measure), or fit the partition law to a measured partition
    sweep (--partition-sweep)."""
    from kareus.errors import InputError
    from kareus.hardware.profile import power_problem

    for label, v in (("--static-power", static_power), ("--power-limit", power_limit)):
        why = None if v is None else power_problem(label, v)
        if why:
            raise InputError(why)
    modes = [m for m, on in (("--profile", profile_path), ("--partition-sweep", sweep_path),
                             ("--gpu-measure", gpu_measure)) if on]
    if len(modes) > 1:
        raise InputError(f"give one of --profile, --partition-sweep, --gpu-measure, not "
                         f"{' and '.join(modes)}")
    preset = get_preset(gpu)
    if static_power is not None:
        preset = preset.with_overrides(static_power_w=static_power)
    if power_limit is not None:
        preset = preset.with_overrides(power_limit_w=power_limit)
    from kareus.hardware.presets import physical_problem

    why = physical_problem(preset)
    if why:
        raise InputError(f"{preset.name} with --static-power / --power-limit: {why}")
    if write_preset and not (sweep_path or profile_path):
        raise InputError("--write-preset applies to --profile and --partition-sweep only")
    mode = modes[0] if modes else None
    for name, applies in _CALIBRATE_OPTION_MODES.items():
        if mode is not None and mode not in applies and _given(name):
            raise InputError(f"{_flag(name)} applies to {' and '.join(applies)} only, not {mode}")
    if write_preset:
        from kareus.atomic import check_writable_dir
        from kareus.hardware.presets import SHARED_FILE, preset_path

        for folder in {preset_path(preset.name).parent, SHARED_FILE.parent}:
            check_writable_dir(folder, "--write-preset's preset folder")
    if sweep_path is not None:
        _calibrate_partition(sweep_path, spec_path, preset, out_path, figure_path, as_json,
                             write_preset)
        return
    layout = {k: v for k, v in (("tp", tp), ("pp", pp), ("dp", dp), ("mbs", mbs), ("seq", seq),
                                 ("microbatches", microbatches)) if v is not None}
    if gpu_measure:
        from kareus.atomic import check_writable_dir

        out_dir = "results/calibration" if out_path is None else out_path
        check_writable_dir(out_dir, "--out")
        report = _gpu_measure(preset, workload, layers, clocks, out_dir, partitions,
                              allow_clock_control, static_power, strict, layout)
        _emit(report, as_json, lambda: json.dumps(report, indent=2))
        return
    if profile_path is None:
        raise InputError("give --profile CSV, --partition-sweep CSV, or --gpu-measure")
    _calibrate_profile(profile_path, gpu, preset, static_power, power_limit, as_json,
                       write_preset)


#: The largest fit error (time or energy MAPE, %) ``kareus calibrate --profile --write-preset``
#: writes into a preset; the published profiles fit within 3 %.
MAX_WRITTEN_FIT_MAPE_PCT = 10.0


def _calibrate_profile(profile_path: str, gpu: str, preset: GPUPreset,
                       static_power: float | None, power_limit: float | None, as_json: bool,
                       write_preset: bool) -> None:
    """``kareus calibrate --profile``: fit the clock -> time and clock -> power curves of
    ``gpu`` (``preset`` is it with the command's overrides) to a Zeus-format profile; report the
    fit, and with ``write_preset`` write it into the preset file."""
    from dataclasses import asdict

    from kareus.hardware.calibration import MIN_CLOCKS_BELOW_KNEE
    from kareus.hardware.calibration import calibrate as fit
    from kareus.hardware.profile import load_profile

    df = load_profile(profile_path)
    res = fit(df, get_preset(gpu), static_power_w=static_power, power_limit_w=power_limit)
    fitted = res.fitted_preset(get_preset(gpu))
    obj = {
        "gpu": preset.name, "profile": profile_path, "points": res.points,
        "static_power_w": res.static_power_w, "power_limit_w": res.power_limit_w,
        "fit": {**asdict(res.law), "sm_dyn_power_w": res.sm_dyn_power_w,
                "hbm_dyn_power_w": res.hbm_dyn_power_w,
                "kept_from_preset": list(res.kept_from_preset)},
        "error": {"time_mape_pct": res.time_mape_pct, "energy_mape_pct": res.energy_mape_pct},
        "fitted_preset": {k: fitted.__dict__[k] for k in
                          ("sm_dyn_power_w", "hbm_dyn_power_w", "knee_mhz", "v_ratio")},
    }
    if write_preset:
        worst = max(res.time_mape_pct, res.energy_mape_pct)
        if not (res.time_mape_pct <= MAX_WRITTEN_FIT_MAPE_PCT
                and res.energy_mape_pct <= MAX_WRITTEN_FIT_MAPE_PCT):  # a NaN is no fit either
            from kareus.errors import InputError

            raise InputError(f"--write-preset: the fit misses {profile_path} by {worst:.1f} % "
                             f"(time {res.time_mape_pct:.1f} %, energy "
                             f"{res.energy_mape_pct:.1f} % MAPE; at most "
                             f"{MAX_WRITTEN_FIT_MAPE_PCT:g} % is written): the profile does not "
                             "follow a GPU's clock law (check its columns and units)")
        source = f"fitted: `kareus calibrate --profile {_where(profile_path)}`"
        changes = {"sm_dyn_power_w": (round(fitted.sm_dyn_power_w, 1), source),
                   "knee_mhz": (round(fitted.knee_mhz, 1), source),
                   "v_ratio": (float(f"{fitted.v_ratio:.4g}"), source)}
        # what the profile could not identify keeps the preset's value and source
        obj.update(_write_fit(gpu, {k: v for k, v in changes.items()
                                    if k not in res.kept_from_preset}))

    def text() -> str:
        law = res.law
        return "\n".join([
            f"{preset.name}: fitted {res.points} rows of {profile_path}",
            f"  knee {law.knee_mhz:.0f} MHz, V(max)/V(knee) {law.v_ratio:.3f}, "
            f"clock-insensitive share {law.insensitive_share:.3f}",
            f"  SM dynamic power at max clock {res.sm_dyn_power_w:.1f} W "
            f"(HBM {res.hbm_dyn_power_w:.1f} W, static {res.static_power_w:.2f} W, "
            f"cap {res.power_limit_w:.0f} W)",
            f"  fit error: time MAPE {res.time_mape_pct:.2f} %, energy MAPE "
            f"{res.energy_mape_pct:.2f} %",
        ] + ([f"  kept from the preset, not fitted: {', '.join(res.kept_from_preset)} (fewer "
              f"than {MIN_CLOCKS_BELOW_KNEE} of the profile's clocks lie below the knee, "
              f"{preset.knee_mhz:.0f} MHz)"] if res.kept_from_preset else [])
            + _preset_diff_lines(obj))

    _emit(obj, as_json, text)


#: ``kareus calibrate``'s options that only one or two of its modes read (a click parameter name:
#: those modes); given with another mode they are refused, not silently dropped.
_CALIBRATE_OPTION_MODES: dict[str, tuple[str, ...]] = {
    "spec_path": ("--partition-sweep",),
    "figure_path": ("--partition-sweep",),
    "out_path": ("--gpu-measure", "--partition-sweep"),
    **{name: ("--gpu-measure",) for name in (
        "workload", "layers", "tp", "pp", "dp", "mbs", "seq", "microbatches", "clocks",
        "partitions", "allow_clock_control", "strict")},
}


def _flag(name: str) -> str:
    """The running command's long option for its parameter ``name`` (``out_path`` -> ``--out``,
    ``partitions`` -> ``--partitions/--no-partitions``)."""
    ctx = click.get_current_context()
    param = next(p for p in ctx.command.params if p.name == name)
    return "/".join(max(opts, key=len) for opts in (param.opts, param.secondary_opts) if opts)


def _given(name: str) -> bool:
    """Whether the running command's parameter ``name`` was given (command line or environment),
    not left at its default."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(name)
    return source in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _write_fit(gpu: str, changes: dict[str, tuple[float, str]],
               op_factors: dict | None = None) -> dict[str, str]:
    """``--write-preset``: write fitted values into the GPU's preset file; the file and the diff
    (``preset_file``, ``preset_diff``) for the command's output."""
    from kareus.hardware.presets import preset_path, update_preset_file

    path = preset_path(gpu)
    diff = update_preset_file(gpu, changes, op_factors=op_factors, path=path)
    return {"preset_file": str(path), "preset_diff": diff}


def _preset_diff_lines(obj: dict) -> list[str]:
    if "preset_file" not in obj:
        return []
    if not obj["preset_diff"]:
        return [f"  preset file {obj['preset_file']} unchanged"]
    return [f"  written to {obj['preset_file']}:", obj["preset_diff"].rstrip("\n")]


def _load_spec(spec_path: str | None, option: str):  # noqa: ANN202
    from kareus.errors import InputError
    from workloads.partition_spec import PartitionSpec

    if spec_path is None:
        raise InputError(f"{option} needs --spec SPEC (the partition's spec.json)")
    return PartitionSpec.load(spec_path)


def _calibrate_partition(sweep_path: str, spec_path: str | None, preset: GPUPreset,
                         out_path: str | None, figure_path: str | None, as_json: bool,
                         write_preset: bool = False) -> None:
    """``kareus calibrate --partition-sweep``: fit, report, write the calibration atomically."""
    from kareus.atomic import atomic_write_text
    from kareus.backends.partition_calibration import fit_partition
    from kareus.errors import InputError
    from kareus.hardware.partition_sweep import load_sweep

    spec = _load_spec(spec_path, "--partition-sweep")
    if out_path is None:
        raise InputError("--partition-sweep needs --out CALIB.json (where the fit is written)")
    from kareus.atomic import check_writable_dir

    for option, path in (("--out", out_path), ("--figure", figure_path)):
        if path is None:
            continue
        if not path.strip():
            raise InputError(f"{option}: empty path; name a file")
        if Path(path).is_dir():
            raise InputError(f"{option} {path} is a folder; give a file's path")
        check_writable_dir(Path(path).parent, f"{option}'s folder")
    if figure_path is not None:
        from kareus.suite.report import check_figure_path

        check_figure_path(figure_path, "--figure")
    part = spec.partition()
    sweep = load_sweep(sweep_path, len(part.compute), preset.comm_max_sms,
                       op_names=[op.name for op in part.compute])
    from kareus.suite.progress import terminal_progress

    with terminal_progress(not as_json) as progress:
        cal = fit_partition(part, sweep, preset, spec.sha256, progress=progress)
    fit_lines = cal.fit.lines() if cal.fit is not None else []
    obj = {**cal.to_dict(), "sweep": sweep_path, "spec": spec_path, "out": out_path}
    atomic_write_text(Path(out_path), json.dumps(cal.to_dict(), indent=2) + "\n")
    if write_preset:
        from kareus.hardware.presets import PartitionOpFactors, fitted_value

        source = (f"fitted: `kareus calibrate --partition-sweep {sweep_path} --spec {spec_path}` "
                  f"({preset.name}, {'default clock' if cal.clock_mhz is None else f'{cal.clock_mhz:.0f} MHz'})")
        obj.update(_write_fit(preset.name, {k: (fitted_value(v), source)
                                            for k, v in cal.law.items()},
                              {spec.sha256: PartitionOpFactors(
                                  tuple(fitted_value(v) for v in cal.op_work),
                                  tuple(fitted_value(v) for v in cal.op_host), source)}))
    if figure_path is not None:
        import numpy as np
        import pandas as pd

        from kareus.backends.partition_calibration import predict
        from kareus.frontier import mape_pct
        from kareus.suite.report import plot_partition_fit

        t, _ = predict(part, sweep.configs, cal.apply(preset), cal.clock_mhz,
                       np.array(cal.op_work), np.array(cal.op_host))
        c = sweep.configs
        frame = pd.DataFrame({"overlap_start": c.start, "overlap_end": c.end,
                              "comm_sm_number": c.sms, "comm_block_size": c.threads,
                              "measured_s": sweep.time_s, "predicted_s": t})
        plot_partition_fit(frame, Path(figure_path),
                           f"{Path(sweep_path).name} on {preset.name}: time MAPE "
                           f"{mape_pct(sweep.time_s, t):.2f} %")
        obj["figure"] = figure_path

    def text() -> str:
        return "\n".join([
            f"{preset.name}: partition law fitted to {len(sweep.configs)} configurations of "
            f"{sweep_path} (mean of {sweep.repeats} repeats); written to {out_path}",
            *("  " + line for line in fit_lines),
            "  law: " + ", ".join(f"{k}={v:.4g}" for k, v in cal.law.items()),
        ] + _preset_diff_lines(obj))

    _emit(obj, as_json, text)


@cli.command()
@click.option("--spec", "spec_path", required=True, type=click.Path(dir_okay=False),
              help="The partition's spec.json.")
@click.option("--configs", "configs_path", required=True, type=click.Path(dir_okay=False),
              help="CSV with overlap_start, overlap_end, comm_sm_number, comm_block_size; "
                   "the window counts ops from 0 as the fuser runs them (a linear's bias is an "
                   "op of its own).")
@click.option("--clock", type=float, default=None,
              help="Locked SM clock, MHz [the default, unlocked clock].")
@click.option("--calibration", "calibration_path", default=None,
              type=click.Path(dir_okay=False),
              help="A fit from `kareus calibrate --partition-sweep` [the preset's parameters].")
@click.option("--gpu", required=True, help="GPU preset.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def partition(spec_path: str, configs_path: str, clock: float | None,
              calibration_path: str | None, gpu: str, as_json: bool) -> None:
    """Predict the time and energy of a spec partition's configurations."""
    import numpy as np

    from kareus.backends.partition_calibration import PartitionCalibration, predict
    from kareus.errors import InputError
    from kareus.hardware.partition_sweep import CONFIG_COLUMNS, load_configs
    from kareus.hardware.presets import partition_op_factors

    preset = get_preset(gpu)
    spec = _load_spec(spec_path, "kareus partition")
    part = spec.partition()
    n = len(part.compute)
    if clock is not None and not (np.isfinite(clock) and preset.clock_min_mhz <= clock
                                  <= preset.clock_max_mhz):
        raise InputError(f"--clock {clock} MHz outside {preset.name}'s "
                         f"{preset.clock_min_mhz:.0f}-{preset.clock_max_mhz:.0f} MHz")
    asked = clock
    if clock is not None:  # the clock the prediction runs at: the preset's grid, snapped down
        grid = preset.clock_grid()
        clock = float(grid[max(0, int(np.searchsorted(grid, clock + 1e-6)) - 1)])
    work = host = None
    source = calibration_path
    if calibration_path is not None:
        cal = PartitionCalibration.load(calibration_path, preset.name, spec.sha256, n)
        preset = cal.apply(preset)
        work, host = np.array(cal.op_work), np.array(cal.op_host)
    elif (own := partition_op_factors(preset.name, spec.sha256)) is not None:
        work, host = np.array(own.op_work), np.array(own.op_host)
        source = f"preset (its law and the per-op factors of the fit it came from: {own.source})"
    else:
        source = "preset (its law; counted per-op work, no partition fit for this spec)"
    configs = load_configs(configs_path, n, preset.comm_max_sms,
                           op_names=[op.name for op in part.compute])
    t, e = predict(part, configs, preset, clock, work, host)
    points = [{CONFIG_COLUMNS[0]: int(s), CONFIG_COLUMNS[1]: int(e_), CONFIG_COLUMNS[2]: int(k),
               CONFIG_COLUMNS[3]: int(b), "time_s": float(ti), "energy_j": float(ei)}
              for s, e_, k, b, ti, ei in zip(configs.start, configs.end, configs.sms,
                                              configs.threads, t, e)]
    obj = {"gpu": gpu, "spec": spec_path, "clock_mhz": clock,  # the clock it ran at
           "calibration": calibration_path, "parameters": source, "points": points}

    def text() -> str:
        return render(["start", "end", "SMs", "block", "time ms", "energy J"],
                      ([p["overlap_start"], p["overlap_end"], p["comm_sm_number"],
                        p["comm_block_size"], f"{p['time_s'] * 1e3:.3f}",
                        f"{p['energy_j']:.4f}"] for p in points),
                      title=f"{len(points)} configurations of {spec_path} on {gpu} at "
                            f"{'the default clock' if clock is None else f'{clock:.0f} MHz'}"
                            + ("" if asked == clock else
                               f" ({asked:g} MHz, snapped down to the preset's "
                               f"{preset.clock_step_mhz:g} MHz grid)"))

    _emit(obj, as_json, text)


def _gpu_measure(preset: GPUPreset, workload: str, layers: int | None, clocks: str | None,
                 out_dir: str, partitions: bool, allow: bool, static_power: float | None,
                 strict: bool = False, layout: dict[str, int] | None = None) -> JsonObject:
    """``kareus calibrate --gpu-measure``: profile on the GPU backend, fit, report the error.
    ``layout``: the job's parallelism and shape (``tp``, ``pp``, ``dp``, ``mbs``, ``seq``,
    ``microbatches``; the workload's defaults otherwise, e.g. TP 8)."""
    from kareus.errors import InputError

    clock_list: list[float] | None = None
    if clocks:
        items = comma_list(clocks, "--clocks")
        try:
            clock_list = [float(c) for c in items]
        except ValueError:
            raise InputError(f"--clocks must be comma-separated numbers, got {clocks!r}") from None
    if layers is not None and layers < 1:
        raise InputError(f"--layers must be a positive integer, got {layers}")
    from kareus.backends.gpu import GPUBackend
    from kareus.backends.gpu.calibrate import gpu_measure
    from kareus.backends.gpu.measure import MeasureConfig
    from kareus.backends.gpu.serialize import reduced_workload

    layout = layout or {}
    w = reduced_workload(workload, layers, **layout) if layers else \
        build_workload(workload, **layout)
    warn(w.job_warnings(preset.memory_bytes, strict))
    backend = GPUBackend.create(preset, allow_clock_control=allow, static_power_w=static_power,
                                measure=MeasureConfig(window_s=5, cooldown_s=5),
                                hint="or fit a profile measured on a GPU machine with "
                                     "`kareus calibrate --profile CSV`")
    return gpu_measure(backend, w, out_dir, clocks_mhz=clock_list, nanobatched=False, ops=True,
                       partitions=partitions)


# `kareus reproduce` is `python reproduce.py`: the same click command (kareus.reproduction).
cli.add_command(reproduction.command, "reproduce")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; user errors exit 2 with one line (kareus.exit_status)."""
    from kareus.exit_status import run_command

    return run_command(cli, argv, "kareus")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
