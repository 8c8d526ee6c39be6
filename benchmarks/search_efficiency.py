"""Search efficiency: how much of the exact (exhaustive) time vs total-energy hypervolume the
sampling strategies reach, against the share of a partition's configurations they measure.

    python benchmarks/search_efficiency.py [--plot search_efficiency.png] [--json] [--seeds 3]

Partitions of llama3.2-3b and qwen3-1.7b at TP8 and at CP2+TP4 on the a100-sxm4-40gb simulator;
all-reduce partitions search the all-reduce SM counts (``knobs.comm_sms``), all-gather /
reduce-scatter ones the CP collective SM counts (``knobs.cp_comm_sms``). Strategies: ``nsga2``,
``surrogate`` and uniform random sampling (no repeats) as the reference line; each budget
(2-30 % of the space) is a separate run, with seeds 0..n-1, and the table reports means over
partitions and seeds.

Hypervolume reference points, both from the exhaustive result:

- ``front`` (headline, plotted): 1.05 x the nadir of the exact total-energy front (its largest
  time and energy). Only the front's region counts, so missing part of the front shows.
- ``space``: 1.05 x the largest time and total energy over the whole space. The far corner of
  the space dwarfs the front, so even random sampling scores ~0.98 at 2 % and > 0.99 from 5 %.
"""

from __future__ import annotations

import json
import math
import statistics
import time

import click
import numpy as np

from kareus.atomic import check_writable_file
from kareus.graph import Partition
from kareus.optimizer.kareus import partition_space
from kareus.optimizer.search import Evaluator, SearchResult, make_search
from kareus.progress import SILENT, Progress
from kareus.suite.problem import make_problem

GPU = "a100-sxm4-40gb"
#: (workload, label, parallelism overrides, partition keys of stage 0)
CASES = [
    ("llama3.2-3b", "TP8", {}, ("fwd_attn/0", "bwd_mlp/0", "bwd_attn/0")),
    ("llama3.2-3b", "CP2+TP4", {"tp": 4, "cp": 2}, ("fwd_qkv_ar/0", "bwd_o_ag/1", "bwd_qkv_rs/0")),
    ("qwen3-1.7b", "TP8", {}, ("fwd_attn/0", "bwd_attn/0")),
    ("qwen3-1.7b", "CP2+TP4", {"tp": 4, "cp": 2}, ("fwd_ao_ag/0", "bwd_mlp/0")),
]
PERCENTS = (2, 5, 10, 15, 20, 30)
STRATEGIES = ("nsga2", "surrogate", "random")


def _partitions():
    for workload, label, overrides, keys in CASES:
        problem = make_problem(workload, gpu=GPU, **overrides)
        found: dict[str, Partition] = {}
        for (stage, _), ig in problem.graph.instruction_graphs.items():
            if stage == 0:
                found.update({p.key: p for p in ig.partitions if p.key in keys})
        for key in keys:
            part = found[key]
            # the Kareus optimizer's own grid: the collective's SM counts, every window
            yield f"{workload} {label} {key}", problem, part, partition_space(part, problem.knobs)


def _random(ev: Evaluator, budget: int, rng: np.random.Generator) -> SearchResult:
    pick = rng.choice(ev.space.size, min(budget, ev.space.size), replace=False)
    ev.measure(ev.space.all_indices()[pick])
    return ev.result()


def _refs(exact: SearchResult) -> dict[str, tuple[float, float]]:
    f = exact.total_front()
    return {"front": (1.05 * float(exact.time_s[f].max()),
                      1.05 * float(exact.total_energy_j[f].max())),
            "space": (1.05 * float(exact.time_s.max()), 1.05 * float(exact.total_energy_j.max()))}


def measure(seeds: int, percents: tuple[int, ...], progress: Progress = SILENT) -> list[dict]:
    import pymoo.algorithms.moo.nsga2  # noqa: F401  (imports out of the timed searches)
    import sklearn.ensemble  # noqa: F401

    rows = []
    task = progress.start("partitions searched", sum(len(keys) for *_, keys in CASES))
    for label, problem, part, space in _partitions():
        task.advance()
        exact = make_search("exhaustive").search(Evaluator(problem.backend, part, space), None,
                                                 np.random.default_rng(0))
        refs = _refs(exact)
        exact_hv = {k: exact.hypervolume(r) for k, r in refs.items()}
        for pct in percents:
            budget = max(8, math.ceil(pct / 100 * space.size))
            for name in STRATEGIES:
                for seed in range(seeds):
                    ev = Evaluator(problem.backend, part, space)
                    rng = np.random.default_rng(seed)
                    t0 = time.perf_counter()
                    res = _random(ev, budget, rng) if name == "random" else \
                        make_search(name).search(ev, budget, rng)
                    wall = time.perf_counter() - t0
                    rows.append({
                        "partition": label, "space": space.size, "percent": pct,
                        "budget": budget, "evaluations": res.evaluations, "strategy": name,
                        "seed": seed, "wall_s": wall,
                        **{f"hv_{k}": res.hypervolume(r) / exact_hv[k] for k, r in refs.items()},
                    })
    task.done()
    return rows


