"""The comparison harness: run optimizers, measure their plans, compare the frontiers.

Every plan an optimizer returns is evaluated on the problem's backend; the measured points
(whole-cluster energy, static included) are Pareto-filtered; the fastest plan and 10 plans spread
over the frontier are marked; the comparison metrics come from :mod:`kareus.frontier`. A plugin that
raises, returns nothing, or returns an invalid plan is recorded as failed with its error; the
other optimizers are unaffected.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kareus import frontier as fr
from kareus.errors import InputError, JobRefused, PlanError, PluginError
from kareus.plan import CHOICE, IterationPlan
from kareus.plugins import Optimizer, Problem
from kareus.suite.records import Choice, Point

#: Plans spread over each frontier in addition to the fastest one.
SPREAD = 10


@dataclass
class OptimizerRun:
    """What one optimizer produced on one problem.

    Attributes:
        name: Optimizer name.
        status: ``"ok"`` or ``"failed"``.
        error: One-line reason when failed.
        wall_s: Wall time of ``optimize`` plus the evaluation of its plans (s).
        optimize_s: Wall time of ``optimize`` alone (s).
        points: Every evaluated plan (``plan_id`` = index into ``plans``).
        frontier: Pareto-optimal points, by time.
        spread: ``plan_id`` of the fastest plan and up to 10 frontier plans spread over time.
        plans: The plans, as returned.
        choice: The point the optimizer itself singles out (e.g. Zeus's power-limit pick).
        refused: Whether it failed because the job does not allow its plans
            (:class:`~kareus.errors.JobRefused`: the user's input, not the optimizer's fault).
    """

    name: str
    status: Literal["ok", "failed"] = "ok"
    error: str | None = None
    wall_s: float = 0.0
    optimize_s: float = 0.0
    points: list[Point] = field(default_factory=list)
    frontier: list[Point] = field(default_factory=list)
    spread: list[int] = field(default_factory=list)
    plans: list[IterationPlan] = field(default_factory=list, repr=False)
    choice: Choice | None = None
    refused: bool = False

    @property
    def max_throughput(self) -> Point | None:
        if not self.frontier:
            return None
        return self.frontier[fr.fastest([p.time_s for p in self.frontier],
                                        [p.energy_j for p in self.frontier])]


def validate_plans(plans: object, problem: Problem) -> list[IterationPlan]:
    """Check a plugin's return value: a non-empty sequence of plans, each passing
    :meth:`IterationPlan.validate` on the problem's graph and GPU; raise :class:`PluginError`
    (not a list of plans) or :class:`PlanError` (a plan that cannot run), naming the first
    problem and the plan's index."""
    if plans is None:
        raise PluginError("returned nothing (None)")
    if isinstance(plans, IterationPlan) or not isinstance(plans, Sequence):
        raise PluginError(f"must return a sequence of IterationPlan, got {type(plans).__name__}")
    if len(plans) == 0:
        raise PluginError("returned no plans")
    for k, plan in enumerate(plans):
        if not isinstance(plan, IterationPlan):
            raise PluginError(f"plan {k} is a {type(plan).__name__}, not an IterationPlan")
        if not isinstance(plan.label, str) or not isinstance(plan.meta, Mapping):
            raise PluginError(f"plan {k}: label must be a str and meta a mapping, got "
                              f"{type(plan.label).__name__} and {type(plan.meta).__name__}")
        try:
            plan.validate(problem.graph, problem.gpu)
        except JobRefused:
            raise  # the job's, not this plan's: no plan index
        except PlanError as e:
            raise PlanError(f"plan {k}: {e}") from e
    return list(plans)


def run_optimizer(name: str, optimizer: Optimizer, problem: Problem,
                  on_plan: Callable[[int, int], None] | None = None) -> OptimizerRun:
    """Run ``optimizer`` and evaluate its plans; failures are captured, never raised.

    ``on_plan(done, total)`` is called as plans are evaluated (for progress bars).
    """
    run = OptimizerRun(name=name)
    t0 = time.perf_counter()
    try:
        plans = validate_plans(optimizer.optimize(problem), problem)
        run.optimize_s = time.perf_counter() - t0
        task = problem.progress.start(f"{name}: evaluating plans", total=len(plans))
        try:
            for k, plan in enumerate(plans):
                res = problem.backend.evaluate_plan(problem.graph, plan)
                p = Point.from_result(res, plan_id=k)
                if not all(math.isfinite(v) and v > 0 for v in (p.time_s, p.energy_j)):
                    raise PluginError(f"plan {k} measured a non-finite or non-positive result")
                run.points.append(p)
                task.advance()
                if on_plan is not None:
                    on_plan(k + 1, len(plans))
        finally:
            task.done()
        run.plans = plans
    except (Exception, SystemExit) as e:  # a plugin may fail in any way; the sweep goes on
        run.status = "failed"
        run.refused = isinstance(e, JobRefused)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        # where a plugin failed helps its author; a refusal of the job is the user's to fix, and
        # a plan the harness found invalid says which plan (the harness's line would mislead)
        loc = (f" ({where.filename.rsplit('/', 1)[-1]}:{where.lineno})"
               if where and not run.refused and not isinstance(e, PlanError) else "")
        run.error = msg if run.refused else f"{type(e).__name__}: {msg}{loc}"
        run.points, run.plans = [], []
    run.wall_s = time.perf_counter() - t0
    if run.points:
        keep = fr.pareto_indices([p.time_s for p in run.points],
                                 [p.energy_j for p in run.points])
        run.frontier = [run.points[i] for i in keep]
        idx = fr.spread_indices([p.time_s for p in run.frontier], SPREAD)
        fastest = run.max_throughput
        assert fastest is not None
        run.spread = sorted({fastest.plan_id, *(run.frontier[i].plan_id for i in idx)})
        for p in run.points:
            plan = run.plans[p.plan_id]
            if plan.meta.get(CHOICE):
                run.choice = Choice(p, plan.label)
    return run


def compare(runs: Mapping[str, OptimizerRun], baseline: str = "megatron",
            reference: str = "perseus") -> dict[str, dict[str, dict[str, float | None]]]:
    """The contract's comparison block: max throughput vs ``baseline`` and frontier metrics vs
    ``reference`` for every successful optimizer (``None`` = not attainable / not available)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {
        "max_throughput_vs_megatron": {}, "frontier_vs_perseus": {}}
    base = runs.get(baseline)
    ref = runs.get(reference)
    for name, run in runs.items():
        if run.status != "ok" or not run.frontier:
            continue
        mt = run.max_throughput
        if base is not None and base.max_throughput is not None:
            b = base.max_throughput
            out["max_throughput_vs_megatron"][name] = {
                "time_reduction_pct": fr.reduction_pct(b.time_s, mt.time_s),
                "energy_reduction_pct": fr.reduction_pct(b.energy_j, mt.energy_j),
            }
        if ref is not None and ref.frontier:
            rt = [p.time_s for p in ref.frontier]
            re_ = [p.energy_j for p in ref.frontier]
            t = [p.time_s for p in run.frontier]
            e = [p.energy_j for p in run.frontier]
            out["frontier_vs_perseus"][name] = {
                "iso_time_energy_reduction_pct": fr.iso_time_energy_reduction(rt, re_, t, e),
                "iso_energy_time_reduction_pct": fr.iso_energy_time_reduction(rt, re_, t, e),
            }
    return out


def pick_within(run: OptimizerRun, *, time_budget_s: float | None = None,
                energy_budget_j: float | None = None) -> Point:
    """The plan a user picks: least energy within a time budget, or fastest within an energy
    budget. Raises :class:`InputError` when no plan qualifies."""
    if (time_budget_s is None) == (energy_budget_j is None):
        raise InputError("give exactly one of --time-budget-s and --energy-budget-j")
    pts = run.frontier
    times, energies = [p.time_s for p in pts], [p.energy_j for p in pts]
    if time_budget_s is not None:
        i = fr.best_within(times, energies, time_budget_s)
        if i is None:
            raise InputError(f"no {run.name} plan finishes within {time_budget_s:.4g} s; the "
                             f"fastest takes {pts[fr.fastest(times, energies)].time_s:.4g} s")
        return pts[i]
    assert energy_budget_j is not None  # exactly one budget is given
    i = fr.best_within(energies, times, energy_budget_j)
    if i is None:
        least = pts[fr.least_energy(times, energies)].energy_j
        raise InputError(f"no {run.name} plan uses at most {energy_budget_j:.6g} J; the most "
                         f"frugal uses {least:.6g} J")
    return pts[i]


def load_and_run(name: str, problem: Problem,
                 on_plan: Callable[[int, int], None] | None = None) -> OptimizerRun:
    """Load the registered optimizer ``name``, its typed settings built from ``problem.options``
    (:func:`kareus.plugins.load_optimizer`), and run it on ``problem``. An unknown name or a bad
    setting is the user's mistake and raises :class:`InputError`; a plugin that cannot even be
    imported is recorded as failed, like one that fails while running. The suite's one
    plugin-loading path (:func:`run_all`, :func:`kareus.suite.executors.run_task`)."""
    from kareus.plugins import load_optimizer

    try:
        opt = load_optimizer(name, problem.options)
    except InputError:
        raise
    except (Exception, SystemExit) as e:  # broken plugin import or constructor: it fails alone
        return OptimizerRun(name=name, status="failed",
                            error=f"{type(e).__name__}: {e}".splitlines()[0])
    return run_optimizer(name, opt, problem, on_plan)


def run_all(problem: Problem, names: Sequence[str],
            on_start: Callable[[str], None] | None = None,
            on_plan: Callable[[str, int, int], None] | None = None,
            on_done: Callable[[OptimizerRun], None] | None = None) -> dict[str, OptimizerRun]:
    """Run registered optimizers by name, in order; a plugin that cannot even be loaded is
    recorded as failed like one that fails while running."""
    runs: dict[str, OptimizerRun] = {}
    for name in names:
        if on_start is not None:
            on_start(name)
        cb = (lambda d, t, _n=name: on_plan(_n, d, t)) if on_plan else None
        runs[name] = load_and_run(name, problem, cb)
        if on_done is not None:
            on_done(runs[name])
    return runs
