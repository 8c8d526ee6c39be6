"""``kareus simulate``: one iteration of Megatron-LM's plan, with ``--breakdown``'s tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from kareus.cli.common import build_workload, emit, render, workload_options
from kareus.hardware.presets import DEFAULT_GPU, get_preset

if TYPE_CHECKING:
    from kareus.backends.breakdown import StageBreakdown


@click.command()
@workload_options
@click.option("--gpu", default=DEFAULT_GPU, show_default=True,
              help="GPU preset (`kareus gpus`; your own files in $KAREUS_GPU_DIR).")
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
    from kareus.suite.problem import check_precision
    from kareus.suite.records import Point, frontier_object, iteration_details
    from workloads.graph_builder import build_iteration_graph
    from workloads.parallel import shape_label

    preset = get_preset(gpu)
    w = build_workload(workload, **overrides)
    check_precision(w, preset)
    warnings = w.job_warnings_by_kind(preset.memory_bytes, strict)
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
        stage_layers=list(w.stage_layers()), **warnings,
        **({"breakdown": [sb.to_dict() for sb in stages]} if breakdown else {}),
    )

    def text() -> str:
        e = result.energy
        lines = [
            f"{w.name} on {result.num_gpus} x {preset.name} ({shape_label(w.parallel.job_fields())}"
            f"; layers {list(w.stage_layers())}), Megatron-LM plan at "
            f"{preset.clock_max_mhz:.0f} MHz",
            f"  iteration time   {e.time_s:.3f} s",
            f"  energy           {e.total_j / 1e3:.2f} kJ (dynamic {e.dynamic_j / 1e3:.2f}, "
            f"static {e.static_j / 1e3:.2f}; static share {details['static_share']:.1%})",
            f"  avg power / GPU  {details['avg_power_per_gpu_w']:.0f} W",
            f"  MFU              {details['mfu']:.1%}",
            f"  {preset.provenance()}",
        ]
        lines += [f"  warning: {m}" for kind in warnings.values() for m in kind]
        if stages:
            lines += ["", breakdown_text(stages, result.gpus_per_stage)]
        return "\n".join(lines)

    emit(obj, as_json, text)


#: ``kareus simulate --breakdown``'s names for the parts of a micro-batch.
_PART_NAMES = {"gemm": "GEMM", "attention": "attention", "memory": "memory-bound",
               "collective": "collectives", "overlapped": "overlapped", "host_wait": "host wait"}


def breakdown_text(stages: Sequence[StageBreakdown], gpus_per_stage: int) -> str:
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
        ["stage", "instructions", "waits", "− host run-ahead", "optimizer + grad sync",
         "after its work", "iteration", "energy J (dynamic)"],
        ([sb.stage] + [f"{0.0 if abs(x) < 5e-4 else x:.3f}" for x in (
            sb.instructions_s, sb.waiting_s, -sb.run_ahead_s, sb.tail_s, sb.after_s,
            sb.iteration_s)] + [f"{sb.energy_j:.0f} ({sb.dynamic_j:.0f})"] for sb in stages),
        title="The iteration on one GPU of each stage, s; its energy, J",
        caption="waits: before and between its instructions (the pipeline filling, its "
                "neighbours, transfers between stages, an exposed --overlap-param-gather); "
                "host run-ahead: without stages the host "
                "issues ahead across micro-batches, and the time it saves is subtracted (the "
                "columns add up to the iteration); after its work: until the iteration ends (in "
                "1F1B the first stage ends last, so for the others the pipeline draining)")
    energy = sum(sb.energy_j for sb in stages) * gpus_per_stage
    per_stage = " + ".join(f"{sb.energy_j:.0f}" for sb in stages)
    return (micro + "\n" + iteration + f"\nthe job's energy: the stages' ({per_stage}) J x "
            f"{gpus_per_stage} GPUs each = {energy / 1e3:.3f} kJ")
