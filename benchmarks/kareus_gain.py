"""Kareus's gain at maximum throughput, from the partition up (issue 30, item 4).

    python benchmarks/kareus_gain.py [--workload llama3.2-3b] [--tp 8] [--gpu a100-sxm4-40gb]
                                     [--no-iteration]

Three tables:

- **the shared partition sweep**: the measured best configuration, window (2, 6) with 9 SMs, and
  the overlap launched at the partition's start with 20 SMs, window (0, 6) (1024 threads), and
  each window's time along its SM counts, measured (mean of the sweep's 3 repeats) against the
  simulator (the preset's partition law and the per-op factors of the fit it came from); and what
  launching at op 0 instead of op 2 costs, window (0, 6) minus (2, 6), in time and energy (the
  two GPUs' meter energy), where the law and the sweep part (docs/calibration.md); the
  comparison's gap over neighbouring SM counts, and the steps between neighbouring SM counts
  that the law does not draw (or draws and the sweep does not);
- **the workload's partitions at the top clock**: each distinct partition's time sequential,
  as Nanobatching + Perseus runs it (the collective library's kernel, NCCL's default channels,
  launched at the partition's start), at Kareus's best (clock fixed, over its knob space of
  tuned-kernel SMs, the library's kernel and every launch/wait window), and at the best tuned
  kernel; plus the collective alone on the library's kernel and on 30 tuned SMs;
- **the iteration**: Megatron-LM's, Nanobatching + Perseus's and Kareus's fastest plans, their time
  and energy reductions against Megatron-LM, and which collective kernel and SM count each
  fastest plan's partitions use.

Units: ms, µs, mJ, MB, %. Needs ``../shared/kareus_artifact`` for the first table (skipped without,
and with a ``--gpu`` other than the sweep's own, whose law it would compare with A100 measurements).
"""

from __future__ import annotations

import collections
import click
import numpy as np

from kareus.frontier import change_pct
from kareus.hardware.presets import DEFAULT_GPU, get_preset, partition_op_factors

#: The two configurations of the comparison: (start, end, SMs), 1024 threads per block.
BEST, AT_START = (2, 6, 9), (0, 6, 20)


def partition_comparison(gpu_name: str = DEFAULT_GPU) -> dict[str, object] | None:
    """Measured and simulated time (ms) of the sweep's configurations with 1024-thread blocks,
    by window and SM count; ``None`` without the shared sweep."""
    from kareus.backends.partition_calibration import predict
    from kareus.suite.datasets import artifact_partition_sweep

    gpu = get_preset(gpu_name)
    shared = artifact_partition_sweep(gpu.comm_max_sms)
    if shared is None:
        return None
    spec, part, sweep = shared
    own = partition_op_factors(gpu.name, spec.sha256)
    work = None if own is None else np.array(own.op_work)
    host = None if own is None else np.array(own.op_host)
    t, e = predict(part, sweep.configs, gpu, None, work, host)
    c = sweep.configs
    table: dict[tuple[int, int, int], tuple[float, float]] = {}
    energy: dict[tuple[int, int, int], tuple[float, float]] = {}
    for i in np.flatnonzero(c.threads == 1024):
        key = (int(c.start[i]), int(c.end[i]), int(c.sms[i]))
        table[key] = (1e3 * float(sweep.time_s[i]), 1e3 * float(t[i]))
        energy[key] = (1e3 * float(sweep.energy_j[i]), 1e3 * float(e[i]))
    return {"table": table, "energy_mj": energy, "best": table[BEST], "at_start": table[AT_START]}


def launch_at_start_cost(comparison: dict[str, object]) -> list[dict[str, float]]:
    """What launching the collective at op 0 instead of op 2 costs, by SM count: window (0, 6)
    minus (2, 6), time (µs) and energy (mJ), measured and simulated (1024 threads)."""
    table, energy = comparison["table"], comparison["energy_mj"]
    rows = []
    for k in sorted(k for s, e, k in table if (s, e) == (0, 6)):  # type: ignore[union-attr]
        a, b = (0, 6, k), (2, 6, k)
        rows.append({"sms": k,
                     "time_measured_us": 1e3 * (table[a][0] - table[b][0]),  # type: ignore[index]
                     "time_simulated_us": 1e3 * (table[a][1] - table[b][1]),  # type: ignore[index]
                     "energy_measured_mj": energy[a][0] - energy[b][0],  # type: ignore[index]
                     "energy_simulated_mj": energy[a][1] - energy[b][1]})  # type: ignore[index]
    return rows


def sm_steps(comparison: dict[str, object], *, min_sms: int = 9,
             min_us: float = 15.0) -> list[dict[str, object]]:
    """Steps between neighbouring SM counts where the sweep and the law part: the sweep steps
    and the law does not, or the other way round.

    For every window and every SM count ``k >= min_sms`` (below it most windows still fall by
    tens to hundreds of µs per SM, as the collective speeds up), the change from ``k - 1`` to
    ``k`` SMs, measured and simulated (µs), where the two differ by at least ``min_us``.
    """
    table = comparison["table"]
    rows = []
    for (s, e, k), (meas, sim) in sorted(table.items()):  # type: ignore[union-attr]
        before = table.get((s, e, k - 1))  # type: ignore[union-attr]
        if k < min_sms or before is None:
            continue
        d_meas, d_sim = 1e3 * (meas - before[0]), 1e3 * (sim - before[1])
        if abs(d_meas - d_sim) >= min_us:
            rows.append({"window": (s, e), "sms": k, "measured_us": d_meas,
                         "simulated_us": d_sim})
    return rows


