"""Tables (pandas), figures (seaborn) and the results folder of a comparison.

Files written under ``results/<workload>/``:

- ``summary.json`` — the contract's object: one frontier-like object per optimizer under
  ``optimizers`` and the metrics under ``comparison``;
- ``frontiers.csv`` — tidy: optimizer, time_s, energy_j, dynamic_energy_j, static_energy_j,
  plan_id, on_frontier, spread (one row per evaluated plan);
- ``comparison.md`` — the max-throughput table vs Megatron-LM and the frontier table vs Perseus;
- ``frontiers.png`` and ``energy_breakdown.png``;
- ``timings.json`` — wall times (everything else is deterministic for a given input and seed).

Every file is written to a temporary name and renamed into place, so a reader never sees a
half-written file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from kareus.atomic import atomic_path, atomic_write_text
from kareus.frontier import change_pct
from kareus.plugins import Problem
from kareus.suite import store
from kareus.suite.harness import OptimizerRun
from kareus.suite.records import frontier_object
from kareus.suite.tables import signed


def summary_object(problem: Problem, runs: Mapping[str, OptimizerRun],
                   comparison: Mapping[str, object],
                   made_by: Mapping[str, Mapping] | None = None, **meta: object) -> dict:
    """The ``summary.json`` object. ``made_by``: per optimizer, who computed its cell (suite
    version, git commit, code hashes), recorded in its object when given."""
    w, g = problem.workload, problem.graph
    optimizers = {}
    for name, run in runs.items():
        extra: dict[str, object] = ({"made_by": dict(made_by[name])}
                                    if made_by and name in made_by else {})
        if run.refused:
            extra["refused"] = True
        optimizers[name] = frontier_object(
            workload=w.name, optimizer=name, backend=problem.backend.name, gpu=problem.gpu.name,
            num_gpus=g.num_gpus, gpus_per_stage=g.gpus_per_stage, points=run.frontier,
            status=run.status, error=run.error, evaluated_plans=len(run.points),
            spread_plan_ids=run.spread,
            choice=None if run.choice is None else run.choice.to_dict(), **extra,
        )
    p = w.parallel
    return {
        "workload": w.name, "backend": problem.backend.name, "gpu": problem.gpu.name,
        "num_gpus": g.num_gpus, "gpus_per_stage": g.gpus_per_stage,
        "parallel": p.job_fields(),
        "stage_layers": list(w.stage_layers()),
        "optimizers": optimizers, "comparison": dict(comparison), **meta,
    }


def timings_object(runs: Mapping[str, OptimizerRun], wall_s: float) -> dict:
    """Wall times (s), kept out of ``summary.json`` so that it is byte-identical across runs."""
    return {"wall_s": round(wall_s, 3),
            "optimizers": {n: {"wall_s": round(r.wall_s, 3), "optimize_s": round(r.optimize_s, 3)}
                           for n, r in runs.items()}}


def frontiers_frame(runs: Mapping[str, OptimizerRun]) -> pd.DataFrame:
    """Tidy frame of every evaluated point."""
    rows = []
    for name, run in runs.items():
        on_front = {p.plan_id for p in run.frontier}
        spread = set(run.spread)
        for p in run.points:
            rows.append({"optimizer": name, "time_s": p.time_s, "energy_j": p.energy_j,
                         "dynamic_energy_j": p.dynamic_energy_j,
                         "static_energy_j": p.static_energy_j, "plan_id": p.plan_id,
                         "on_frontier": p.plan_id in on_front, "spread": p.plan_id in spread})
    return pd.DataFrame(rows, columns=["optimizer", "time_s", "energy_j", "dynamic_energy_j",
                                       "static_energy_j", "plan_id", "on_frontier", "spread"])


def _pct(v: float | None) -> str:
    return "n/a" if v is None else signed(v)


#: Each comparison block of ``summary.json`` and the optimizer it compares against.
REFERENCES = {"max_throughput_vs_megatron": "megatron", "frontier_vs_perseus": "perseus"}


def na_reason(summary: Mapping, block: str, name: str) -> str:
    """Why ``name`` has no value in comparison ``block``: the method did not run, failed or
    refused the job, its reference (Megatron-LM, Perseus) did not run, failed or refused, or no
    point of the method reaches the reference's time or energy ("not attainable")."""
    from kareus.suite.style import method_style

    def state(n: str) -> str | None:
        obj = summary["optimizers"].get(n)
        if obj is None or obj["status"] == "missing":
            return "not run"
        if obj["status"] != "ok":
            return "refused" if obj.get("refused") else "failed"
        return None

    ref = REFERENCES[block]
    if state(name):
        return str(state(name))
    if state(ref):
        return f"{method_style(ref).label} {state(ref)}"
    return "not attainable"


