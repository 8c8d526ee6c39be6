"""The simulator held against measured Megatron-LM iteration times (vTrain's ground truth).

vTrain (MICRO '24) measured Megatron-LM GPT training iterations on A100 nodes to validate its own
simulator: 1,440 runs on 2-8 GPUs of one node and 26 runs of a 3.6B model on 64 GPUs
(``shared/vtrain_megatron/``, PROVENANCE.md there). What those runs were, and so how each row
becomes a :class:`~workloads.Workload`:

- Megatron-LM GPT: learned positions, LayerNorm, GELU MLP of 4x the width, 16 (single node) or
  32 (3.6B) heads, GPT-2's 50,257-token vocabulary padded to a multiple of 128·TP.
- fp16, full activation recomputation, 1F1B, one gradient all-reduce after the backward (no
  bucketing), Megatron-LM's core attention without flash attention (``attention="unfused"``)
  and its default cross entropy (``cross_entropy="unfused"``: no loss fusion).
- ``global batch / (micro batch · DP)`` micro-batches per pipeline; layers split evenly.
- A100 SXM GPUs, 8 per node; 800 Gb/s of network per node (vTrain's validation configs), i.e.
  12.5 GB/s per GPU, of which NCCL reaches a fitted share (:data:`VTRAIN_NETWORK`).

:func:`simulate_runs` evaluates Megatron-LM's plan (every instruction at the top clock, nothing
overlapped) of every row; :func:`run_errors` and :func:`accuracy` compare them with the
measurement. The 80 GB A100 preset is assumed (vTrain's PROVENANCE does not say which A100).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from kareus.errors import InputError
from kareus.frontier import change_pct, iso_time_energy_reduction, least_energy, reduction_pct
from kareus.plan import InstructionPlan, IterationPlan
from kareus.progress import SILENT, Progress
from workloads.graph_builder import build_iteration_graph
from workloads.models import ModelSpec
from workloads.parallel import ParallelConfig, Workload

if TYPE_CHECKING:
    from kareus.hardware.presets import GPUPreset
    from kareus.plugins import Problem
    from kareus.suite.harness import OptimizerRun

#: Preset overrides that describe vTrain's cluster rather than the GPU: 800 Gb/s of network per
#: node of 8 GPUs (vTrain's validation configs), one NIC's share per GPU (B/s), and the share of
#: it NCCL reaches there. That share is fitted (``benchmarks/fidelity.py --fit-megatron``) on the
#: 64-GPU runs, where TP16's all-reduces across two nodes pin it: 0.47, against the 0.8 of
#: a DGX A100's 200 Gb/s NICs. Two DGX A100 with the same 8 x 100 Gb/s reached 60 GB/s of ring
#: bus bandwidth in a public nccl-tests run (NVIDIA/nccl#812), 0.6 of the line rate.
VTRAIN_NETWORK = {"network_bw": 800e9 / 8 / 8, "network_efficiency": 0.4663}
#: The preset vTrain's runs are simulated on (assumed: A100 SXM, 80 GB).
VTRAIN_GPU = "a100-sxm4-80gb"
#: Columns of vTrain's ground-truth files.
_COLUMNS = {"global batch": "global_batch", "micro batch": "mbs", "hidden size": "hidden",
            "attention heads": "heads", "# layers": "layers", "sequence length": "seq",
            "tensor parallelism": "tp", "data parallelism": "dp",
            "pipeline parallelism": "pp", "iteration time (ms)": "measured_ms"}
_GPT2_VOCAB = 50257


def load_runs(path: str | Path) -> pd.DataFrame:
    """vTrain's ground-truth CSV with short column names (``global_batch, mbs, hidden, heads,
    layers, seq, tp, dp, pp, measured_ms``) and ``microbatches``; raises :class:`InputError`
    naming missing columns."""
    df = pd.read_csv(path)
    missing = sorted(set(_COLUMNS) - set(df.columns))
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    df = df.rename(columns=_COLUMNS)
    df["microbatches"] = df.global_batch // (df.mbs * df.dp)
    df["model"] = [f"gpt-h{h}-l{n}-s{s}" for h, n, s in zip(df.hidden, df.layers, df.seq)]
    return df.reset_index(drop=True)


def run_workload(row: pd.Series | dict) -> Workload:
    """The workload of one vTrain run (see the module docstring). Where the row has them, a
    ``vocab`` entry replaces GPT-2's vocabulary (which Megatron-LM pads, as the workload
    does: :attr:`~workloads.parallel.Workload.padded_vocab`), ``overlap_grad_reduce``
    overlaps the gradient reduction with the backward (PyTorch's DDP) and
    ``scatter_gather_p2p`` scatters the transfers between stages over the TP ranks (Megatron-LM
    before Megatron Core: :attr:`~workloads.parallel.ParallelConfig.scatter_gather_p2p`)."""
    h, heads, tp = int(row["hidden"]), int(row["heads"]), int(row["tp"])
    vocab = int(row["vocab"]) if "vocab" in row else _GPT2_VOCAB
    model = ModelSpec(
        name=f"gpt-h{h}-l{int(row['layers'])}", hidden=h, heads=heads, kv_heads=heads,
        head_dim=h // heads, ffn=4 * h, layers=int(row["layers"]),
        vocab=vocab, native_seq=int(row["seq"]), mlp="gelu",
        norm="layernorm", rope=False, tied_embeddings=True)
    pp, layers = int(row["pp"]), int(row["layers"])
    parallel = ParallelConfig(
        tp=tp, cp=1, pp=pp, dp=int(row["dp"]), mbs=int(row["mbs"]),
        layer_split=(layers // pp,) * pp if layers % pp == 0 else None,
        microbatches=int(row["microbatches"]), seq=int(row["seq"]), recompute="full",
        nanobatches=1, precision="fp16", attention="unfused", cross_entropy="unfused",
        gpus_per_node=8,
        overlap_grad_reduce=bool(row.get("overlap_grad_reduce", False)),
        scatter_gather_p2p=bool(row.get("scatter_gather_p2p", False)))
    return Workload(model=model, parallel=parallel)


@dataclass(frozen=True)
class RunSet:
    """Measured runs and their iteration graphs, built once for repeated simulation (fits)."""

    runs: pd.DataFrame
    graphs: tuple

    @classmethod
    def build(cls, runs: pd.DataFrame) -> "RunSet":
        return cls(runs, tuple(build_iteration_graph(run_workload(r))
                               for r in runs.to_dict("records")))

    def subset(self, mask: np.ndarray) -> "RunSet":
        idx = np.flatnonzero(mask)
        return RunSet(self.runs.iloc[idx].reset_index(drop=True),
                      tuple(self.graphs[i] for i in idx))


def simulate_runs(runs: RunSet, gpu: "GPUPreset", progress: Progress = SILENT) -> np.ndarray:
    """Simulated iteration time (ms) of Megatron-LM's plan for every run."""
    from kareus.backends.sim import SimulatorBackend

    sim = SimulatorBackend(gpu)
    out = np.empty(len(runs.graphs))
    task = progress.start("simulating measured runs", total=len(runs.graphs))
    for i, g in enumerate(runs.graphs):
        plan = IterationPlan.uniform(g, gpu.clock_max_mhz, label="megatron")
        out[i] = sim.evaluate_plan(g, plan).energy.time_s * 1e3
        task.advance()
    task.done()
    return out


def run_errors(runs: RunSet, simulated_ms: np.ndarray) -> pd.DataFrame:
    """The runs with ``simulated_ms`` and ``error_pct`` (simulated over measured, minus 1)."""
    df = runs.runs.copy()
    df["simulated_ms"] = simulated_ms
    df["error_pct"] = change_pct(df.measured_ms, df.simulated_ms)
    return df


def accuracy(errors: pd.DataFrame) -> dict[str, float]:
    """MAPE, maximum and signed mean of the errors (%), and Spearman's rank correlation of the
    simulated against the measured times among each model's layouts (mean and minimum over the
    models with at least three runs)."""
    from scipy.stats import spearmanr

    rhos = [spearmanr(g.measured_ms, g.simulated_ms).statistic
            for _, g in errors.groupby("model") if len(g) >= 3]
    e = errors.error_pct.to_numpy()
    return {"runs": float(len(e)), "mape_pct": float(np.abs(e).mean()),
            "max_pct": float(np.abs(e).max()), "signed_mean_pct": float(e.mean()),
            "spearman_mean": float(np.mean(rhos)) if rhos else float("nan"),
            "spearman_min": float(np.min(rhos)) if rhos else float("nan")}


#: A run counts as host-bound where the host's issue lengthens its simulated iteration by more
#: than this share of it (:func:`errors_by_regime`).
HOST_BOUND_SHARE = 0.05


def without_host(gpu: "GPUPreset") -> "GPUPreset":
    """``gpu`` behind a host that issues every kernel and collective at once: simulated on it, a
    run takes its GPU's own time."""
    return gpu.with_overrides(host_eager_op_s=0.0, host_issue_call_s=0.0)


def errors_by_regime(errors: pd.DataFrame, gpu_only_ms: np.ndarray) -> pd.DataFrame:
    """Mean signed error (%) and number of runs by tensor-parallel size and regime, given each
    run's simulated time without the host (``gpu_only_ms``, :func:`without_host`):
    ``host-bound`` where the host's issue lengthens the simulated iteration by more than
    :data:`HOST_BOUND_SHARE`, ``GPU-bound`` elsewhere. One column pair per regime."""
    host_share = 1.0 - np.asarray(gpu_only_ms, float) / errors.simulated_ms.to_numpy()
    regime = np.where(host_share > HOST_BOUND_SHARE, "host-bound", "GPU-bound")
    table = (errors.assign(regime=regime).groupby(["tp", "regime"]).error_pct
             .agg(mean_pct="mean", runs="size").unstack("regime"))
    table.columns = [f"{regime} {stat}" for stat, regime in table.columns]
    return table[sorted(table.columns, key=lambda c: (c.split(" ")[0], c))]


def worst(errors: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The ``n`` runs with the largest absolute error, with their layouts."""
    cols = ["model", "tp", "dp", "pp", "mbs", "microbatches", "measured_ms", "simulated_ms",
            "error_pct"]
    return errors.reindex(errors.error_pct.abs().sort_values(ascending=False).index)[cols].head(n)


def simulated_shares(runs: RunSet, gpu: "GPUPreset", rows: list[int]) -> pd.DataFrame:
    """Where the simulator puts the time of the runs at ``rows`` (positions in ``runs``): the
    shares (%) of one micro-batch's forward and backward on the first stage, which ends the
    iteration, spent in GEMMs, attention, memory-bound kernels, collectives and waiting for the
    host (:mod:`kareus.backends.breakdown`), and of the iteration in that stage's waits between
    instructions (the pipeline filling, transfers). Indexed like ``runs.runs``."""
    from kareus.backends.breakdown import time_breakdown
    from kareus.backends.sim import SimulatorBackend
    from kareus.graph import KERNEL_KINDS

    sim = SimulatorBackend(gpu)
    out = {}
    for i in rows:
        g = runs.graphs[i]
        plan = IterationPlan.uniform(g, gpu.clock_max_mhz, label="megatron")
        result = sim.evaluate_plan(g, plan)
        first = time_breakdown(sim, g, plan, result, (0,) * g.stages)[0]
        parts = {k: first.forward_s.get(k, 0.0) + first.backward_s.get(k, 0.0)
                 for k in (*KERNEL_KINDS, "collective", "host_wait")}
        total = sum(first.forward_s.values()) + sum(first.backward_s.values())
        out[runs.runs.index[i]] = {**{f"{k} %": 100 * v / total for k, v in parts.items()},
                                   "waits %": 100 * first.waiting_s / result.time_s}
    return pd.DataFrame.from_dict(out, orient="index")



#: The Perseus authors' measured GPT-3 XL job (shared/perseus_sosp24/measured, PROVENANCE.md):
#: Merak's 1F1B over 4 A100 80 GB PCIe in one node, fp32 with TF32 matmuls (torch 1.10), stages
#: of 6, 6, 7 and 5 blocks, full recomputation; Merak runs Hugging Face's GPT-2 code eagerly
#: (unfused attention, eager elementwise kernels).
PERSEUS_XL_JOB = dict(tp=1, cp=1, pp=4, dp=1, mbs=8, microbatches=128, seq=1024,
                      layer_split=(6, 6, 7, 5), precision="tf32", recompute="full",
                      attention="unfused", elementwise="eager", gpus_per_node=4,
                      make_vocab_size_divisible_by=1)
PERSEUS_XL_GPU = "a100-pcie-80gb"
#: Measured method -> the suite's optimizer that reproduces it.
PERSEUS_XL_METHODS = {"perseus": "perseus", "zeus_global": "zeus-power-limit",
                      "envpipe": "envpipe"}


def savings(time_s: np.ndarray, energy_j: np.ndarray, t0: float, e0: float
            ) -> dict[str, float]:
    """Energy saved (%) against the default plan's ``(t0, e0)``: by the least-energy point within
    +1 % of its time, and by the least-energy point overall (and that point's time change)."""
    t, e = np.asarray(time_s, float), np.asarray(energy_j, float)
    near = iso_time_energy_reduction([t0], [e0], t, e, time_slack=0.01)
    j = least_energy(t, e)
    return {"saved_within_1pct_time_pct": float("nan") if near is None else near,
            "saved_least_energy_pct": reduction_pct(e0, float(e[j])),
            "time_at_least_energy_pct": float(change_pct(t0, t[j]))}


def perseus_xl_comparison(measured_csv: str | Path) -> pd.DataFrame:
    """Each measured method's savings on the Perseus GPT-3 XL job beside the simulator's (the
    suite's optimizer on the same job): one row per method with the measured and simulated
    :func:`savings` and both default plans' iteration time (s) and energy (J)."""
    meas, (t0, e0) = _measured_with_default(measured_csv)
    problem, (st0, se0) = _perseus_xl_problem()
    rows = []
    for method, optimizer in PERSEUS_XL_METHODS.items():
        m = meas[meas.method == method]
        run = _run(optimizer, problem)
        sim = savings([p.time_s for p in run.points], [p.energy_j for p in run.points], st0, se0)
        rows.append({"method": method, "optimizer": optimizer,
                     **{f"measured_{k}": v for k, v in savings(m.time_s, m.energy_j, t0,
                                                               e0).items()},
                     **{f"simulated_{k}": v for k, v in sim.items()},
                     "measured_default_time_s": t0, "simulated_default_time_s": st0,
                     "measured_default_energy_j": e0, "simulated_default_energy_j": se0})
    return pd.DataFrame(rows)


def power_limit_curve(measured_csv: str | Path) -> pd.DataFrame:
    """Zeus's global power limit on the Perseus GPT-3 XL job, limit by limit: the measured and the
    simulated iteration time and energy, each as a change (%) against its own default plan
    (every instruction at the top clock, the card's own limit). One row per limit the
    measurement swept (W, descending); a limit the simulated sweep lacks is left out."""
    meas, (t0, e0) = _measured_with_default(measured_csv)
    problem, (st0, se0) = _perseus_xl_problem()
    run = _run(PERSEUS_XL_METHODS["zeus_global"], problem)
    simulated = {float(run.plans[p.plan_id].power_limit_w or problem.gpu.power_limit_w): p
                 for p in run.points}
    rows = []
    for _, m in meas[meas.method == "zeus_global"].sort_values("knob_mean",
                                                               ascending=False).iterrows():
        limit = float(m.knob_mean)
        if limit not in simulated:
            continue
        p = simulated[limit]
        rows.append({"power_limit_w": limit,
                     "measured_time_pct": change_pct(t0, m.time_s),
                     "simulated_time_pct": change_pct(st0, p.time_s),
                     "measured_energy_pct": change_pct(e0, m.energy_j),
                     "simulated_energy_pct": change_pct(se0, p.energy_j),
                     "measured_power_per_gpu_w": m.energy_j / m.time_s / problem.graph.num_gpus,
                     "simulated_power_per_gpu_w": p.energy_j / p.time_s / problem.graph.num_gpus})
    return pd.DataFrame(rows)


def locked_clock_points(measured_csv: str | Path) -> pd.DataFrame:
    """The measured plans of the Perseus GPT-3 XL job that lock clocks (Perseus's frontier and
    EnvPipe's plan), each simulated at the clocks it ran: every forward (backward) of a stage at
    that stage's mean forward (backward) clock, rounded to the card's clock grid. One row per
    plan: measured and simulated iteration time (s) and energy (J), and each as a change (%)
    against its own default plan."""
    meas, (t0, e0) = _measured_with_default(measured_csv)
    problem, (st0, se0) = _perseus_xl_problem()
    graph, grid = problem.graph, problem.gpu.clock_grid()
    order = [ins for seq in graph.schedule().values() for ins in seq]

    def on_grid(mhz: float) -> float:  # the lockable clock nearest to a stage's mean clock
        return float(grid[np.argmin(np.abs(grid - mhz))])

    rows = []
    for _, m in meas[meas.method.isin(["perseus", "envpipe"])].iterrows():
        fwd = [float(x) for x in str(m.fwd_freq_mean_per_stage).split(";")]
        bwd = [float(x) for x in str(m.bwd_freq_mean_per_stage).split(";")]
        plan = IterationPlan({ins: InstructionPlan.make(on_grid(
            (fwd if ins.direction == "forward" else bwd)[ins.stage])) for ins in order})
        sim = problem.backend.evaluate_plan(graph, plan).energy
        rows.append({"method": m.method, "point": int(m.point),
                     "measured_time_s": float(m.time_s), "simulated_time_s": sim.time_s,
                     "measured_energy_j": float(m.energy_j), "simulated_energy_j": sim.total_j,
                     "measured_time_pct": change_pct(t0, m.time_s),
                     "simulated_time_pct": change_pct(st0, sim.time_s),
                     "measured_energy_pct": change_pct(e0, m.energy_j),
                     "simulated_energy_pct": change_pct(se0, sim.total_j)})
    return pd.DataFrame(rows)


def _measured_with_default(measured_csv: str | Path) -> tuple[pd.DataFrame, tuple[float, float]]:
    """The measured runs and their default plan's mean iteration time (s) and energy (J)."""
    meas = pd.read_csv(measured_csv)
    default = meas[meas.method == "default"]
    return meas, (float(default.time_s.mean()), float(default.energy_j.mean()))


def _perseus_xl_problem() -> tuple["Problem", tuple[float, float]]:
    """The suite's problem for the Perseus GPT-3 XL job and its default plan's simulated
    iteration time (s) and energy (J)."""
    from kareus.suite.problem import make_problem

    problem = make_problem("gpt3-xl", gpu=PERSEUS_XL_GPU, **PERSEUS_XL_JOB)
    base = problem.backend.evaluate_plan(
        problem.graph, IterationPlan.uniform(problem.graph, problem.gpu.clock_max_mhz))
    return problem, (base.energy.time_s, base.energy.total_j)


def _run(optimizer: str, problem: "Problem") -> "OptimizerRun":
    """``optimizer`` run on ``problem`` by the suite's harness; :class:`InputError` if it fails."""
    from kareus.plugins import load_optimizer
    from kareus.suite.harness import run_optimizer

    run = run_optimizer(optimizer, load_optimizer(optimizer), problem)
    if run.error:
        raise InputError(f"{optimizer} failed on the Perseus GPT-3 XL job: {run.error}")
    return run
