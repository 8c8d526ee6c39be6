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
from kareus.plugins import Problem
from kareus.suite.harness import OptimizerRun
from kareus.suite.records import frontier_object


def summary_object(problem: Problem, runs: Mapping[str, OptimizerRun],
                   comparison: Mapping[str, object],
                   made_by: Mapping[str, Mapping] | None = None, **meta: object) -> dict:
    """The ``summary.json`` object. ``made_by``: per optimizer, who computed its cell (suite
    version, git commit, code hashes), recorded in its object when given."""
    w, g = problem.workload, problem.graph
    optimizers = {}
    for name, run in runs.items():
        extra = {"made_by": dict(made_by[name])} if made_by and name in made_by else {}
        optimizers[name] = frontier_object(
            workload=w.name, optimizer=name, backend=problem.backend.name, gpu=problem.gpu.name,
            num_gpus=g.num_gpus, gpus_per_stage=g.gpus_per_stage, points=run.frontier,
            status=run.status, error=run.error, evaluated_plans=len(run.points),
            spread_plan_ids=run.spread, choice=run.choice, **extra,
        )
    p = w.parallel
    return {
        "workload": w.name, "backend": problem.backend.name, "gpu": problem.gpu.name,
        "num_gpus": g.num_gpus, "gpus_per_stage": g.gpus_per_stage,
        "parallel": {k: getattr(p, k) for k in ("tp", "cp", "pp", "dp", "mbs", "microbatches",
                                                "seq", "recompute")},
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
    return "n/a" if v is None else f"{v:+.1f}"


#: Each comparison block of ``summary.json`` and the optimizer it compares against.
REFERENCES = {"max_throughput_vs_megatron": "megatron", "frontier_vs_perseus": "perseus"}


def na_reason(summary: Mapping, block: str, name: str) -> str:
    """Why ``name`` has no value in comparison ``block``: the method did not run or failed, its
    reference (Megatron-LM, Perseus) did not run or failed, or no point of the method reaches
    the reference's time or energy ("not attainable")."""
    from kareus.suite.style import method_style

    def state(n: str) -> str | None:
        obj = summary["optimizers"].get(n)
        return "not run" if obj is None or obj["status"] == "missing" else \
            "failed" if obj["status"] != "ok" else None

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


def max_throughput_table(summary: Mapping) -> pd.DataFrame:
    """Fastest plan of every optimizer vs Megatron-LM (ΔT %, ΔE %: positive = reduction)."""
    rows = []
    block = "max_throughput_vs_megatron"
    for name, obj in summary["optimizers"].items():
        mt = obj["max_throughput"]
        row = {"optimizer": name, "status": obj["status"]}
        if mt is not None:
            row.update({"time s": round(mt["time_s"], 4), "E kJ": round(mt["energy_j"] / 1e3, 3),
                        "dyn kJ": round(mt["dynamic_energy_j"] / 1e3, 3),
                        "static kJ": round(mt["static_energy_j"] / 1e3, 3)})
        row["ΔT %"] = _metric(summary, block, name, "time_reduction_pct")
        row["ΔE %"] = _metric(summary, block, name, "energy_reduction_pct")
        rows.append(row)
    return pd.DataFrame(rows)


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
           "or as frugal as its most frugal (iso-energy); 'Perseus not run': the reference is "
           "not in this folder")


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
    failed = {n: o["error"] for n, o in summary["optimizers"].items() if o["status"] != "ok"}
    if failed:
        lines += ["## Failed optimizers", ""] + [f"- `{n}`: {e}" for n, e in failed.items()] + [""]
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