def _metric(summary: Mapping, block: str, name: str, field: str) -> str:
    """A comparison metric as a signed percentage, or the reason it is missing."""
    m = summary["comparison"][block].get(name)
    value = m.get(field) if m else None
    return _pct(value) if value is not None else na_reason(summary, block, name)


#: The max-throughput table's columns, in order (a method without a plan leaves its cells
#: empty).
MAX_THROUGHPUT_COLUMNS = ("optimizer", "status", "time s", "E kJ", "dyn kJ", "static kJ",
                          "ΔT %", "ΔE %")


def max_throughput_table(summary: Mapping) -> pd.DataFrame:
    """Fastest plan of every optimizer vs Megatron-LM (ΔT %, ΔE %: positive = reduction)."""
    rows = []
    block = "max_throughput_vs_megatron"
    for name, obj in summary["optimizers"].items():
        mt = obj["max_throughput"]
        status = "refused" if obj["status"] != "ok" and obj.get("refused") else obj["status"]
        row = {"optimizer": name, "status": status}
        if mt is not None:
            row.update({"time s": round(mt["time_s"], 4), "E kJ": round(mt["energy_j"] / 1e3, 3),
                        "dyn kJ": round(mt["dynamic_energy_j"] / 1e3, 3),
                        "static kJ": round(mt["static_energy_j"] / 1e3, 3)})
        row["ΔT %"] = _metric(summary, block, name, "time_reduction_pct")
        row["ΔE %"] = _metric(summary, block, name, "energy_reduction_pct")
        rows.append(row)
    return pd.DataFrame(rows, columns=list(MAX_THROUGHPUT_COLUMNS)).astype(object).fillna("")


def frontier_table(summary: Mapping) -> pd.DataFrame:
    """Iso-time energy reduction and iso-energy time reduction vs the Perseus frontier (%)."""
    block = "frontier_vs_perseus"
    return pd.DataFrame([{
        "optimizer": name, "frontier points": len(obj["points"]),
        "iso-time ΔE %": _metric(summary, block, name, "iso_time_energy_reduction_pct"),
        "iso-energy ΔT %": _metric(summary, block, name, "iso_energy_time_reduction_pct"),
    } for name, obj in summary["optimizers"].items()])


#: What the frontier table's missing values mean (printed with it).
NA_NOTE = ("not attainable: no point of the method is as fast as Perseus's fastest (iso-time) "
           "or as frugal as its most frugal (iso-energy); 'Perseus not run' or 'Megatron-LM not "
           "run': the reference is not in this folder")


def comparison_markdown(summary: Mapping) -> str:
    """``comparison.md``: both tables and the failures."""
    w = summary
    lines = [
        f"# {w['workload']} on {w['num_gpus']} x {w['gpu']} ({w['backend']} backend)", "",
        "Parallelism: " + ", ".join(f"{k}={v}" for k, v in w["parallel"].items())
        + f"; layers per stage {w['stage_layers']}.", "",
        "## Max-throughput plan vs Megatron-LM", "",
        "Positive = less time / less energy than Megatron-LM's plan. Energy is one iteration, "
        "whole cluster, static included.", "",
        max_throughput_table(summary).to_markdown(index=False, disable_numparse=True), "",
        "## Frontier vs Perseus", "",
        "Iso-time: at Perseus's fastest point, the least energy of the method's points that are "
        "at least as fast. Iso-energy: at Perseus's lowest-energy point, the least time of the "
        "method's points using no more energy. " + NA_NOTE + ".", "",
        frontier_table(summary).to_markdown(index=False, disable_numparse=True), "",
    ]
    failed = {n: o for n, o in summary["optimizers"].items() if o["status"] != "ok"}
    if failed:
        lines += ["## Failed or refused optimizers", ""] + [
            f"- `{n}`{' (refused the job)' if o.get('refused') else ''}: {o['error']}"
            for n, o in failed.items()] + [""]
    made = sorted({(o["made_by"].get("suite"), o["made_by"].get("git_commit"))
                   for o in summary["optimizers"].values() if o.get("made_by")},
                  key=lambda m: (str(m[0]), str(m[1])))
    if made:
        lines += ["Computed by " + "; ".join(
            f"{suite} at git {commit[:10] if commit else 'unknown'}" for suite, commit in made)
            + " (code hashes of each optimizer in summary.json, `made_by`).", ""]
    choices = {n: o["choice"] for n, o in summary["optimizers"].items() if o.get("choice")}
    for n, c in choices.items():
        lines += [f"{n} picks *{c['label']}*: {c['time_s']:.4f} s, {c['energy_j'] / 1e3:.3f} kJ.",
                  ""]
    return "\n".join(lines)


