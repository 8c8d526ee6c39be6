"""Kareus on the simulator: the issue's "must show" figures.

    python benchmarks/kareus_eval.py [--json]

1. Iso-time energy reduction and iso-energy time reduction vs the Perseus frontier for Kareus and
   nanobatch-perseus: Llama 3.2 3B and Qwen 3 1.7B, TP8 and CP2+TP4, MBS 8, seq 4096, 16 x A100 SXM4
   40 GB (the paper's testbed).
2. The frequency dependence of the schedule: per partition, the communication SMs and launch slot
   Kareus's frontier plans choose at low vs high clocks.
3. The optimality gap of the lowtime frontier vs the exact MILP on small instances.
4. Wall time of the Kareus optimizer per configuration (2 cores).

About 2.5 minutes on 2 cores shared with other runs (the MILP gaps about half of it).
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import click
import numpy as np

from kareus.frontier import change_pct, pareto_indices, spread_indices
from kareus.methods.exact import min_energy_within, reference_options
from kareus.methods.slack import SlackReclaimer, evaluate_on_options
from kareus.methods.tradeoff import solve
from kareus.optimizer.kareus import kareus_options
from kareus.plugins import load_optimizer
from kareus.progress import ProgressTask
from kareus.suite import harness
from kareus.suite.problem import make_problem

CONFIGS = [("llama3.2-3b", dict(tp=8)), ("llama3.2-3b", dict(tp=4, cp=2)),
           ("qwen3-1.7b", dict(tp=8)), ("qwen3-1.7b", dict(tp=4, cp=2))]
LOW_MHZ, HIGH_MHZ = 1110.0, 1290.0


def schedule_table(problem, run) -> list[dict]:  # noqa: ANN001
    """Per partition key, at clocks <= LOW vs >= HIGH over frontier plans: mean SMs (the library's
    kernel counted as its default channels), mean launch slot of the overlapped schedules
    (``None`` where every one is sequential) and the share of sequential ones."""
    seen: dict[tuple, tuple] = {}
    for p in run.frontier:
        for ins, ip in run.plans[p.plan_id].instructions.items():
            if ip.nanobatched:
                for key, s in ip.schedules:
                    sms = problem.gpu.comm_default_sms if s.comm_sms is None else s.comm_sms
                    seen[(ins.type_key, ip.clock_mhz, key)] = (sms, s.launch_slot)
    agg: dict[str, dict[str, list]] = defaultdict(lambda: {"low": [], "high": []})
    for (_, clock, key), (sms, slot) in seen.items():
        if clock <= LOW_MHZ:
            agg[key]["low"].append((sms, slot))
        elif clock >= HIGH_MHZ:
            agg[key]["high"].append((sms, slot))
    rows = []
    for key in sorted(agg):
        lo, hi = agg[key]["low"], agg[key]["high"]
        if lo and hi:
            rows.append({"partition": key,
                         "sms_low": statistics.mean(s for s, _ in lo),
                         "sms_high": statistics.mean(s for s, _ in hi),
                         "slot_low": _mean_slot(lo), "slot_high": _mean_slot(hi),
                         "sequential_low": sum(t < 0 for _, t in lo) / len(lo),
                         "sequential_high": sum(t < 0 for _, t in hi) / len(hi)})
    return rows


def _mean_slot(entries: list[tuple[int, int]]) -> float | None:
    """Mean launch slot of the overlapped ``(sms, slot)`` entries (slot -1: sequential, left
    out); ``None`` where there is none."""
    slots = [t for _, t in entries if t >= 0]
    return statistics.mean(slots) if slots else None


#: MILP instances: (workload, layout) with 8 options per instruction type.
GAP_INSTANCES = [("gpt3-xl", dict(tp=8, pp=2, microbatches=m)) for m in (2, 3, 4)] + [
    ("gpt3-xl", dict(tp=8, pp=3, microbatches=3)), ("gpt3-xl", dict(tp=8, pp=4, microbatches=4)),
    ("llama3.2-3b", dict(tp=4, cp=2, pp=2, microbatches=4)),
]


def optimality_gaps() -> list[dict]:
    """Energy above the MILP optimum at equal time (%), at 10 points spread over the Kareus
    options' lowtime frontier: the solver's plans as they are, and after slack reclamation
    (what the Kareus optimizer returns)."""
    out = []
    for workload, layout in GAP_INSTANCES:
        p = make_problem(workload, gpu="a100-sxm4-40gb", **layout)
        stages, micro = p.graph.stages, p.graph.microbatches
        opts = kareus_options(p)
        thin = reference_options(opts, 8)
        ps = p.gpu.static_power_w
        steps = list(solve(thin, stages, micro, ps))
        reclaim = SlackReclaimer(thin, stages, micro, ps)
        pts = [evaluate_on_options(s, thin, stages, micro, ps) for s in steps]
        keep = pareto_indices([a for a, _ in pts], [b for _, b in pts])
        gaps, after = [], []
        for i in spread_indices([pts[k][0] for k in keep], 10):
            step = steps[keep[i]]
            t, e = pts[keep[i]]
            better = reclaim(step.knobs)
            t2, e2 = evaluate_on_options(_Knobs(better), thin, stages, micro, ps)
            with _solver_prints_silenced():
                ex = min_energy_within(thin, stages, micro, ps, t)
                ex2 = ex if t2 >= t else min_energy_within(thin, stages, micro, ps, t2)
            gaps.append(change_pct(ex.energy_j, e))
            after.append(change_pct(ex2.energy_j, e2))
        out.append({"instance": f"{workload} {stages} stages x {micro} microbatches"
                                f"{' CP2' if layout.get('cp') else ''}, 8 options per type",
                    "gap_mean_pct": float(np.mean(gaps)), "gap_max_pct": float(np.max(gaps)),
                    "reclaimed_mean_pct": float(np.mean(after)),
                    "reclaimed_max_pct": float(np.max(after)), "points": len(gaps)})
    return out


@contextmanager
def _solver_prints_silenced():
    """Point this process's standard output (file descriptor 1) at ``/dev/null`` for the
    block: the HiGHS inside SciPy's ``milp`` prints a debug line from its C code
    (``HighsMipSolverData::transformNewIntegerFeasibleSolution``) with its output turned off,
    which no Python-level redirect catches."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # the C library's buffer, before fd 1 is restored
        os.dup2(saved, 1)
        os.close(saved)


