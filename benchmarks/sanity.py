"""First-principles check of one simulated iteration (default: Llama 3.2 3B, paper testbed).

    python benchmarks/sanity.py [--workload W] [--gpu G] [--write results/fidelity/summary.json]

Prints the simulator's iteration time, average power per GPU, MFU and static share, and next to
them the datasheet arithmetic that explains each: ideal time at tensor peak, the recomputation
factor, the clock the card holds under its power cap, the time in HBM-bound kernels and in
collectives, and the 1F1B bubble. ``--write`` records the figures as the ``first-principles``
entry of a record file; docs/calibration.md ("First-principles check") renders its table from
the committed one (``python -m kareus.suite.docs_render``).
"""

from __future__ import annotations

import datetime

import click

from kareus.backends.sim import SimulatorBackend
from kareus.hardware.presets import DEFAULT_GPU, get_preset
from kareus.plan import IterationPlan
from kareus.suite.records import iteration_details
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph

#: The kernel whose clock under the power cap the check reports.
CAPPED_KERNEL = "linear_fc1"
#: Kernel classes, in the order the breakdown lists them.
CLASSES = ("gemm", "attention", "memory", "comm")


def figures(workload: str = "llama3.2-3b", gpu: str = DEFAULT_GPU) -> dict:
    """The check's figures for Megatron-LM's plan (every instruction at the top clock) of
    ``workload`` on ``gpu``: the job, the simulated iteration (s, kJ, W, %), the ideal time at
    tensor peak (s), each stage's busy time of one microbatch forward + backward by kernel class
    (ms, at the top clock without the power cap), the 1F1B estimate (s), the capped kernel's clock
    (MHz) and power (W), each instruction's time (ms) and average power (W), and the static
    energy (W, kJ)."""
    preset = get_preset(gpu)
    w = make_workload(workload)
    g = build_iteration_graph(w)
    sim = SimulatorBackend(preset)
    fmax = preset.clock_max_mhz
    plan = IterationPlan.uniform(g, fmax)
    res = sim.evaluate_plan(g, plan)
    d = iteration_details(res, preset, w.parallel.precision)
    e, p = res.energy, w.parallel
    stages = []
    for s in range(p.pp):
        cls = dict.fromkeys(CLASSES, 0.0)
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
        stages.append({"stage": s, "busy_ms": 1e3 * sum(cls.values()),
                       **{f"{k}_ms": 1e3 * v for k, v in cls.items()},
                       "executed_tflop": flops / 1e12,
                       "tensor_tflops": flops / (cls["gemm"] + cls["attention"]) / 1e12})
    slowest_s = max(st["busy_ms"] for st in stages) / 1e3
    op = next(op for seg in g.instruction_graphs[(0, "forward")].sequential
              for op in seg.compute if op.name == CAPPED_KERNEL)
    capped_mhz, capped_w = sim.kernel_power(op, fmax)
    instructions = []
    for key in sorted(g.instruction_graphs):
        c = sim.evaluate_instruction(g, key, plan.instructions[next(
            i for i in plan.instructions if i.type_key == key)])
        instructions.append({"stage": key[0], "direction": str(key[1]),
                             "time_ms": 1e3 * c.time_s,
                             "avg_power_w": preset.static_power_w + c.dynamic_energy_j / c.time_s})
    return {
        "workload": w.name, "gpu": preset.name, "gpus": p.num_gpus, "tp": p.tp, "cp": p.cp,
        "pp": p.pp, "mbs": p.mbs, "microbatches": p.microbatches, "seq": p.seq,
        "stage_layers": list(w.stage_layers()), "recompute": p.recompute,
        "sequence_parallel": p.sequence_parallel, "clock_mhz": fmax,
        "gemm_efficiency": preset.gemm_efficiency, "hbm_efficiency": preset.hbm_efficiency,
        "time_s": e.time_s, "energy_kj": e.total_j / 1e3,
        "avg_power_per_gpu_w": d["avg_power_per_gpu_w"], "mfu_pct": 100 * d["mfu"],
        "static_share_pct": 100 * d["static_share"],
        "peak_tflops": preset.peak_flops / 1e12, "model_pflop": g.model_flops / 1e15,
        "ideal_time_s": g.model_flops / (p.num_gpus * preset.peak_flops),
        "stages": stages,
        "one_f_one_b_s": (p.microbatches + p.pp - 1) * slowest_s,
        "bubble_pct": 100 * (p.pp - 1) / (p.microbatches + p.pp - 1),
        "capped_kernel": {"name": CAPPED_KERNEL, "runs_at_mhz": capped_mhz, "power_w": capped_w,
                          "power_limit_w": preset.power_limit_w},
        "instructions": instructions,
        "p2p_ms": 1e3 * max(sim.p2p_times(g), default=0.0),
        "network_gb_s": preset.network_bw / 1e9,
        "static_power_w": preset.static_power_w, "static_kj": e.static_j / 1e3,
    }


