"""The real-GPU backend: :class:`GPUBackend` implements the :class:`~kareus.backends.base.Backend`
protocol by running the torch model (:mod:`kareus.backends.gpu.runner`) and measuring it with
NVML's energy counter through zeus.

- ``evaluate_plan``: a whole training iteration under the plan, one process per GPU (in this
  process for one GPU, under ``torchrun`` otherwise); time = max over ranks, energy = sum over
  GPUs, both per iteration over a measurement window.
- ``evaluate_instruction``: one (stage, direction) instruction on the stage's TP group.
- ``evaluate_partition``: one partition of a middle layer over a (clock, SMs, window) grid.

Energy accounting goes through :mod:`kareus.energy` only: a GPU's measured energy minus static
power times the iteration (or op) time is its dynamic energy
(:func:`~kareus.energy.dynamic_from_measured`); the iteration's total is
:func:`~kareus.energy.iteration_energy`, which gives back the measured sum. Static power is the
preset's unless given (e.g. measured with :meth:`GPUBackend.measure_static_power`).

Clock control is off unless ``allow_clock_control=True`` (``--allow-clock-control``): plans then
run at the card's current clocks and :attr:`GPUBackend.clock_note` says so.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from numpy.typing import NDArray

from kareus.backends.base import InstructionCost, IterationResult, PartitionGrid
from kareus.backends.gpu.measure import MeasureConfig, per_gpu_step
from kareus.backends.gpu.results import (
    InstructionResult,
    PartitionResult,
    PlanResult,
    PowerTrial,
    RankResult,
    StaticPowerResult,
    result_from_dict,
)
from kareus.backends.gpu.serialize import (
    NCCL_MAX_CTAS,
    Job,
    check_supported,
    workload_from_graph,
)
from kareus.energy import dynamic_from_measured, iteration_energy
from kareus.errors import InputError, PlanError
from kareus.graph import Direction, Instruction, IterationGraph, Partition
from kareus.hardware.presets import GPUPreset
from kareus.json_types import JsonObject
from kareus.plan import InstructionPlan, IterationPlan, PartitionSchedule
from workloads.parallel import Workload

if TYPE_CHECKING:
    from kareus.backends.gpu.environment import Environment

R = TypeVar("R", bound=RankResult)

_CLOCK_OFF = ("clock control off (no --allow-clock-control): plans run at the GPU's current "
              "clocks; plan clocks and power limits are not applied")
_CLOCK_ON = "clock control on: SM clocks locked per instruction, restored afterwards"


class GPUBackend:
    """Real GPUs of one preset, measured with zeus.

    Args:
        gpu: The preset of the visible GPUs.
        allow_clock_control: Lock SM clocks per instruction and apply power limits (needs root,
            CAP_SYS_ADMIN or the Zeus daemon; refused with :class:`InputError` otherwise).
        static_power_w: Blocked-on-P2P power per GPU (W) used to split measured energy into
            dynamic and static (default: the preset's).
        measure: Measurement durations (default: 2 s warm-up, 5 s window).
        visible_gpus: GPUs on this node.
        device, dtype, fake_device: ``"cuda"``/``"bfloat16"``/``False`` for real runs; tests run
            ``"cpu"``/``"float32"`` with a fake NVML device.
        in_process: Run single-GPU jobs in this process (otherwise always under torchrun).
        timeout_s: Limit of one torchrun job (s).
        seed: Seed of weights and data.
    """

    name = "gpu"

    def __init__(self, gpu: GPUPreset, *, allow_clock_control: bool = False,
                 static_power_w: float | None = None, measure: MeasureConfig | None = None,
                 visible_gpus: int = 1, device: str = "cuda", dtype: str = "bfloat16",
                 fake_device: bool = False, in_process: bool = True,
                 timeout_s: float = 3600.0, seed: int = 0, gpu_name: str = "") -> None:
        self.gpu = gpu
        if static_power_w is not None:
            self.static_power_w = static_power_w
        self.allow_clock_control = allow_clock_control
        self.measure = measure or MeasureConfig()
        self.visible_gpus = visible_gpus
        self.device, self.dtype, self.fake_device = device, dtype, fake_device
        self.in_process = in_process
        self.timeout_s = timeout_s
        self.seed = seed
        self.gpu_name = gpu_name
        self._bound: list[tuple[IterationGraph, Workload]] = []
        #: Per-rank results of the last job, by rank.
        self.last_run: list[RankResult] = []

    @property
    def static_power_w(self) -> float:
        """Blocked-on-P2P power per GPU (W): :attr:`gpu`'s, the one value both this backend's
        dynamic energies and the optimizers' totals use."""
        return self.gpu.static_power_w

    @static_power_w.setter
    def static_power_w(self, watts: float) -> None:
        """Use ``watts`` (e.g. measured) as the static power: :attr:`gpu` becomes the preset with
        it, so energies split here and added back by the optimizers agree."""
        self.gpu = self.gpu.with_overrides(static_power_w=float(watts))

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(cls, gpu: GPUPreset, *, allow_clock_control: bool = False,
               env: Environment | None = None, announce: bool = True,
               accept_unlisted_gpu: bool = False, static_power_w: float | None = None,
               measure: MeasureConfig | None = None, fake_device: bool = False,
               hint: str | None = None) -> "GPUBackend":
        """A backend for the visible GPUs, after checking that they can run ``gpu``: raises
        :class:`InputError` (one line naming what is missing and the fix) without CUDA, without
        zeus/NVML, or when the visible GPU is not the preset's part (``accept_unlisted_gpu``: a
        GPU no preset describes runs with ``gpu``; see ``check_environment``). ``env``: what
        :func:`~kareus.backends.gpu.environment.probe_environment` found (probed here by
        default); ``hint``: how the command goes on without a GPU, ending each refusal
        [``or use --backend sim``]; the other arguments are the constructor's."""
        from kareus.backends.gpu.environment import SIM_HINT, check_environment, probe_environment

        env = env if env is not None else probe_environment()
        name = check_environment(env, gpu, accept_unlisted_gpu=accept_unlisted_gpu,
                                 hint=SIM_HINT if hint is None else hint)
        if allow_clock_control:
            from kareus.backends.gpu.device import open_device
            from kareus.errors import ClockPermissionError

            ok, why = open_device(0, fake=fake_device).control_permission()
            if not ok:
                raise ClockPermissionError(f"--allow-clock-control: {why}")
        backend = cls(gpu, allow_clock_control=allow_clock_control,
                      static_power_w=static_power_w, measure=measure, fake_device=fake_device,
                      visible_gpus=env.cuda_devices, gpu_name=name)
        if announce:
            print(f"gpu backend: {env.cuda_devices} x {name} (preset {gpu.name}); "
                  f"{backend.clock_note}", file=sys.stderr)
        return backend

    @property
    def comm_sms_limit(self) -> int:
        """One past the largest communication SM count a plan may ask for: NCCL gives a
        communicator at most :data:`NCCL_MAX_CTAS` CTAs (one SM each) and caps larger limits
        with only a log line, so the run would silently differ from the plan."""
        return min(self.gpu.sms, NCCL_MAX_CTAS + 1)

    @property
    def clock_note(self) -> str:
        """One line saying whether plan clocks are applied."""
        return _CLOCK_ON if self.allow_clock_control else _CLOCK_OFF

    def describe(self) -> JsonObject:
        """Settings worth reporting next to GPU results."""
        return {"backend": self.name, "gpu": self.gpu.name, "gpu_name": self.gpu_name,
                "clock_control": self.allow_clock_control, "clock_note": self.clock_note,
                "static_power_w": self.static_power_w, "measure": self.measure.to_dict()}

    # ------------------------------------------------------------------ workloads
    def bind(self, workload: Workload) -> IterationGraph:
        """Register ``workload`` so its graph (returned) and partitions can be run."""
        from workloads.graph_builder import build_iteration_graph

        graph = build_iteration_graph(workload)
        self._bound.append((graph, workload))
        return graph

    def workload_for(self, graph: IterationGraph) -> Workload:
        """The workload ``graph`` describes (bound, or the one the graph records); raises
        :class:`InputError` for what the GPU backend cannot run (context parallelism)."""
        w = next((w for g, w in self._bound if g is graph), None) or \
            next((w for g, w in self._bound if g == graph), None)
        if w is None:
            w = workload_from_graph(graph)
            self._bound.append((graph, w))
        check_supported(w)
        return w

    # ------------------------------------------------------------------ running jobs
    def _job(self, mode: str, workload: Workload) -> Job:
        """A job of ``mode`` on ``workload`` with this backend's settings (the mode's own
        fields are set with :func:`dataclasses.replace`)."""
        return Job(mode=mode, workload=workload, measure=self.measure,
                   allow_clock_control=self.allow_clock_control, device=self.device,
                   dtype=self.dtype, fake_device=self.fake_device, seed=self.seed)

    def run_job(self, job: Job, nprocs: int, kind: type[R], graph: IterationGraph | None = None
                ) -> list[R]:
        """Run ``job`` on ``nprocs`` GPUs; returns the per-rank results (each a ``kind``, the
        record of the job's mode), sorted by rank. Nothing is returned unless every rank wrote
        its result."""
        if nprocs > self.visible_gpus:
            raise InputError(f"the job needs {nprocs} GPUs but {self.visible_gpus} are "
                             "visible; lower the parallelism (--tp/--pp/--dp)")
        with tempfile.TemporaryDirectory(prefix="kareus-gpu-") as tmp:
            out = Path(tmp) / "out"
            if nprocs == 1 and self.in_process:
                from kareus.backends.gpu.runner import execute

                with _single_rank_env():
                    execute(job, out, graph=graph)
            else:
                self._torchrun(job, nprocs, Path(tmp), out)
            files = sorted(out.glob("rank*.json"), key=lambda p: int(p.stem[4:])) \
                if out.exists() else []
            if len(files) != nprocs:
                raise RuntimeError(f"GPU job {job.mode}: {len(files)} of {nprocs} ranks "
                                   "reported a result")
            results = [result_from_dict(json.loads(f.read_text()), kind) for f in files]
        self.last_run = list(results)
        return results

    def launch_command(self, nprocs: int, job_path: Path, out: Path) -> list[str]:
        """The command that runs a job file on ``nprocs`` GPUs of this node."""
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={nprocs}", "-m", "kareus.backends.gpu.worker",
                str(job_path), str(out)]

    def _torchrun(self, job: Job, nprocs: int, tmp: Path, out: Path) -> None:
        job_path = tmp / "job.json"
        job_path.write_text(json.dumps(job.to_dict()))
        log_path = tmp / "torchrun.log"
        cmd = self.launch_command(nprocs, job_path, out)
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=self.timeout_s)
            except BaseException:  # timeout, KeyboardInterrupt: stop the workers (they restore)
                _stop(proc)
                raise
        if rc != 0:
            text = log_path.read_text(errors="replace")
            errors = [m.group(1) for ln in text.splitlines()
                      if (m := re.match(r"\s*(?:\[[^\]]*\]:?\s*)?error: (.*)", ln))]
            if errors:  # a worker's one-line InputError (torchrun may prefix "[rankN]:")
                raise InputError(errors[0].strip())
            tail = "\n".join(text.splitlines()[-25:])
            raise RuntimeError(f"GPU job {job.mode} failed (torchrun exit {rc}):\n{tail}")

    # ------------------------------------------------------------------ Backend protocol
    def evaluate_plan(self, graph: IterationGraph, plan: IterationPlan) -> IterationResult:
        """Run and measure one iteration of ``graph`` under ``plan`` (time = max over ranks,
        energy = sum over GPUs; see :mod:`kareus.backends.gpu.backend`)."""
        w = self.workload_for(graph)
        plan.validate(graph, self.gpu, max_comm_sms=self.comm_sms_limit - 1,
                      block_size_settable=False)
        ranks = self.run_job(replace(self._job("plan", w), plan=plan), graph.num_gpus,
                             PlanResult, graph)
        return aggregate_iteration(graph, ranks, self.static_power_w)

    def p2p_times(self, graph: IterationGraph) -> tuple[float, ...]:
        """Zeros: on GPUs the transfers run inside the measured iteration, and instruction
        profiles are taken without them (as Perseus's profiler does)."""
        return (0.0,) * max(graph.stages - 1, 0)

    def first_forward_waits(self, graph: IterationGraph) -> tuple[float, ...]:
        """Zeros: the runner gathers no parameters before a forward (:meth:`check_supported`
        refuses ``--overlap-param-gather``)."""
        return (0.0,) * graph.stages

    def evaluate_instruction(self, graph: IterationGraph, key: tuple[int, Direction],
                             plan: InstructionPlan) -> InstructionCost:
        """Measure one instruction of type ``key`` on its stage's TP group: time (s) and
        dynamic energy per GPU (J)."""
        plan.validate(graph, key, self.gpu, max_comm_sms=self.comm_sms_limit - 1,
                      block_size_settable=False)
        w = self.workload_for(graph)
        job = replace(self._job("instruction", w), stage=key[0], direction=key[1],
                      clock_mhz=plan.clock_mhz, nanobatched=plan.nanobatched,
                      schedules={k: s.to_json() for k, s in plan.schedules})
        ranks = self.run_job(job, w.parallel.tp, InstructionResult, graph)
        t, e = per_gpu_step([r.window for r in ranks])
        return InstructionCost(t, dynamic_from_measured(e, self.static_power_w, t))

    def _find_partition(self, partition: Partition) -> tuple[IterationGraph, Workload, int,
                                                             Direction, int]:
        for g, w in self._bound:
            for (stage, d), ig in sorted(g.instruction_graphs.items()):
                for i, p in enumerate(ig.partitions):
                    if p == partition:
                        return g, w, stage, d, i
        raise InputError(f"partition {partition.key!r} belongs to no workload this backend "
                         "knows; call GPUBackend.bind(workload) (or evaluate a plan of it) first")

    def evaluate_partition(self, partition: Partition, clocks_mhz: NDArray[np.float64],
                           comm_sms: NDArray[np.int64], windows: NDArray[np.int64],
                           block_size: int | None = None) -> PartitionGrid:
        """Measure ``partition`` (of a middle layer, on its stage's TP group) at every
        (clock, SMs, window): time (s) and dynamic energy per GPU (J), arrays ``[F, K, W]``
        (SMs 0: NCCL's default). A partition without a collective is measured once per clock."""
        graph, w, stage, d, idx = self._find_partition(partition)
        check_supported(w)
        f = np.atleast_1d(np.asarray(clocks_mhz, dtype=np.float64))
        k = np.atleast_1d(np.asarray(comm_sms, dtype=np.int64))
        win = np.asarray(windows, dtype=np.int64).reshape(-1, 2)
        n = len(partition.compute)
        if block_size is not None:
            raise PlanError("the GPU backend runs NCCL kernels, whose threads per block cannot "
                            f"be set (got {block_size})")
        for a, b in win.tolist():
            why = PartitionSchedule(None, a, b).problem(n, self.comm_sms_limit - 1)
            if why:
                raise PlanError(f"partition {partition.key}: {why}")
        if partition.comm is not None and (k.min() < 0 or k.max() >= self.comm_sms_limit):
            raise PlanError(f"communication SMs must be in 1..{self.comm_sms_limit - 1} "
                            f"(NCCL runs at most {NCCL_MAX_CTAS} CTAs per communicator; 0: its "
                            f"default), got {k.tolist()}")
        has_comm = partition.comm is not None and w.parallel.tp > 1
        grid = [(c, kk, a, b) for c, kk, (a, b) in
                itertools.product(f.tolist(), k.tolist(), win.tolist())] if has_comm else \
            [(c, int(k[0]), 0, n - 1) for c in f.tolist()]
        job = replace(self._job("partition", w), stage=stage, direction=d, partition_index=idx,
                      points=[list(p) for p in grid])
        ranks = self.run_job(job, w.parallel.tp, PartitionResult, graph)
        t = np.zeros((f.size, k.size, win.shape[0]))
        e = np.zeros_like(t)
        rows = [r.rows for r in ranks]
        for j, (c, kk, a, b) in enumerate(grid):
            tt, ee = per_gpu_step([rr[j].window for rr in rows])
            dyn = dynamic_from_measured(ee, self.static_power_w, tt)
            fi = int(np.flatnonzero(f == c)[0])
            if has_comm:
                ki = int(np.flatnonzero(k == kk)[0])
                wi = int(np.flatnonzero((win[:, 0] == a) & (win[:, 1] == b))[0])
                t[fi, ki, wi], e[fi, ki, wi] = tt, dyn
            else:
                t[fi], e[fi] = tt, dyn
        return PartitionGrid(key=partition.key, clocks_mhz=f, comm_sms=k, windows=win, time_s=t,
                             dynamic_energy_j=e)

    def measure_partition_op(self, partition: Partition, op_index: int, clock_mhz: float
                             ) -> tuple[float, float]:
        """Time (s) and dynamic energy per GPU (J) of one compute op of ``partition`` alone."""
        graph, w, stage, d, idx = self._find_partition(partition)
        if not 0 <= op_index < len(partition.compute):
            raise PlanError(f"op index {op_index} outside 0..{len(partition.compute) - 1}")
        job = replace(self._job("partition", w), stage=stage, direction=d, partition_index=idx,
                      points=[[clock_mhz, 0, 0, len(partition.compute) - 1]], op_index=op_index)
        ranks = self.run_job(job, w.parallel.tp, PartitionResult, graph)
        t, e = per_gpu_step([r.rows[0].window for r in ranks])
        return t, dynamic_from_measured(e, self.static_power_w, t)

    # ------------------------------------------------------------------ static power
    def measure_static_power(self, window_s: float = 5.0, trials: int = 3,
                             cooldown_s: float = 2.0) -> StaticPowerMeasurement:
        """Blocked-on-P2P power the way the Perseus/Kareus authors measured it (two GPUs: one
        blocked in a receive, its peer asleep; energy counter over the window): see
        :class:`StaticPowerMeasurement`. Does not change :attr:`static_power_w`; assign it to
        use the result (that also changes :attr:`gpu`)."""
        job = Job(mode="static_power",
                  measure=MeasureConfig(warmup_s=0, warmup_steps=0, window_s=window_s,
                                        min_steps=trials, cooldown_s=cooldown_s),
                  allow_clock_control=False, device=self.device, dtype=self.dtype,
                  fake_device=self.fake_device, seed=self.seed)
        if self.visible_gpus < 2:
            raise InputError("measuring static power needs 2 GPUs (one blocked in a receive, "
                             f"one sleeping peer); {self.visible_gpus} visible")
        r = self.run_job(job, 2, StaticPowerResult)
        return StaticPowerMeasurement(static_power_w=r[0].power_w, idle_power_w=r[1].power_w,
                                      window_s=window_s, trials=r[0].trials,
                                      gpu_name=r[0].info.gpu_name)