def plot_frontiers(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Time–energy frontiers of all methods on one plot (all points faint, frontiers as lines,
    the max-throughput point of each method as a large marker)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    fig, ax = plt.subplots(figsize=(9, 6))
    if not frame.empty:
        df = frame.assign(energy_kj=frame.energy_j / 1e3)
        order = list(dict.fromkeys(df.optimizer))
        palette = dict(zip(order, sns.color_palette("tab10", len(order))))
        sns.scatterplot(data=df[~df.on_frontier], x="time_s", y="energy_kj", hue="optimizer",
                        hue_order=order, palette=palette, alpha=0.12, s=10, ax=ax, legend=False)
        front = df[df.on_frontier].sort_values("time_s")
        sns.lineplot(data=front, x="time_s", y="energy_kj", hue="optimizer", hue_order=order,
                     palette=palette, marker="o", markersize=4, ax=ax, sort=False,
                     estimator=None)
        fastest = front.loc[front.groupby("optimizer").time_s.idxmin()]
        sns.scatterplot(data=fastest, x="time_s", y="energy_kj", hue="optimizer",
                        hue_order=order, palette=palette, s=140, marker="*", ax=ax, legend=False,
                        edgecolor="black", linewidth=0.6)
        # frame the frontiers; dominated points far away (e.g. very low power limits) are cut
        t_lo, t_hi = front.time_s.min(), front.time_s.max()
        e_lo, e_hi = front.energy_kj.min(), front.energy_kj.max()
        pad_t, pad_e = 0.05 * (t_hi - t_lo) + 1e-3 * t_hi, 0.08 * (e_hi - e_lo) + 1e-3 * e_hi
        ax.set_xlim(t_lo - pad_t, t_hi + pad_t)
        ax.set_ylim(e_lo - pad_e, e_hi + pad_e)
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration, whole cluster (kJ)")
    ax.set_title(title + "\nlines: Pareto frontiers; stars: max-throughput plans; faint dots: dominated plans",
                 fontsize=10)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def plot_breakdown(summary: Mapping, path: Path, title: str) -> None:
    """Stacked dynamic / static energy of each method's max-throughput plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    names, dyn, sta = [], [], []
    for name, obj in summary["optimizers"].items():
        mt = obj["max_throughput"]
        if mt is None:
            continue
        names.append(name)
        dyn.append(mt["dynamic_energy_j"] / 1e3)
        sta.append(mt["static_energy_j"] / 1e3)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names) + 2), 5))
    colors = sns.color_palette("deep", 2)
    ax.bar(names, dyn, label="dynamic", color=colors[0])
    ax.bar(names, sta, bottom=dyn, label="static", color=colors[1])
    for i, (d, s) in enumerate(zip(dyn, sta)):
        ax.text(i, d + s, f"{d + s:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("energy per iteration at the max-throughput plan (kJ)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def plot_partition_fit(frame: pd.DataFrame, path: Path, title: str,
                       windows: tuple[tuple[int, int], ...] = ((-1, -1), (0, 6), (2, 6), (2, 4),
                                                              (5, 5), (6, 6))) -> None:
    """Measured (markers) and predicted (lines) partition time over the collective's SM count,
    one panel per threads-per-block value, one colour per window. ``frame`` has columns
    ``overlap_start, overlap_end, comm_sm_number, comm_block_size, measured_s, predicted_s``;
    windows absent from it are skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    key = list(zip(frame.overlap_start, frame.overlap_end))
    df = frame.assign(window=[f"({s}, {e})" for s, e in key],
                      keep=[k in set(windows) for k in key])
    df = df[df.keep]
    blocks = sorted(df.comm_block_size.unique())
    fig, axes = plt.subplots(1, max(1, len(blocks)), figsize=(6.5 * max(1, len(blocks)), 5),
                             sharey=True, squeeze=False)
    order = [f"({s}, {e})" for s, e in windows if f"({s}, {e})" in set(df.window)]
    palette = dict(zip(order, sns.color_palette("tab10", len(order))))
    for ax, b in zip(axes[0], blocks):
        sub = df[df.comm_block_size == b].sort_values("comm_sm_number")
        for w in order:
            d = sub[sub.window == w]
            ax.plot(d.comm_sm_number, d.predicted_s * 1e3, color=palette[w], lw=1.6,
                    label=f"{w} predicted")
            ax.scatter(d.comm_sm_number, d.measured_s * 1e3, color=palette[w], s=18,
                       label=f"{w} measured")
        ax.set_title(f"{b} threads per block", fontsize=10)
        ax.set_xlabel("SMs given to the all-reduce")
        ax.set_ylabel("partition time (ms, log scale)")
        ax.set_yscale("log")
        ticks = [2, 2.5, 3, 4, 5, 6, 8, 10, 12]
        ax.set_yticks(ticks)
        ax.set_yticklabels([f"{v:g}" for v in ticks])
        ax.minorticks_off()
        ax.set_xticks(sorted(sub.comm_sm_number.unique())[::2])
    handles, labels = axes[0][0].get_legend_handles_labels()
    axes[0][-1].legend(handles, labels, fontsize=7, ncol=2, title="window (launch, wait)",
                       title_fontsize=8)
    fig.suptitle(title + "\nmarkers: measured (mean of repeats); lines: the fitted partition law",
                 fontsize=10)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)