def gap_spread(comparison: dict[str, object], best_sms: range = range(6, 13),
               start_sms: range = range(13, 21)) -> dict[str, object]:
    """The comparison's gap over every pair of window (2, 6) on one of ``best_sms`` and window
    (0, 6) on one of ``start_sms``: measured minus simulated (percentage points), its mean, mean
    absolute, and the largest signed value with its pair ``(best SMs, start SMs)``."""
    table = comparison["table"]

    def gap(side: int, k_best: int, k_start: int) -> float:
        start, best = table[(0, 6, k_start)], table[(2, 6, k_best)]  # type: ignore[index]
        return float(change_pct(best[side], start[side]))

    diff = {(kb, ks): gap(0, kb, ks) - gap(1, kb, ks) for kb in best_sms for ks in start_sms}
    worst = max(diff, key=lambda pair: diff[pair])
    values = np.array(list(diff.values()))
    return {"mean": float(values.mean()), "mean_abs": float(np.abs(values).mean()),
            "max": diff[worst], "max_at": worst, "pairs": len(diff)}


def partition_table(problem: object) -> list[dict[str, object]]:
    """Per distinct partition type of ``problem`` at the top clock: sequential, Nanobatching +
    Perseus's schedule, Kareus's best and the best tuned kernel (µs), and the collective alone."""
    from kareus.optimizer.kareus import partition_space
    from kareus.plan import LIBRARY_DEFAULT

    sim = problem.backend  # type: ignore[attr-defined]
    g = sim.gpu
    rows, seen = [], set()
    for key in sorted(problem.graph.instruction_graphs):  # type: ignore[attr-defined]
        for part in problem.graph.instruction_graphs[key].partitions:  # type: ignore[attr-defined]
            name = part.key.split("/")[0]
            if name in seen or part.comm is None:
                continue
            seen.add(name)
            sp = partition_space(part, problem.knobs)  # type: ignore[attr-defined]
            grid = sim.evaluate_partition(part, np.array([g.clock_max_mhz]), sp.comm_sms,
                                          sp.windows)
            t = 1e6 * grid.time_s[0]
            wins = [tuple(int(x) for x in w) for w in sp.windows]
            ks = [int(k) for k in sp.comm_sms]
            lib = ks.index(LIBRARY_DEFAULT)
            i, j = np.unravel_index(np.argmin(t), t.shape)
            tuned = np.array([k != LIBRARY_DEFAULT for k in ks])
            ti, tj = np.unravel_index(np.argmin(np.where(tuned[:, None], t, np.inf)), t.shape)
            rows.append({
                "partition": name, "bus_MB": part.comm.bus_bytes / 1e6,
                "sequential": float(t[lib, wins.index((-1, -1))]),
                "nb_perseus": float(t[lib, wins.index((0, len(part.compute) - 1))]),
                "kareus": float(t[i, j]), "kareus_sms": ks[i] or f"library ({g.comm_default_sms})",
                "kareus_window": wins[j],
                "tuned": float(t[ti, tj]), "tuned_sms": ks[ti], "tuned_window": wins[tj],
                "library_alone": 1e6 * sim.collective_time(part.comm, g.clock_max_mhz, None),
                "tuned30_alone": 1e6 * sim.collective_time(part.comm, g.clock_max_mhz, 30)})
    return rows


