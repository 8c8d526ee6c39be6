"""Simulator speed: one partition's full knob grid, and one full iteration plan.

    python benchmarks/speed.py [--repeats 20]

Targets, cold: one partition's grid (the Kareus knob space: 18 clocks x 11 SM counts x every
(launch, wait) window) in <= 10 ms; a whole iteration plan of a paper configuration in
<= 100 ms; each line says whether its target is met. "Cold" builds a fresh simulator (empty
caches) for each repeat; "warm" reuses one. Medians over the repeats, wall clock
(time.perf_counter).
"""

from __future__ import annotations

import statistics
import time

import click
import numpy as np

from kareus.backends.sim import SimulatorBackend
from kareus.hardware.presets import get_preset
from kareus.hardware.knobs import KnobSpace
from kareus.optimizer.kareus import partition_space
from kareus.plan import IterationPlan, PartitionSchedule
from workloads import make_workload
from workloads.graph_builder import build_iteration_graph


def _median_ms(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def _target(cold_ms: float, target_ms: float) -> str:
    """Whether the cold median meets the module docstring's target."""
    return f"target <= {target_ms:g} ms cold: {'met' if cold_ms <= target_ms else 'MISSED'}"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--repeats", default=20, show_default=True, type=click.IntRange(min=1),
              help="Timed repeats; the medians are reported.")
def main(repeats: int) -> None:
    gpu = get_preset("a100-sxm4-40gb")
    for label, kw in (("llama3.2-3b TP8", {}), ("llama3.2-3b CP2+TP4", dict(tp=4, cp=2))):
        g = build_iteration_graph(make_workload("llama3.2-3b", **kw))
        part = g.instruction_graphs[(0, "backward")].partitions[-1]
        space = partition_space(part, KnobSpace.default(gpu))  # Kareus's grid: 900-1410 MHz
        clocks, ks, windows = space.clocks_mhz, space.comm_sms, space.windows
        n = clocks.size * ks.size * windows.shape[0]
        cold = _median_ms(lambda: SimulatorBackend(gpu).evaluate_partition(
            part, clocks, ks, windows), repeats)
        warm_sim = SimulatorBackend(gpu)
        warm = _median_ms(lambda: warm_sim.evaluate_partition(part, clocks, ks, windows),
                          repeats)
        click.echo(f"{label}: partition {part.key}, {n} configurations: cold {cold:.2f} ms, "
                   f"warm {warm:.2f} ms ({warm / n * 1e3:.2f} us/config); {_target(cold, 10)}")
        sched = {p.key: PartitionSchedule(12, 1, None) for p in
                 g.instruction_graphs[(0, "forward")].partitions}
        rng = np.random.default_rng(0)
        grid = gpu.clock_grid(900, 1410)

        def random_plan() -> IterationPlan:
            base = IterationPlan.uniform(g, 1410, True)
            return IterationPlan({ins: type(p).make(float(rng.choice(grid)), True,
                                                     sched if ins.direction == "forward" else {})
                                  for ins, p in base.instructions.items()})

        cold_plan = _median_ms(lambda: SimulatorBackend(gpu).evaluate_plan(g, random_plan()),
                               repeats)
        warm_plan_sim = SimulatorBackend(gpu)
        warm_plan = _median_ms(lambda: warm_plan_sim.evaluate_plan(g, random_plan()), repeats)
        click.echo(f"{label}: full nanobatched iteration plan, random clock per instruction: "
                   f"cold {cold_plan:.1f} ms, warm {warm_plan:.1f} ms; {_target(cold_plan, 100)}")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "speed.py"))