class _Knobs:
    """A plan's knobs in the shape :func:`evaluate_on_options` reads (``.knobs``)."""

    def __init__(self, knobs: dict) -> None:
        self.knobs = knobs


def _run_configs(task: ProgressTask, as_json: bool) -> tuple[list[dict], dict]:
    """Perseus, Nanobatching + Perseus and Kareus on each of :data:`CONFIGS`: the frontier
    metrics against Perseus (one row per configuration, printed as it finishes without
    ``as_json``) and Kareus's schedules."""
    rows, schedules = [], {}
    for model, kw in CONFIGS:
        problem = make_problem(model, gpu="a100-sxm4-40gb", **kw)
        runs = {}
        for name in ("perseus", "nanobatch-perseus", "kareus"):
            t0 = time.perf_counter()
            runs[name] = harness.run_optimizer(name, load_optimizer(name), problem)
            runs[name].wall_s = time.perf_counter() - t0
            task.advance()
        cmp_ = harness.compare(runs)["frontier_vs_perseus"]
        label = f"{model} {'CP2+TP4' if kw.get('cp') else 'TP8'}"
        row = {"config": label}
        for name in ("nanobatch-perseus", "kareus"):
            row[f"{name} iso-time dE%"] = cmp_[name]["iso_time_energy_reduction_pct"]
            row[f"{name} iso-energy dT%"] = cmp_[name]["iso_energy_time_reduction_pct"]
        row["kareus wall s"] = runs["kareus"].wall_s
        rows.append(row)
        schedules[label] = schedule_table(problem, runs["kareus"])
        if not as_json:
            click.echo(f"{label}: " + ", ".join(
                f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in row.items()
                if k != "config"))
    return rows, schedules


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--json", "as_json", is_flag=True)
def main(as_json: bool) -> None:
    from kareus.suite.progress import terminal_progress

    report: dict = {"configs": [], "schedules": {}, "gaps": []}
    with terminal_progress() as progress:
        task = progress.start("configurations x optimizers", 3 * len(CONFIGS))
        report["configs"], report["schedules"] = _run_configs(task, as_json)
        task.done()
        task = progress.start("MILP optimality gaps", None)
        report["gaps"] = optimality_gaps()
        task.done()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo("\nschedule (mean SMs, the library's kernel as its channels / mean launch slot of "
               "the overlapped / share sequential) at <= 1110 MHz vs >= 1290 MHz:")
    slot = lambda v: " n/a" if v is None else f"{v:4.2f}"  # noqa: E731
    for label, rows in report["schedules"].items():
        click.echo(f"  {label}" + ("" if rows else ": no partition on the frontier at both"))
        for r in rows:
            click.echo(f"    {r['partition']:16s} SMs {r['sms_low']:5.1f} -> {r['sms_high']:5.1f}"
                       f"   slot {slot(r['slot_low'])} -> {slot(r['slot_high'])}   sequential "
                       f"{r['sequential_low']:.0%} -> {r['sequential_high']:.0%}")
    click.echo("\noptimality gap of the lowtime frontier vs the MILP optimum:")
    for g in report["gaps"]:
        click.echo(f"  {g['instance']}: lowtime's plans mean {g['gap_mean_pct']:.2f} %, max "
                   f"{g['gap_max_pct']:.2f} %; after slack reclamation mean "
                   f"{g['reclaimed_mean_pct']:.2f} %, max {g['reclaimed_max_pct']:.2f} % "
                   f"({g['points']} frontier points)")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "kareus_eval.py"))
