"""First-principles check of one simulated iteration (default: Llama 3.2 3B, paper testbed).

    python benchmarks/sanity.py [--workload W] [--gpu G]

Prints the simulator's iteration time, average power per GPU, MFU and static share, and next to
them the datasheet arithmetic that explains each: ideal time at tensor peak, the recomputation
factor, the clock the card holds under its power cap, the time in HBM-bound kernels and in
collectives, and the 1F1B bubble. docs/simulator.md ("First-principles check") walks through
the numbers.
"""

from __future__ import annotations

import click

from kareus.backends.sim import SimulatorBackend
from kareus.hardware.presets import DEFAULT_GPU, get_preset
from kareus.plan import IterationPlan
from kareus.suite.records import iteration_details
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workload", default="llama3.2-3b", show_default=True)
@click.option("--gpu", default=DEFAULT_GPU, show_default=True)
def main(workload: str, gpu: str) -> None:
    preset = get_preset(gpu)
    w = make_workload(workload)
    g = build_iteration_graph(w)
    sim = SimulatorBackend(preset)
    fmax = preset.clock_max_mhz
    plan_at_max = IterationPlan.uniform(g, fmax)
    res = sim.evaluate_plan(g, plan_at_max)
    d = iteration_details(res, preset, w.parallel.precision)
    e = res.energy
    p = w.parallel

    # Per stage: time by kernel class in one microbatch's forward + backward, at max clock.
    click.echo(f"{w.name}, {p.num_gpus} x {preset.name}, TP{p.tp} CP{p.cp} PP{p.pp} MBS{p.mbs} "
               f"x{p.microbatches}, seq {p.seq}, layers {w.stage_layers()}")
    click.echo(f"simulated: T = {e.time_s:.3f} s, E = {e.total_j / 1e3:.2f} kJ, "
               f"avg power/GPU = {d['avg_power_per_gpu_w']:.0f} W, MFU = {d['mfu']:.1%}, "
               f"static share = {d['static_share']:.1%}")
    ideal = g.model_flops / (p.num_gpus * preset.peak_flops)
    click.echo(f"ideal time at {preset.peak_flops / 1e12:.0f} TFLOP/s/GPU peak: {ideal:.3f} s "
               f"(model FLOPs {g.model_flops / 1e15:.2f} PFLOP)")
    stage_busy = {}
    for s in range(p.pp):
        cls = {"gemm": 0.0, "attention": 0.0, "memory": 0.0, "comm": 0.0}
        flops = 0.0
        for direction in ("forward", "backward"):
            ig = g.instruction_graphs[(s, direction)]
            for reps, segs in ((ig.layers, ig.sequential), (1, ig.extra)):
                for seg in segs:
                    for op in seg.compute:
                        cls[op.kind] += reps * sim.kernel_time(op, fmax, preset.sms)
                        flops += reps * op.flops
                    if seg.comm is not None and seg.comm.group > 1:
                        cls["comm"] += reps * sim.collective_time(seg.comm, fmax, None)
        busy = sum(cls.values())
        stage_busy[s] = busy
        click.echo(
            f"stage {s}: one microbatch F+B = {busy * 1e3:.1f} ms: "
            + ", ".join(f"{k} {v * 1e3:.1f} ms ({v / busy:.0%})" for k, v in cls.items())
            + f"; executed {flops / 1e12:.2f} TFLOP/GPU -> "
              f"{flops / (cls['gemm'] + cls['attention']) / 1e12:.0f} TFLOP/s in tensor kernels"
        )
    m, stages = p.microbatches, p.pp
    slowest = max(stage_busy.values())
    bubble = (stages - 1) * slowest / (m + stages - 1) / slowest
    est = (m + stages - 1) * slowest
    click.echo(f"1F1B estimate (M + S - 1) x slowest stage = {est:.3f} s "
               f"(bubble share {bubble:.1%}); simulator with P2P and optimizer step: "
               f"{e.time_s:.3f} s")
    for name in ("linear_fc1",):
        op = next(op for seg in g.instruction_graphs[(0, "forward")].sequential
                  for op in seg.compute if op.name == name)
        f_eff, watts = sim.kernel_power(op, fmax)
        click.echo(f"{name} alone, back to back, asked for {fmax:.0f} MHz runs at {f_eff:.0f} "
                   f"MHz, {watts:.0f} W (cap {preset.power_limit_w:.0f} W); inside an "
                   "instruction it runs throttled so too, while the memory-bound kernels and "
                   "collectives keep the locked clock")
    for key in sorted(g.instruction_graphs):
        c = sim.evaluate_instruction(g, key, plan_at_max.instructions[next(
            i for i in plan_at_max.instructions if i.type_key == key)])
        click.echo(f"instruction {key}: {c.time_s * 1e3:.1f} ms at "
                   f"{preset.static_power_w + c.dynamic_energy_j / c.time_s:.0f} W average")
    click.echo(f"static: {preset.static_power_w} W x {p.num_gpus} GPUs x {e.time_s:.3f} s = "
               f"{e.static_j / 1e3:.2f} kJ = {e.static_j / e.total_j:.1%} of energy")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "sanity.py"))