def _frame_limits(ax, t: pd.Series, e: pd.Series) -> None:  # noqa: ANN001
    """Frame the axes on the frontiers (times ``t`` s, energies ``e`` kJ) with a small margin;
    dominated points far away (e.g. very low power limits) are cut."""
    t_lo, t_hi, e_lo, e_hi = t.min(), t.max(), e.min(), e.max()
    pad_t, pad_e = 0.06 * (t_hi - t_lo) + 2e-3 * t_hi, 0.08 * (e_hi - e_lo) + 2e-3 * e_hi
    ax.set_xlim(t_lo - pad_t, t_hi + pad_t)
    ax.set_ylim(e_lo - pad_e, e_hi + pad_e)


#: How far toward white a dominated plan's colour is blended: opaque, so that thousands of
#: overlapping plans stay a pale cloud instead of stacking into a second, solid curve.
DOMINATED_WHITE = 0.72


def _pale(color: str) -> tuple[float, float, float]:
    """``color`` blended :data:`DOMINATED_WHITE` of the way toward white (opaque RGB)."""
    from matplotlib.colors import to_rgb

    return tuple(c + DOMINATED_WHITE * (1.0 - c) for c in to_rgb(color))


def _draw_frontiers(ax, frame: pd.DataFrame, dominated: bool, scale: float = 1.0) -> list[str]:  # noqa: ANN001
    """Draw every method of ``frame`` (``frontiers.csv`` rows) on ``ax``: dominated points pale
    and unjoined (if ``dominated``; those outside the frame counted in a corner note), the Pareto
    frontier as a line marked every few points, the fastest plan as a large outlined marker (the
    larger ones below, so coinciding methods stay visible). ``scale`` multiplies marker sizes.
    Returns the methods drawn, in order."""
    from matplotlib.colors import to_rgb

    from kareus.suite.style import method_style

    df = frame.assign(energy_kj=frame.energy_j / 1e3)
    names = list(dict.fromkeys(df.optimizer))
    fastest = []
    for name in names:
        st = method_style(name)
        d = df[df.optimizer == name]
        front = d[d.on_frontier].sort_values("time_s")
        if dominated:
            rest = d[~d.on_frontier]
            ax.scatter(rest.time_s, rest.energy_kj, s=5 * scale, marker=st.marker,
                       color=_pale(st.color), linewidths=0, zorder=1, rasterized=True)
        if not front.empty:
            ax.plot(front.time_s, front.energy_kj, "-", color=st.color, alpha=0.9, zorder=3,
                    marker=st.marker, ms=3.2 * scale ** 0.5, markevery=max(1, len(front) // 6),
                    mec="none")
            fastest.append((st, front.time_s.iloc[0], front.energy_kj.iloc[0]))
    for st, t, e in sorted(fastest, key=lambda f: -f[0].size):  # larger first, smaller on top
        ax.scatter([t], [e], s=st.size * scale, marker=st.marker, facecolors=(*to_rgb(st.color),
                   0.22), edgecolors=st.color, linewidths=1.3 * scale ** 0.5,
                   zorder=10 + 100 / st.size)
    front_all = df[df.on_frontier]
    if not front_all.empty:
        _frame_limits(ax, front_all.time_s, front_all.energy_kj)
        if dominated:
            (t_lo, t_hi), (e_lo, e_hi) = ax.get_xlim(), ax.get_ylim()
            outside = int((~df.time_s.between(t_lo, t_hi) | ~df.energy_kj.between(e_lo, e_hi)
                           ).sum())
            if outside:
                ax.text(0.99, 0.99, f"{outside} plan{'s' if outside > 1 else ''} off the axes",
                        transform=ax.transAxes, ha="right", va="top", fontsize=6, color="0.4")
    return names


def _method_handles(names: list[str], explain: bool = True) -> list:
    """Legend handles: one per method (its colour, marker and line), then what the marks mean."""
    from matplotlib.lines import Line2D

    from kareus.suite.style import method_style

    handles = [Line2D([], [], color=method_style(n).color, marker=method_style(n).marker,
                      ms=4.5, lw=1.1, label=method_style(n).label) for n in names]
    if explain:
        handles += [Line2D([], [], color="0.45", marker="o", ms=7, mfc=(0.45, 0.45, 0.45, 0.22),
                           mew=1.3, lw=0, label="fastest plan (max throughput)"),
                    Line2D([], [], color=_pale("0.45"), marker="o", ms=3, lw=0,
                           label="dominated plan")]
    return handles


def plot_frontiers(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Time–energy frontiers of all methods, sized for a paper's column: each method in its own
    colour and marker (:mod:`kareus.suite.style`), Pareto frontiers as lines, dominated plans
    pale and unjoined, the fastest plan of each as a large outlined marker."""
    from matplotlib.figure import Figure

    from kareus.suite.style import COLUMN_IN, figure_style

    with figure_style():
        names = list(dict.fromkeys(frame.optimizer))
        rows = (len(names) + 2 + 1) // 2
        fig = Figure(figsize=(COLUMN_IN, 2.5 + 0.16 * rows), layout="constrained")
        ax = fig.add_subplot()
        if not frame.empty:
            _draw_frontiers(ax, frame, dominated=True)
        ax.set_xlabel("iteration time (s)")
        ax.set_ylabel("energy per iteration (kJ)")
        ax.set_title(title)
        fig.legend(handles=_method_handles(names), loc="outside lower center", ncol=2,
                   frameon=False, handlelength=1.8, columnspacing=1.0)
        _savefig(fig, path)


def _breakdown_rows(summary: Mapping, names: list[str] | None = None
                    ) -> tuple[str | None, list[dict]]:
    """Per method with a max-throughput plan: its time and its dynamic and static energy as
    changes relative to the reference's plan (% of the reference's time and total energy). The
    reference is Megatron-LM, or the first method when Megatron-LM has no plan."""
    plans = {n: o["max_throughput"] for n, o in summary["optimizers"].items()
             if o["max_throughput"] is not None and (names is None or n in names
                                                    or n == "megatron")}
    if not plans:
        return None, []
    ref = "megatron" if "megatron" in plans else next(iter(plans))
    r = plans[ref]
    rows = []
    for name, mt in plans.items():
        if names is not None and name not in names:
            continue
        rows.append({
            "optimizer": name,
            "time_pct": change_pct(r["time_s"], mt["time_s"]),
            "dynamic_pct": 100 * (mt["dynamic_energy_j"] - r["dynamic_energy_j"]) / r["energy_j"],
            "static_pct": 100 * (mt["static_energy_j"] - r["static_energy_j"]) / r["energy_j"],
            "energy_pct": change_pct(r["energy_j"], mt["energy_j"])})
    return ref, rows


def _extent(rows: list[dict], key: str) -> tuple[float, float]:
    """Lowest and highest bar end of ``rows`` for ``key`` (0 included); for the energy, the
    dynamic and static parts stacked on their sides."""
    if key != "energy_pct":
        vals = [r[key] for r in rows]
    else:
        vals = [sum(min(r[k], 0.0) for k in ("dynamic_pct", "static_pct")) for r in rows] + \
            [sum(max(r[k], 0.0) for k in ("dynamic_pct", "static_pct")) for r in rows]
    return min([0.0, *vals]), max([0.0, *vals])


def _diverging(ax, pos: list[float], rows: list[dict], colors: list[str], thick: float,  # noqa: ANN001
               horizontal: bool) -> None:
    """Energy change bars: dynamic (solid) and static (hatched) parts stacked away from zero on
    their own sides, and the net change as a black tick with its value."""
    bar = ax.barh if horizontal else ax.bar
    for p, row, c in zip(pos, rows, colors):
        neg = pos_ = 0.0
        for part, hatch, alpha in (("dynamic_pct", None, 0.9), ("static_pct", "/////", 0.45)):
            v = row[part]
            base = pos_ if v >= 0 else neg
            kw = {"left": base} if horizontal else {"bottom": base}
            bar(p, v, thick, color=c, alpha=alpha, hatch=hatch, edgecolor=c if hatch else "none",
                linewidth=0, **kw)
            if v >= 0:
                pos_ += v
            else:
                neg += v
        net = row["energy_pct"]
        (ax.plot([net, net], [p - thick / 2, p + thick / 2], color="black", lw=1.3, zorder=5)
         if horizontal else
         ax.plot([p - thick / 2, p + thick / 2], [net, net], color="black", lw=1.3, zorder=5))


def plot_breakdown(summary: Mapping, path: Path, title: str) -> None:
    """Each method's max-throughput plan against Megatron-LM's, sized for a paper's column:
    time change (%) and energy change (% of Megatron-LM's energy) split into dynamic (solid) and
    static (hatched) parts, the net change marked and printed."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from kareus.suite.style import COLUMN_IN, figure_style, method_style

    ref, rows = _breakdown_rows(summary)
    with figure_style():
        fig = Figure(figsize=(COLUMN_IN, 1.25 + 0.24 * max(len(rows), 1)), layout="constrained")
        ax_t, ax_e = fig.subplots(1, 2, sharey=True, width_ratios=(1, 1.5))
        y = list(range(len(rows)))[::-1]
        colors = [method_style(r["optimizer"]).color for r in rows]
        ax_t.barh(y, [r["time_pct"] for r in rows], 0.7, color=colors, alpha=0.9)
        _diverging(ax_e, y, rows, colors, 0.7, horizontal=True)
        for ax, key in ((ax_t, "time_pct"), (ax_e, "energy_pct")):
            ax.axvline(0, color="0.3", lw=0.7)
            lo, hi = _extent(rows, key)
            span = max(hi - lo, 1.0)
            ax.set_xlim(lo - (0.65 if lo < 0 else 0.08) * span, hi + 0.5 * span)
            for yy, r in zip(y, rows):
                v = r[key]
                end = _extent([r], key)[1 if v >= 0 else 0]  # beyond the bar on the value's side
                ax.text(end + (0.04 if v >= 0 else -0.04) * span, yy, signed(v),
                        va="center", ha="left" if v >= 0 else "right", fontsize=6.2)
            ax.grid(axis="y", visible=False)
        ax_t.set_yticks(y, [method_style(r["optimizer"]).label for r in rows])
        ax_t.set_xlabel("time change (%)\n< 0: faster")  # the tables' ΔT: its reduction
        ax_e.set_xlabel("energy change (%)\n< 0: less")
        if ref:
            r = summary["optimizers"][ref]["max_throughput"]
            fig.suptitle(f"{title}\nmax-throughput plans vs {method_style(ref).label}'s "
                         f"({r['time_s']:.3g} s, {r['energy_j'] / 1e3:.1f} kJ)")
        fig.legend(handles=[Patch(color="0.35", alpha=0.9, label="dynamic"),
                            Patch(facecolor="0.35", alpha=0.45, hatch="/////", label="static"),
                            Line2D([], [], color="black", marker="|", lw=0, ms=7, mew=1.3,
                                   label="net energy")],
                   loc="outside lower center", ncol=3, frameon=False)
        _savefig(fig, path)


def plot_partition_fit(frame: pd.DataFrame, path: Path, title: str,
                       windows: tuple[tuple[int, int], ...] = ((-1, -1), (0, 6), (2, 6), (2, 4),
                                                              (5, 5), (6, 6))) -> None:
    """Measured (markers) and predicted (lines) partition time over the collective's SM count,
    one panel per threads-per-block value, one colour per window. ``frame`` has columns
    ``overlap_start, overlap_end, comm_sm_number, comm_block_size, measured_s, predicted_s``;
    windows absent from it are skipped."""
    import seaborn as sns
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from kareus.suite.style import PAGE_IN, figure_style

    key = list(zip(frame.overlap_start, frame.overlap_end))
    df = frame.assign(window=[f"({s}, {e})" for s, e in key],
                      keep=[k in set(windows) for k in key])
    df = df[df.keep]
    blocks = sorted(df.comm_block_size.unique())
    order = [f"({s}, {e})" for s, e in windows if f"({s}, {e})" in set(df.window)]
    palette = dict(zip(order, sns.color_palette("tab10", len(order))))
    with figure_style():
        fig = Figure(figsize=(PAGE_IN, 3.2), layout="constrained")
        axes = fig.subplots(1, max(1, len(blocks)), sharey=True, squeeze=False)
        for ax, b in zip(axes[0], blocks):
            sub = df[df.comm_block_size == b].sort_values("comm_sm_number")
            for w in order:
                d = sub[sub.window == w]
                ax.plot(d.comm_sm_number, d.predicted_s * 1e3, color=palette[w], lw=1.2)
                ax.scatter(d.comm_sm_number, d.measured_s * 1e3, color=palette[w], s=9)
            ax.set_title(f"{b} threads per block")
            ax.set_xlabel("SMs given to the all-reduce")
            ax.set_yscale("log")
            ticks = [2, 2.5, 3, 4, 5, 6, 8, 10, 12]
            ax.set_yticks(ticks)
            ax.set_yticklabels([f"{v:g}" for v in ticks])
            ax.minorticks_off()
            ax.set_xticks(sorted(sub.comm_sm_number.unique())[::2])
        axes[0][0].set_ylabel("partition time (ms, log scale)")
        handles = [Line2D([], [], color=palette[w], lw=1.2, marker="o", ms=3.5, label=w)
                   for w in order]
        fig.legend(handles=handles, loc="outside right center", frameon=False,
                   title="window\n(launch, wait)")
        fig.suptitle(title + "\nmarkers: measured (mean of repeats); lines: the fitted "
                     "partition law")
        _savefig(fig, path)


def check_figure_path(path: str | Path, option: str) -> None:
    """Refuse (:class:`~kareus.errors.InputError`, one line) a figure path whose suffix names no
    format matplotlib writes, before any work is done."""
    from matplotlib.backend_bases import FigureCanvasBase

    from kareus.errors import InputError

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in formats:
        raise InputError(f"{option} {str(path)!r}: cannot tell the figure's format from its "
                         f"suffix; use one of {', '.join('.' + f for f in sorted(formats))}")


def _savefig(fig, path: Path) -> None:  # noqa: ANN001
    """Save ``fig`` to ``path`` atomically (the format from its suffix,
    :data:`~kareus.suite.style.DPI` dots per inch)."""
    from kareus.suite.style import DPI

    with atomic_path(path, suffix=path.suffix) as tmp:
        fig.savefig(tmp, dpi=DPI)


def figure_title(summary: Mapping, gpu_overrides: Mapping[str, float] | None = None) -> str:
    """Two lines naming one configuration in its figures: the workload and the job's shape
    (``llama3.2-3b: TP8 PP2, MBS 8 x 8, seq 4096``), then the GPUs, the backend and any preset
    parameter the run changed (``static_power_w 40``), so that figures of one model at several
    shapes or settings tell themselves apart."""
    from workloads.parallel import shape_label

    changed = "".join(f", {k} {v:g}" for k, v in sorted((gpu_overrides or {}).items()))
    return (f"{summary['workload']}: {shape_label(summary['parallel'])}\n"
            f"{summary['num_gpus']} x {summary['gpu']} ({summary['backend']}){changed}")


def write_results(out_dir: Path, summary: Mapping, runs: Mapping[str, OptimizerRun],
                  timings: Mapping | None = None,
                  gpu_overrides: Mapping[str, float] | None = None) -> list[Path]:
    """Write every result file of one comparison; returns the paths written. ``summary.json``
    is written last, so its presence means the cell finished. ``gpu_overrides``: the preset
    parameters the run changed, named in the figures' titles."""
    out_dir = Path(out_dir)
    summary_path = out_dir / store.SUMMARY_JSON
    # the old summary goes first: interrupted below, the folder must not pass for finished
    summary_path.unlink(missing_ok=True)
    frame = frontiers_frame(runs)
    title = figure_title(summary, gpu_overrides)
    paths = [out_dir / name for name in (store.FRONTIERS_CSV, store.COMPARISON_MD,
                                         store.FRONTIERS_PNG, store.BREAKDOWN_PNG)]
    atomic_write_text(paths[0], frame.to_csv(index=False))
    atomic_write_text(paths[1], comparison_markdown(summary))
    plot_frontiers(frame, paths[2], title)
    plot_breakdown(summary, paths[3], title)
    if timings is not None:
        paths.append(out_dir / store.TIMINGS_JSON)
        atomic_write_text(paths[-1], json.dumps(timings, indent=2) + "\n")
    atomic_write_text(summary_path, json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return [summary_path, *paths]


# ---------------------------------------------------------------------------------------------
# Suites: tables and figures across configurations


def write_suite_results(out: Path, summaries: Mapping[str, Mapping], names: list[str], *,
                        title: str, heading: str, own_gpus: list[str],
                        headlines: Mapping[str, float] | None = None) -> None:
    """A suite's files across its configurations (each in ``out/<label>/``, summarised in
    ``summaries``): ``max_throughput.csv`` and ``frontier.csv`` (:func:`suite_tables`),
    ``tables.md`` (the methods the paper compares; the configurations with their own GPU,
    ``own_gpus``; beside the paper's ``headlines`` when given and Kareus ran) and the figures
    ``frontiers_grid.png`` and ``energy_breakdown.png``."""
    out = Path(out)
    mt, fr_, notes = suite_tables(summaries)
    atomic_write_text(out / "max_throughput.csv", mt.to_csv(index=False))
    atomic_write_text(out / "frontier.csv", fr_.to_csv(index=False))
    focus = [n for n in ("perseus", "nanobatch-perseus", "kareus") if n in names]
    mt_cols = ["config"] + [c for n in focus for c in (f"{n} ΔT %", f"{n} ΔE %") if c in mt]
    fr_cols = ["config"] + [c for n in focus if n != "perseus"
                            for c in (f"{n} iso-time ΔE %", f"{n} iso-energy ΔT %") if c in fr_]
    fr_show = fr_[fr_cols].copy()
    if {"nanobatch-perseus iso-time ΔE %", "kareus iso-time ΔE %"} <= set(fr_show.columns):
        fr_show["Kareus ≥ NB-Perseus ≥ Perseus"] = [
            "yes" if all(v is not None and v == v for v in (k1, k2, n1, n2))
            and k1 >= n1 - 1e-9 and k2 >= n2 - 1e-9 and n1 >= 0 and n2 >= 0 else "no"
            for k1, k2, n1, n2 in zip(fr_["kareus iso-time ΔE %"],
                                      fr_["kareus iso-energy ΔT %"],
                                      fr_["nanobatch-perseus iso-time ΔE %"],
                                      fr_["nanobatch-perseus iso-energy ΔT %"])]
    lines = [f"# {heading}", "",
             *([f"Configurations with their own GPU: {'; '.join(own_gpus)}.", ""]
               if own_gpus else []),
             "Every optimizer's numbers are in max_throughput.csv and frontier.csv; the tables "
             "below show the methods the paper compares.", "",
             "## Max-throughput plan vs Megatron-LM (ΔT %, ΔE %; positive = reduction)", "",
             format_pct_table(mt[mt_cols], notes), "",
             "## Frontier vs Perseus (iso-time ΔE %, iso-energy ΔT %)", "",
             NA_NOTE[0].upper() + NA_NOTE[1:] + ".", "",
             format_pct_table(fr_show, notes), ""]
    if headlines is not None and "kareus" in names:
        lines += _headline_lines(fr_, headlines)
    atomic_write_text(out / "tables.md", "\n".join(lines) + "\n")
    frames = {label: pd.read_csv(out / label / "frontiers.csv") for label in summaries}
    plot_suite_frontiers(frames, out / "frontiers_grid.png", title)
    plot_suite_breakdown(summaries, out / "energy_breakdown.png", title)


def _headline_lines(fr_: pd.DataFrame, headlines: Mapping[str, float]) -> list[str]:
    """``tables.md``'s comparison of Kareus's best iso-time and iso-energy reductions (and
    Llama 3.3 70B's, when the suite ran it) with the paper's ``headlines``."""
    k_time = [v for v in fr_.get("kareus iso-time ΔE %", []) if v == v and v is not None]
    k_energy = [v for v in fr_.get("kareus iso-energy ΔT %", []) if v == v and v is not None]
    big = fr_[fr_.config.str.startswith("llama3.3-70b")]
    lines = ["## Beside the paper's headline numbers", "",
             "| metric | Kareus paper (OSDI '26), measured | this suite, simulated |", "|---|---|---|",
             f"| best iso-time energy reduction vs Perseus | up to "
             f"{headlines['iso_time_energy_reduction_pct_max']} % | "
             f"{max(k_time):.1f} % |" if k_time else "",
             f"| best iso-energy time reduction vs Perseus | up to "
             f"{headlines['iso_energy_time_reduction_pct_max']} % | "
             f"{max(k_energy):.1f} % |" if k_energy else ""]
    if not big.empty:
        lines += [
            f"| Llama 3.3 70B iso-time energy reduction | "
            f"{headlines['llama3.3-70b_iso_time_energy_reduction_pct']} % | "
            f"{big['kareus iso-time ΔE %'].iloc[0]:.1f} % |",
            f"| Llama 3.3 70B iso-energy time reduction | "
            f"{headlines['llama3.3-70b_iso_energy_time_reduction_pct']} % | "
            f"{big['kareus iso-energy ΔT %'].iloc[0]:.1f} % |"]
    return lines + [""]


def suite_tables(summaries: Mapping[str, Mapping]
                 ) -> tuple[pd.DataFrame, pd.DataFrame, dict[tuple[str, str], str]]:
    """Max-throughput (ΔT %, ΔE % vs Megatron-LM) and frontier (iso-time ΔE %, iso-energy ΔT %
    vs Perseus) tables, one row per configuration and a column pair per optimizer, and for each
    missing value ``(config, column)`` the reason (:func:`na_reason`)."""
    mt_rows, fr_rows = [], []
    notes: dict[tuple[str, str], str] = {}
    for label, s in summaries.items():
        mt = {"config": label}
        fr_ = {"config": label}
        for name, obj in s["optimizers"].items():
            m = s["comparison"]["max_throughput_vs_megatron"].get(name)
            f = s["comparison"]["frontier_vs_perseus"].get(name)
            if name != "megatron":
                mt[f"{name} ΔT %"] = m["time_reduction_pct"] if m else None
                mt[f"{name} ΔE %"] = m["energy_reduction_pct"] if m else None
            if name != "perseus":
                fr_[f"{name} iso-time ΔE %"] = f["iso_time_energy_reduction_pct"] if f else None
                fr_[f"{name} iso-energy ΔT %"] = f["iso_energy_time_reduction_pct"] if f else None
            if obj["status"] != "ok":
                mt[f"{name} ΔT %"] = mt[f"{name} ΔE %"] = None
            for block, row in (("max_throughput_vs_megatron", mt), ("frontier_vs_perseus", fr_)):
                for col in [c for c in row if c.startswith(f"{name} ") and row[c] is None]:
                    notes[(label, col)] = na_reason(s, block, name)
        mt_rows.append(mt)
        fr_rows.append(fr_)
    return pd.DataFrame(mt_rows), pd.DataFrame(fr_rows), notes


def format_pct_table(df: pd.DataFrame, notes: Mapping[tuple[str, str], str] | None = None) -> str:
    """Markdown with signed one-decimal percentages; a missing value shows its reason from
    ``notes`` (keyed by first-column value and column), else n/a."""
    shown = df.copy()
    notes = notes or {}
    for col in shown.columns[1:]:
        if all(isinstance(v, str) for v in shown[col]):
            continue  # a text column (e.g. yes/no)
        shown[col] = [_pct(float(v)) if v is not None and v == v
                      else notes.get((row, col), "n/a")
                      for row, v in zip(df.iloc[:, 0], shown[col])]
    return shown.to_markdown(index=False, disable_numparse=True)


def plot_suite_frontiers(frames: Mapping[str, pd.DataFrame], path: Path, title: str) -> None:
    """A grid of per-configuration frontier plots at a page's width (three per row): Pareto
    frontiers as lines in each method's style, the fastest plans as outlined markers."""
    from matplotlib.figure import Figure

    from kareus.suite.style import PAGE_IN, figure_style

    n = len(frames)
    cols = min(3, max(n, 1))
    rows = (n + cols - 1) // cols
    order = list(dict.fromkeys(o for f in frames.values() for o in f.optimizer))
    with figure_style():
        fig = Figure(figsize=(PAGE_IN, 0.75 + 1.95 * rows), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False)
        for k, (ax, (label, frame)) in enumerate(zip(axes.ravel(), frames.items())):
            _draw_frontiers(ax, frame[frame.on_frontier], dominated=False, scale=0.75)
            ax.set_title(label)
            if k // cols == rows - 1 or k + cols >= n:
                ax.set_xlabel("iteration time (s)")
            if k % cols == 0:
                ax.set_ylabel("energy / iteration (kJ)")
        for ax in axes.ravel()[n:]:
            ax.axis("off")
        fig.legend(handles=_method_handles(order, explain=False), loc="outside lower center",
                   ncol=min(len(order), 4), frameon=False)
        fig.suptitle(title + ": Pareto frontiers; outlined markers: fastest plans")
        _savefig(fig, path)


def plot_suite_breakdown(summaries: Mapping[str, Mapping], path: Path, title: str,
                         optimizers: tuple[str, ...] = ("perseus", "nanobatch-perseus",
                                                         "kareus")) -> None:
    """Per configuration, each method's max-throughput plan against Megatron-LM's, at a page's
    width: time change (%, top) and energy change (% of Megatron-LM's energy, bottom) split into
    dynamic (solid) and static (hatched) parts, the net change marked."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from kareus.suite.style import PAGE_IN, figure_style, method_style

    labels = list(summaries)
    per = {label: dict((r["optimizer"], r) for r in _breakdown_rows(s, list(optimizers))[1])
           for label, s in summaries.items()}
    present = [o for o in optimizers if any(o in rows for rows in per.values())]
    width = 0.8 / max(len(present), 1)
    with figure_style():
        fig = Figure(figsize=(PAGE_IN, 4.4), layout="constrained")
        ax_t, ax_e = fig.subplots(2, 1, sharex=True)
        for j, name in enumerate(present):
            st = method_style(name)
            idx = [i for i, label in enumerate(labels) if name in per[label]]
            x = [i + (j - (len(present) - 1) / 2) * width for i in idx]
            rows = [per[labels[i]][name] for i in idx]
            ax_t.bar(x, [r["time_pct"] for r in rows], width * 0.92, color=st.color, alpha=0.9)
            flat = [xx for xx, r in zip(x, rows) if abs(r["time_pct"]) < 0.05]
            ax_t.hlines([0.0] * len(flat), [xx - 0.46 * width for xx in flat],
                        [xx + 0.46 * width for xx in flat], color=st.color, lw=2.4, zorder=4)
            _diverging(ax_e, x, rows, [st.color] * len(rows), width * 0.92, horizontal=False)
        for ax in (ax_t, ax_e):
            ax.axhline(0, color="0.3", lw=0.7)
            ax.grid(axis="x", visible=False)
        ax_t.set_ylabel("time change (%)\n< 0: faster")  # against Megatron-LM's: the title
        ax_e.set_ylabel("energy change (%)\n< 0: less")
        ax_e.set_xticks(range(len(labels)), labels, rotation=25, ha="right")
        handles = [Patch(color=method_style(o).color, label=method_style(o).label)
                   for o in present]
        handles += [Patch(color="0.35", alpha=0.9, label="dynamic"),
                    Patch(facecolor="0.35", alpha=0.45, hatch="/////", label="static"),
                    Line2D([], [], color="black", marker="_", lw=0, ms=7, mew=1.3,
                           label="net energy")]
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles),
                   frameon=False)
        fig.suptitle(title + ": max-throughput plans against Megatron-LM's")
        _savefig(fig, path)