def report(f: dict) -> list[str]:
    """The figures as the lines the check prints."""
    lines = [
        f"{f['workload']}, {f['gpus']} x {f['gpu']}, TP{f['tp']} CP{f['cp']} PP{f['pp']} "
        f"MBS{f['mbs']} x{f['microbatches']}, seq {f['seq']}, layers {tuple(f['stage_layers'])}",
        f"simulated: T = {f['time_s']:.3f} s, E = {f['energy_kj']:.2f} kJ, avg power/GPU = "
        f"{f['avg_power_per_gpu_w']:.0f} W, MFU = {f['mfu_pct']:.1f}%, static share = "
        f"{f['static_share_pct']:.1f}%",
        f"ideal time at {f['peak_tflops']:.0f} TFLOP/s/GPU peak: {f['ideal_time_s']:.3f} s "
        f"(model FLOPs {f['model_pflop']:.2f} PFLOP)"]
    for st in f["stages"]:
        lines.append(
            f"stage {st['stage']}: one microbatch F+B = {st['busy_ms']:.1f} ms: "
            + ", ".join(f"{k} {st[k + '_ms']:.1f} ms ({st[k + '_ms'] / st['busy_ms']:.0%})"
                        for k in CLASSES)
            + f"; executed {st['executed_tflop']:.2f} TFLOP/GPU -> {st['tensor_tflops']:.0f} "
              "TFLOP/s in tensor kernels")
    lines.append(f"1F1B estimate (M + S - 1) x slowest stage = {f['one_f_one_b_s']:.3f} s (bubble "
                 f"share {f['bubble_pct']:.1f}%); simulator with P2P and optimizer step: "
                 f"{f['time_s']:.3f} s")
    k = f["capped_kernel"]
    lines.append(f"{k['name']} alone, back to back, asked for {f['clock_mhz']:.0f} MHz runs at "
                 f"{k['runs_at_mhz']:.0f} MHz, {k['power_w']:.0f} W (cap {k['power_limit_w']:.0f} "
                 "W); inside an instruction it runs throttled so too, while the memory-bound "
                 "kernels and collectives keep the locked clock")
    for ins in f["instructions"]:
        lines.append(f"instruction ({ins['stage']}, {ins['direction']!r}): {ins['time_ms']:.1f} "
                     f"ms at {ins['avg_power_w']:.0f} W average")
    lines.append(f"static: {f['static_power_w']} W x {f['gpus']} GPUs x {f['time_s']:.3f} s = "
                 f"{f['static_kj']:.2f} kJ = {f['static_share_pct']:.1f}% of energy")
    return lines


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workload", default="llama3.2-3b", show_default=True)
@click.option("--gpu", default=DEFAULT_GPU, show_default=True)
@click.option("--write", "write_json", default=None, type=click.Path(dir_okay=False),
              help="Merge the figures, as the 'first-principles' entry, into this JSON record "
                   "file (results/fidelity/summary.json: the docs render them from it).")
def main(workload: str, gpu: str, write_json: str | None) -> None:
    from kareus.atomic import check_json_record, merge_json_record

    check_json_record(write_json, "--write")
    f = figures(workload, gpu)
    for line in report(f):
        click.echo(line)
    if write_json is not None:
        command = "python benchmarks/sanity.py" + (
            "" if (workload, gpu) == ("llama3.2-3b", DEFAULT_GPU)
            else f" --workload {workload} --gpu {gpu}")
        merge_json_record(write_json, {"first-principles": {
            "date": datetime.date.today().isoformat(), "command": command, **f}})
        click.echo(f"wrote the first-principles entry of {write_json}")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "sanity.py"))