def _savefig(fig, path: Path) -> None:  # noqa: ANN001
    """Save ``fig`` to ``path`` atomically (the format from its suffix)."""
    with atomic_path(path, suffix=path.suffix) as tmp:
        fig.savefig(tmp, dpi=110)


def write_results(out_dir: Path, summary: Mapping, runs: Mapping[str, OptimizerRun],
                  timings: Mapping | None = None) -> list[Path]:
    """Write every result file of one comparison; returns the paths written. ``summary.json``
    is written last, so its presence means the cell finished."""
    out_dir = Path(out_dir)
    frame = frontiers_frame(runs)
    title = (f"{summary['workload']}, {summary['num_gpus']} x {summary['gpu']} "
             f"({summary['backend']})")
    paths = [out_dir / "summary.json", out_dir / "frontiers.csv", out_dir / "comparison.md",
             out_dir / "frontiers.png", out_dir / "energy_breakdown.png"]
    atomic_write_text(paths[1], frame.to_csv(index=False))
    atomic_write_text(paths[2], comparison_markdown(summary))
    plot_frontiers(frame, paths[3], title)
    plot_breakdown(summary, paths[4], title)
    if timings is not None:
        paths.append(out_dir / "timings.json")
        atomic_write_text(paths[-1], json.dumps(timings, indent=2) + "\n")
    atomic_write_text(paths[0], json.dumps(summary, indent=2, sort_keys=False) + "\n")
    return paths


# ---------------------------------------------------------------------------------------------
# Suites: tables and figures across configurations


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
    """A grid of per-configuration frontier plots (Pareto frontiers, max-throughput stars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    n = len(frames)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    order = list(dict.fromkeys(o for f in frames.values() for o in f.optimizer))
    palette = dict(zip(order, sns.color_palette("tab10", len(order))))
    for ax, (label, frame) in zip(axes.ravel(), frames.items()):
        front = frame[frame.on_frontier].sort_values("time_s")
        front = front.assign(energy_kj=front.energy_j / 1e3)
        for name, g in front.groupby("optimizer", sort=False):
            ax.plot(g.time_s, g.energy_kj, "-", color=palette[name], lw=1.6, label=name)
            ax.plot(g.time_s.iloc[0], g.energy_kj.iloc[0], "*", ms=11, color=palette[name],
                    mec="black", mew=0.5)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("iteration time (s)", fontsize=8)
        ax.set_ylabel("energy / iteration (kJ)", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=palette[o], lw=2) for o in order]
    fig.legend(handles, order, loc="lower center", ncol=min(len(order), 7), fontsize=9,
               frameon=False)
    fig.suptitle(title + " — Pareto frontiers, stars = max-throughput plans", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    _savefig(fig, path)
    plt.close(fig)


def plot_suite_breakdown(summaries: Mapping[str, Mapping], path: Path, title: str,
                         optimizers: tuple[str, ...] = ("megatron", "perseus", "nanobatch-perseus",
                                                         "kareus")) -> None:
    """Dynamic and static energy of the max-throughput plans, relative to Megatron-LM's total,
    per configuration and method (stacked bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid")
    labels = list(summaries)
    present = [o for o in optimizers if any(
        o in s["optimizers"] and s["optimizers"][o]["max_throughput"] for s in summaries.values())]
    width = 0.8 / max(len(present), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(labels) + 2), 5.5))
    colors = sns.color_palette("tab10", len(present))
    for j, name in enumerate(present):
        dyn, sta = [], []
        for label in labels:
            s = summaries[label]
            base = s["optimizers"]["megatron"]["max_throughput"]["energy_j"]
            mt = s["optimizers"].get(name, {}).get("max_throughput")
            dyn.append(mt["dynamic_energy_j"] / base if mt else 0)
            sta.append(mt["static_energy_j"] / base if mt else 0)
        x = [i + (j - (len(present) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(x, dyn, width, color=colors[j], label=f"{name} dynamic")
        ax.bar(x, sta, width, bottom=dyn, color=colors[j], alpha=0.45, hatch="//",
               label=f"{name} static")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("energy at the max-throughput plan / Megatron-LM's")
    ax.set_title(title + " — solid: dynamic, hatched: static", fontsize=10)
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    _savefig(fig, path)
    plt.close(fig)