def fastest_plans(problem: object) -> dict[str, dict[str, object]]:
    """Each optimizer's fastest plan: time (s), energy (J) and the collective schedules used."""
    from kareus.plan import PartitionSchedule
    from kareus.plugins import load_optimizer

    g = problem.gpu  # type: ignore[attr-defined]
    out = {}
    for name in ("megatron", "nanobatch-perseus", "kareus"):
        plans = load_optimizer(name).optimize(problem)
        res = [(problem.backend.evaluate_plan(problem.graph, p), p)  # type: ignore[attr-defined]
               for p in plans]
        r, p = min(res, key=lambda x: (x[0].time_s, x[0].energy.total_j))
        used: collections.Counter = collections.Counter()
        for ins, ip in p.instructions.items():
            parts = problem.graph.instruction_graphs[ins.type_key].partitions  # type: ignore
            if not ip.nanobatched or not parts:
                used["instruction run sequentially: library kernel after the compute"] += 1
                continue
            scheds = ip.schedule_map()
            for part in parts:
                s = scheds.get(part.key, PartitionSchedule())
                kernel = (f"library kernel ({g.comm_default_sms} channels)" if s.comm_sms is None
                          else f"tuned kernel, {s.comm_sms} SMs")
                wait = "end" if s.wait_after is None else s.wait_after
                used[f"partition: {kernel}, window ({s.launch_slot}, {wait})"] += 1
        out[name] = {"time_s": r.time_s, "energy_j": r.energy.total_j, "schedules": used}
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--workload", default="llama3.2-3b", show_default=True)
@click.option("--tp", default=8, show_default=True, type=int)
@click.option("--gpu", default=DEFAULT_GPU, show_default=True)
@click.option("--iteration/--no-iteration", default=True, help="Also run the three optimizers.")
def main(workload: str, tp: int, gpu: str, iteration: bool) -> None:
    from kareus.suite.problem import make_problem

    problem = make_problem(workload, gpu=gpu, tp=tp)  # bad input refused before any table
    cmp_ = partition_comparison(gpu) if gpu == DEFAULT_GPU else None
    if gpu != DEFAULT_GPU:
        click.echo(f"partition sweep: measured on {DEFAULT_GPU}, not compared with {gpu}'s law "
                   "(run without --gpu for it)")
    elif cmp_ is None:
        click.echo("partition sweep: ../shared/kareus_artifact absent, skipped")
    else:
        (mb, sb), (ms, ss) = cmp_["best"], cmp_["at_start"]  # type: ignore[misc]
        click.echo("partition sweep, 1024 threads (ms, measured / simulated):")
        click.echo(f"  (2, 6) 9 SMs  {mb:.3f} / {sb:.3f}")
        click.echo(f"  (0, 6) 20 SMs {ms:.3f} / {ss:.3f}   gap: measured {change_pct(mb, ms):+.2f} %,"
                   f" simulated {change_pct(sb, ss):+.2f} %")
        table = cmp_["table"]
        for s, e in ((0, 6), (2, 6), (6, 6)):
            click.echo(f"  ({s}, {e}) by SMs: " + "  ".join(
                f"{k}: {table[(s, e, k)][0]:.3f}/{table[(s, e, k)][1]:.3f}"  # type: ignore[index]
                for k in (4, 6, 9, 12, 15, 20)))
        click.echo("  launching at op 0 instead of op 2, (0, 6) minus (2, 6), measured / simulated:")
        click.echo("    SMs   time (µs)       energy (mJ)")
        for r in launch_at_start_cost(cmp_):
            click.echo(f"    {r['sms']:3.0f}   {r['time_measured_us']:+5.0f} / "
                       f"{r['time_simulated_us']:+5.0f}    {r['energy_measured_mj']:+6.1f} / "
                       f"{r['energy_simulated_mj']:+6.1f}")
        best_sms, start_sms = range(6, 13), range(13, 21)
        spread = gap_spread(cmp_, best_sms, start_sms)
        click.echo(f"  the gap over {spread['pairs']} pairs ((2, 6) on {best_sms[0]}-{best_sms[-1]}"
                   f" SMs, (0, 6) on {start_sms[0]}-{start_sms[-1]}), measured minus simulated:"
                   f" mean {spread['mean']:+.2f} points, mean |.| {spread['mean_abs']:.2f},"
                   f" largest {spread['max']:+.2f} at {spread['max_at']}")
        click.echo("  from 9 SMs, where a step to the next SM count differs by 15 µs or more"
                   " (µs, measured / simulated):")
        for r in sm_steps(cmp_):
            click.echo(f"    {str(r['window']):8s} {r['sms'] - 1:2d} -> {r['sms']:2d} SMs  "
                       f"{r['measured_us']:+5.0f} / {r['simulated_us']:+5.0f}")
    click.echo(f"\n{workload} TP{tp}: partitions at {problem.gpu.clock_max_mhz:.0f} MHz (µs)")
    for r in partition_table(problem):
        click.echo(f"  {r['partition']:14s} all-reduce {r['bus_MB']:.0f} MB bus: sequential "
                   f"{r['sequential']:.0f}, NB+Perseus {r['nb_perseus']:.0f}, Kareus "
                   f"{r['kareus']:.0f} ({r['kareus_sms']}, window {r['kareus_window']}), best "
                   f"tuned {r['tuned']:.0f} ({r['tuned_sms']} SMs); collective alone: library "
                   f"{r['library_alone']:.0f}, tuned 30 SMs {r['tuned30_alone']:.0f}")
    if not iteration:
        return
    plans = fastest_plans(problem)
    base = plans["megatron"]
    click.echo("\nfastest plans against Megatron-LM (their instructions and partitions):")
    for name, p in plans.items():
        click.echo(f"  {name:18s} {p['time_s']:.4f} s  time "
                   f"{change_pct(base['time_s'], p['time_s']):+.1f} %  energy "
                   f"{change_pct(base['energy_j'], p['energy_j']):+.1f} %")
        for what, n in p["schedules"].most_common():  # type: ignore[attr-defined]
            click.echo(f"      {n:4d} x {what}")


if __name__ == "__main__":  # one-line errors and exit statuses, as the kareus commands
    from kareus.exit_status import run_command

    raise SystemExit(run_command(main, None, "kareus_gain.py"))
