"""The fast solver against the exact one, where the exact one is still feasible.

    python benchmarks/fast_vs_exact.py [--methods perseus,nanobatch-perseus,kareus]

For each job and method, both frontiers are measured on the simulator (A100 SXM4 80 GB): the
exact solve (the whole 1F1B DAG, lowtime's steps) and the fast one (steady state folded, OR-tools
cuts, plans spread; :func:`kareus.methods.profiling.tradeoff_plans`). Printed per row:

- the suite's iso metrics of the fast frontier against the exact one (iso-time energy and
  iso-energy time reduction, %; :mod:`kareus.frontier`), where 0 means the same;
- how far the fast frontier's points lie above the exact frontier (linearly interpolated
  between its points), max and mean %: how good the fast plans are; and how far the exact
  points lie above the fast frontier, min and mean % (negative where the fast frontier is
  worse, e.g. across a gap between its points);
- both wall times (s).

About half an hour on 2 cores (29 min measured, shared with other runs); Kareus's exact solve of
GPT-3 13B PP4 x 64 alone takes about 13 minutes.
"""

from __future__ import annotations

import time

import click
import numpy as np

from kareus import frontier as fr
from kareus.suite.harness import load_and_run
from kareus.suite.problem import make_problem

#: (label, workload, parallel layout); the exact solve is feasible for all of them, and the
#: fast one folds those with more than 32 microbatches.
JOBS = [
    ("gpt3-2.7b PP2x64", "gpt3-2.7b", dict(tp=8, pp=2, mbs=2, microbatches=64)),
    ("gpt3-13b PP4x64", "gpt3-13b", dict(tp=8, pp=4, mbs=2, microbatches=64)),
    ("gpt3-13b PP8x32", "gpt3-13b", dict(tp=8, pp=8, dp=2, mbs=2, microbatches=32)),
]


def above_pct(base_t: list[float], base_e: list[float], t: list[float],
              e: list[float]) -> tuple[float, float, float]:
    """(max, mean, min) over the points (t, e) within the base frontier's time range of how much
    they lie above the base frontier there, the base linearly interpolated (%)."""
    bt, be = np.asarray(base_t), np.asarray(base_e)
    t_, e_ = np.asarray(t), np.asarray(e)
    inside = (t_ >= bt.min()) & (t_ <= bt.max())
    if not inside.any():
        return float("nan"), float("nan"), float("nan")
    base = np.interp(t_[inside], bt, be)
    d = fr.change_pct(base, e_[inside])
    return float(d.max()), float(d.mean()), float(d.min())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--methods", default="perseus,nanobatch-perseus,kareus", show_default=True)
def main(methods: str) -> None:
    from kareus.errors import InputError
    from kareus.plugins import optimizer_names
    from kareus.suite.options import comma_list

    method_list = comma_list(methods, "--methods")
    unknown = [m for m in method_list if m not in optimizer_names()]
    if unknown:
        raise InputError(f"--methods: unknown optimizer {unknown[0]!r}; choose from "
                         f"{', '.join(optimizer_names())}")
    print(f"{'job':18s} {'method':18s} {'iso-time':>9s} {'iso-energy':>10s} "
          f"{'fast-above max/mean %':>21s} {'exact-above min/mean %':>22s} {'exact s':>8s} "
          f"{'fast s':>7s}")
    for label, workload, layout in JOBS:
        for method in method_list:
            runs, walls = {}, {}
            for solver in ("exact", "fast"):
                problem = make_problem(workload, gpu="a100-sxm4-80gb",
                                       options={"solver": solver}, **layout)
                start = time.perf_counter()
                runs[solver] = load_and_run(method, problem)
                walls[solver] = time.perf_counter() - start
                if runs[solver].status != "ok":
                    raise SystemExit(f"{label} {method} {solver}: {runs[solver].error}")
            ref = ([p.time_s for p in runs["exact"].frontier],
                   [p.energy_j for p in runs["exact"].frontier])
            got = ([p.time_s for p in runs["fast"].frontier],
                   [p.energy_j for p in runs["fast"].frontier])
            iso_t = fr.iso_time_energy_reduction(*ref, *got)
            iso_e = fr.iso_energy_time_reduction(*ref, *got)
            plans = above_pct(*ref, *got)  # fast plans above the exact frontier
            gaps = above_pct(*got, *ref)  # exact plans above the fast frontier (negative: gaps)
            fmt = lambda v: "n/a" if v is None else f"{v:+.3f}"  # noqa: E731
            print(f"{label:18s} {method:18s} {fmt(iso_t):>9s} {fmt(iso_e):>10s} "
                  f"{plans[0]:+10.3f}/{plans[1]:+.3f} {gaps[2]:+10.3f}/{gaps[1]:+.3f} "
                  f"{walls['exact']:8.1f} {walls['fast']:7.1f}", flush=True)


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "fast_vs_exact.py"))