def _summary(rows: list[dict], percents: tuple[int, ...]) -> dict:
    out: dict = {}
    for name in STRATEGIES:
        out[name] = {}
        for pct in percents:
            sel = [r for r in rows if r["strategy"] == name and r["percent"] == pct]
            out[name][pct] = {
                "hv_front_mean": statistics.fmean(r["hv_front"] for r in sel),
                "hv_front_min": min(r["hv_front"] for r in sel),
                "hv_space_mean": statistics.fmean(r["hv_space"] for r in sel),
                "wall_s_mean": statistics.fmean(r["wall_s"] for r in sel),
                "runs": len(sel),
            }
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--seeds", default=3, show_default=True, type=click.IntRange(min=1),
              help="Seeds per partition and budget.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print every run and the means as JSON.")
def main(seeds: int, plot: str | None, as_json: bool) -> None:
    from kareus.suite.progress import terminal_progress

    if plot is not None:
        plot = str(check_writable_file(plot, "--plot"))
    t0 = time.perf_counter()
    with terminal_progress() as progress:
        rows = measure(seeds, PERCENTS, progress)
    summary = _summary(rows, PERCENTS)
    if as_json:
        click.echo(json.dumps({"gpu": GPU, "percents": PERCENTS, "seeds": seeds,
                               "summary": summary, "runs": rows}, indent=2))
    else:
        parts = sorted({(r["partition"], r["space"]) for r in rows})
        click.echo(f"{len(parts)} partitions ({min(s for _, s in parts)}-"
                   f"{max(s for _, s in parts)} configurations), {seeds} seeds; fraction of the "
                   f"exact time vs total-energy hypervolume, mean over partitions and seeds")
        for ref, title in (("front", "reference 1.05 x exact front nadir (min over runs)"),
                           ("space", "reference 1.05 x whole-space maxima")):
            click.echo(f"\n{title}")
            click.echo(f"{'strategy':10s} " + " ".join(f"{p:>13d}%" for p in PERCENTS)
                       + f" {'wall s @15%':>12s}")
            for name in STRATEGIES:
                cells = []
                for p in PERCENTS:
                    s = summary[name][p]
                    cells.append(f"{s['hv_front_mean']:.4f} ({s['hv_front_min']:.3f})"
                                 if ref == "front" else f"{s['hv_space_mean']:14.4f}")
                wall = summary[name][15]["wall_s_mean"] if 15 in PERCENTS else float("nan")
                click.echo(f"{name:10s} " + " ".join(f"{c:>14s}" for c in cells)
                           + f" {wall:12.3f}")
        click.echo(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if plot:
        _plot(rows, plot, seeds)


def _plot(rows: list[dict], path: str, seeds: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    df = pd.DataFrame(rows)
    n_parts = df.partition.nunique()
    sns.set_theme(style="whitegrid")
    fig, ax = plt.subplots(figsize=(8, 5))
    sns.lineplot(data=df, x="percent", y="hv_front", hue="strategy", hue_order=STRATEGIES,
                 style="strategy", markers=True, dashes=False, errorbar=("pi", 50), ax=ax)
    ax.axhline(0.99, color="grey", linestyle="--", linewidth=1)
    ax.axvline(15, color="grey", linestyle=":", linewidth=1)
    ax.text(15.3, ax.get_ylim()[0] + 0.01 * np.ptp(ax.get_ylim()), "15 %", color="grey",
            fontsize=9)
    ax.text(0.5, 0.991, "0.99", color="grey", fontsize=9, va="bottom")
    ax.set_xlabel("% of the partition's configurations evaluated")
    ax.set_ylabel("fraction of exact total-energy hypervolume")
    ax.set_title(f"Search efficiency on the simulator ({n_parts} partitions x {seeds} seeds; "
                 "mean, band = middle 50 %)\nreference point: 1.05 x nadir of the exact "
                 "time vs total-energy front", fontsize=10)
    ax.set_xticks(sorted(df.percent.unique()))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "search_efficiency.py"))
