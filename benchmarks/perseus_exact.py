"""Baselines against their authors' procedures (issue: Perseus step for step, EnvPipe as published).

    python benchmarks/perseus_exact.py [--microbatches 12] [--a40] [--skip-sim]

1. **Perseus on the authors' profiles** (``shared/perseus_sosp24``): ``kareus perseus``'s solver
   steps against the authors' driver (``tests/perseus_reference.py``, a transcription of
   ``lowtime/scripts/perseus.py`` from the Perseus artifact): number of steps, the largest time and
   energy difference over all steps, and both wall times, measured in one run. A100 profiles use
   the 1 ms unit; ``--a40`` adds the A40 profiles at 0.1 ms (thousands of steps: minutes).
2. **EnvPipe on the same profiles**: its time and energy as ratios to Perseus's fastest plan on
   the same profile, and how long each run took.
3. **Perseus's last solver step against the default plan** on the simulator, every paper
   configuration and gpt3-xl (``--skip-sim`` skips it).
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines.envpipe import envpipe_on_profile  # noqa: E402
from baselines.profiles import perseus_on_profile  # noqa: E402
from kareus.frontier import change_pct  # noqa: E402
from kareus.frontier import fastest as fastest_index  # noqa: E402
from kareus.hardware.profile import load_profile  # noqa: E402
from kareus.suite.datasets import perseus_profile  # noqa: E402
from tests.perseus_reference import reference_frontier  # noqa: E402

#: (profile, blocked-on-P2P power W, time unit ms): the Perseus artifact's values.
CASES = [("gpt3-175b+a100_sxm_bf16.csv", 83.64, 1.0), ("bloom+a100_sxm_bf16.csv", 83.64, 1.0)]
A40_CASES = [("gpt3-175b+a40_bf16.csv", 70.38, 0.1), ("bloom+a40_bf16.csv", 70.38, 0.1)]


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--microbatches", default=12, show_default=True, type=click.IntRange(min=1))
@click.option("--a40", is_flag=True, help="Also the A40 profiles (0.1 ms unit; slow).")
@click.option("--skip-sim", is_flag=True, help="Skip the simulator's fastest-plan table.")
def main(microbatches: int, a40: bool, skip_sim: bool) -> None:
    warnings.simplefilter("ignore")  # lowtime's grid search warns for every rejected guess
    cases = CASES + (A40_CASES if a40 else [])
    click.echo(f"== Perseus against the authors' driver (8 stages x {microbatches} microbatches)")
    click.echo(f"{'profile':30s} {'steps':>6s} {'ref':>6s} {'max|dt| s':>10s} {'max|dE| J':>10s}"
               f" {'ref s':>7s} {'ours s':>7s}")
    fastest = {}
    for name, p_static, unit_ms in cases:
        path = perseus_profile(name)
        if path is None:
            click.echo(f"{name}: not found (shared/perseus_sosp24)")
            continue
        t0 = time.perf_counter()
        ref = reference_frontier(str(path), 8, microbatches, p_static, unit_ms / 1e3)
        t1 = time.perf_counter()
        ours = perseus_on_profile(load_profile(path), 8, microbatches, p_static,
                                  unit_time_s=unit_ms / 1e3, all_iterations=True)
        t2 = time.perf_counter()
        same = len(ref) == len(ours) and all(r[2] == o["frequencies"] for r, o in zip(ref, ours))
        dt = max(abs(r[0] - o["time_s"]) for r, o in zip(ref, ours))
        de = max(abs(r[1] - o["energy_j"]) for r, o in zip(ref, ours))
        click.echo(f"{name:30s} {len(ours):6d} {len(ref):6d} {dt:10.2e} {de:10.2e} "
                   f"{t1 - t0:7.1f} {t2 - t1:7.1f}" + ("" if same else "  CLOCKS DIFFER"))
        fastest[name] = ours[fastest_index([p["time_s"] for p in ours],
                                           [p["energy_j"] for p in ours])]

    click.echo(f"\n== EnvPipe against Perseus's fastest plan ({microbatches} microbatches)")
    click.echo(f"{'profile':30s} {'T s':>8s} {'E J':>10s} {'T/T_P':>7s} {'E/E_P':>7s} {'run s':>6s}")
    for name, p_static, unit_ms in cases:
        if name not in fastest:
            continue
        t0 = time.perf_counter()
        env = envpipe_on_profile(load_profile(perseus_profile(name)), 8, microbatches, p_static,
                                 unit_time_s=unit_ms / 1e3)[0]
        took = time.perf_counter() - t0
        fp = fastest[name]
        click.echo(f"{name:30s} {env['time_s']:8.3f} {env['energy_j']:10.1f} "
                   f"{env['time_s'] / fp['time_s']:7.4f} {env['energy_j'] / fp['energy_j']:7.4f} "
                   f"{took:6.2f}")

    if not skip_sim:
        _fastest_table()


def _fastest_table() -> None:
    from baselines.perseus import Perseus
    from kareus.hardware.presets import DEFAULT_GPU
    from kareus.plan import IterationPlan
    from kareus.suite.problem import make_problem
    from kareus.suite.suites import get_suite

    click.echo(f"\n== Perseus's last solver step against the default plan (simulator, "
               f"{DEFAULT_GPU})")
    cases = [(c.label, c.workload, c.overrides) for c in get_suite("paper")]
    cases.append(("gpt3-xl", "gpt3-xl", {}))
    for label, workload, overrides in cases:
        problem = make_problem(workload, gpu=DEFAULT_GPU, **overrides)
        g, be = problem.graph, problem.backend
        default = be.evaluate_plan(g, IterationPlan.uniform(g, problem.gpu.clock_max_mhz))
        # the solver's last step (not the fastest-option plan after it): does it see the transfers
        steps = [p for p in Perseus().optimize(problem) if p.meta["solver_iteration"] is not None]
        fastest = be.evaluate_plan(g, steps[-1])
        d, f = default.energy.time_s, fastest.energy.time_s
        click.echo(f"{label:36s} default {d:8.4f} s   Perseus last step {f:8.4f} s "
                   f"({change_pct(d, f):+.3f} %)")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "perseus_exact.py"))