@dataclass(frozen=True)
class StaticPowerMeasurement:
    """What :meth:`GPUBackend.measure_static_power` measured.

    Attributes:
        static_power_w: Mean power of the GPU blocked in a P2P receive (W).
        idle_power_w: Mean power of its sleeping peer (W).
        window_s: Length of each trial's window asked for (s).
        trials: The blocked GPU's windows.
        gpu_name: Its name as NVML reports it.
    """

    static_power_w: float
    idle_power_w: float
    window_s: float
    trials: tuple[PowerTrial, ...]
    gpu_name: str

    def to_dict(self) -> JsonObject:
        return {"static_power_w": self.static_power_w, "idle_power_w": self.idle_power_w,
                "window_s": self.window_s, "trials": [t.to_dict() for t in self.trials],
                "gpu_name": self.gpu_name}


def aggregate_iteration(graph: IterationGraph, ranks: Sequence[PlanResult],
                        static_power_w: float) -> IterationResult:
    """One iteration from per-rank windows: time = max over ranks of window time / iterations;
    each GPU's dynamic energy = its measured energy per iteration minus static power times that
    time; totals through :func:`kareus.energy.iteration_energy` (so the total equals the
    measured sum over GPUs)."""
    if len(ranks) != graph.num_gpus:
        raise RuntimeError(f"{len(ranks)} rank results for {graph.num_gpus} GPUs")
    t = max(r.window.time_per_step_s for r in ranks)
    dyn = {r.info.rank: dynamic_from_measured(r.window.energy_per_step_j, static_power_w, t)
           for r in ranks}
    energy = iteration_energy(sum(dyn.values()), graph.num_gpus, static_power_w, t)
    per_dyn: dict[int, float] = {}
    per_tot: dict[int, float] = {}
    for s in range(graph.stages):
        rs = [r for r in ranks if r.info.stage == s]
        per_dyn[s] = float(np.mean([dyn[r.info.rank] for r in rs]))
        per_tot[s] = float(np.mean([r.window.energy_per_step_j for r in rs]))
    times: dict[Instruction, tuple[float, float]] = {}
    for r in ranks:
        if r.info.tp_rank == 0 and r.info.dp_rank == 0:
            for span in r.instruction_times:
                times[Instruction(r.info.stage, int(span.microbatch), span.direction)] = (
                    float(span.start_s), float(span.end_s))
    return IterationResult(energy=energy, num_gpus=graph.num_gpus,
                           gpus_per_stage=graph.gpus_per_stage, per_gpu_dynamic_j=per_dyn,
                           per_gpu_energy_j=per_tot, instruction_times=times,
                           model_flops=graph.model_flops)


class _single_rank_env:
    """Hide torchrun variables of an enclosing job while running a one-process job here."""

    _KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")

    def __enter__(self) -> None:
        self._saved = {k: os.environ.pop(k) for k in self._KEYS if k in os.environ}

    def __exit__(self, *exc: object) -> None:
        os.environ.update(self._saved)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the torchrun process group (workers restore clocks on SIGTERM), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
