"""JSON forms of what crosses the process boundary to the GPU workers: the measurement settings
and the job (its workload in :meth:`Workload.to_dict`'s form, its plan in
:meth:`IterationPlan.to_json`'s, its schedules in :meth:`PartitionSchedule.to_json`'s); and the
workload an iteration graph records (:attr:`IterationGraph.job`), so the backend can run a graph
it is handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from kareus.backends.gpu.measure import MeasureConfig
from kareus.errors import InputError
from kareus.graph import Direction, IterationGraph
from kareus.json_types import Json, JsonObject, construct
from kareus.plan import IterationPlan
from workloads.parallel import Workload

# ------------------------------------------------------------------------------- workload


def _object(v: object, what: str) -> Mapping[str, object]:
    if not isinstance(v, Mapping):
        raise InputError(f"{what} must be a JSON object, got {type(v).__name__}")
    return v


def check_supported(w: Workload) -> None:
    """Raise :class:`InputError` for what the GPU backend does not run."""
    if w.parallel.cp > 1:
        raise InputError(
            f"context parallelism (CP={w.parallel.cp}) is not implemented in the GPU backend: "
            "workloads/torch_model.py has no distributed (ring / all-gather) attention; use "
            "--cp 1 or --backend sim")
    p = w.parallel
    if p.sequence_sharded:
        raise InputError(
            "--sequence-parallel is not implemented in the GPU backend: workloads/torch_model.py "
            "all-reduces over TP; leave the flag out, or use --backend sim")
    if p.p2p_scattered and p.pp > 1:
        raise InputError(
            "--scatter-gather-p2p is simulator-only: the GPU backend's runner sends whole "
            "tensors between stages, as Megatron Core does; leave the flag out, or use "
            "--backend sim")
    if p.overlap_tp_grad and p.tp > 1:
        raise InputError(
            "--overlap-tp-grad is simulator-only: the GPU backend's model "
            "(workloads/torch_model.py) runs its TP collectives between the kernels; leave the "
            "flag out, or use --backend sim")
    if p.attention != "flash" or p.elementwise != "fused" or p.cross_entropy != "fused":
        raise InputError(
            f"--attention {p.attention} --elementwise {p.elementwise} --cross-entropy "
            f"{p.cross_entropy} is simulator-only: the GPU backend's model "
            "(workloads/torch_model.py) runs flash attention and fused kernels; use --backend sim")
    flags = [flag for flag, on in (("--distributed-optimizer", p.distributed_optimizer),
                                   ("--overlap-grad-reduce", p.overlap_grad_reduce),
                                   ("--overlap-param-gather", p.overlap_param_gather)) if on]
    if flags and p.grad_sync_ranks > 1:
        raise InputError(
            f"{' '.join(flags)} is simulator-only: the GPU backend's runner all-reduces the "
            "gradients in one piece after the last backward; leave the flag out, or use "
            "--backend sim")


def reduced_workload(name: str, layers: int, *, tp: int | None = None, cp: int | None = None,
                     pp: int | None = None, dp: int | None = None, mbs: int | None = None,
                     seq: int | None = None, microbatches: int | None = None) -> Workload:
    """``name``'s model (a built-in name or a Hugging Face config path) with only ``layers``
    transformer layers (a short GPU check), the parallelism overrides of
    :func:`workloads.make_workload` applied (``None``: the workload's default); keeps the
    model's name."""
    from workloads import make_workload

    base = make_workload(name, tp=tp, cp=cp, pp=pp, dp=dp, mbs=mbs, seq=seq,
                         microbatches=microbatches)
    if layers < base.parallel.pp:
        raise InputError(f"--layers {layers} is fewer than PP={base.parallel.pp} stages")
    model = replace(base.model, layers=int(layers))
    par = replace(base.parallel, layer_split=None)
    return Workload(model=model, parallel=par, name=base.name)


def workload_from_graph(graph: IterationGraph) -> Workload:
    """The workload ``graph`` was built from (:attr:`IterationGraph.job`, which
    :func:`workloads.graph_builder.build_iteration_graph` records); :class:`InputError` for a
    graph that records none (bind the workload to the backend instead)."""
    if not graph.job:
        raise InputError(f"graph {graph.workload!r} records no job to run; pass the workload "
                         "with GPUBackend.bind(workload)")
    return Workload.from_dict(graph.job)


# ------------------------------------------------------------------------------- plans


#: The most CTAs (channels, one SM each) NCCL gives one communicator: its compile-time
#: ``MAXCHANNELS`` (32 or 64 depending on the release); larger ``min_ctas``/``max_ctas`` are
#: capped with only a log line. The smaller value, so that no plan runs with fewer SMs than it
#: names. (Kareus's knob space uses at most 30.)
NCCL_MAX_CTAS = 32


def plan_sms(plan: IterationPlan) -> list[int]:
    """Every communication SM count a plan uses (sorted): one CTA-limited communicator each."""
    return sorted({s.comm_sms for ip in plan.instructions.values() for _, s in ip.schedules
                   if s.comm_sms is not None})


# ------------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Job:
    """One run of the GPU worker.

    Attributes:
        mode: ``"plan"`` (an iteration under a plan), ``"instruction"`` (one instruction type),
            ``"partition"`` (one partition, or one of its ops, at several knob points) or
            ``"static_power"`` (blocked-on-P2P power, two ranks).
        workload: What to run.
        plan: The plan (mode ``plan``).
        measure: Measurement durations.
        allow_clock_control: May the worker lock clocks and set power limits.
        device: ``"cuda"`` or ``"cpu"`` (tests).
        dtype: ``"bfloat16"`` (GPU runs) or ``"float32"``.
        fake_device: Use :class:`~kareus.backends.gpu.device.FakeDevice` (tests, CPU).
        seed: Seed of weights and data.
        stage, direction: The instruction (modes ``instruction`` / ``partition``).
        clock_mhz, nanobatched: How the instruction runs (mode ``instruction``).
        schedules: Partition key -> :meth:`PartitionSchedule.to_json` (mode ``instruction``).
        partition_index: Position of the partition in one layer's chain (mode ``partition``).
        points: ``[clock MHz, SMs, slot]`` to measure (mode ``partition``).
        op_index: Measure only this compute op of the partition (no collective).
    """

    mode: str
    workload: Workload | None = None
    plan: IterationPlan | None = None
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    allow_clock_control: bool = False
    device: str = "cuda"
    dtype: str = "bfloat16"
    fake_device: bool = False
    seed: int = 0
    stage: int = 0
    direction: Direction = "forward"
    clock_mhz: float = 0.0
    nanobatched: bool = False
    schedules: dict[str, JsonObject] = field(default_factory=dict)
    partition_index: int = 0
    points: list[list[float]] = field(default_factory=list)
    op_index: int | None = None

    def to_dict(self) -> JsonObject:
        """The job file's form (field order; the workload, plan and measurement settings in
        their own JSON forms)."""
        d: JsonObject = {}
        for f in fields(self):
            v: Json
            if f.name == "workload":
                v = self.workload.to_dict() if self.workload is not None else None
            elif f.name == "plan":
                v = self.plan.to_json() if self.plan is not None else None
            elif f.name == "measure":
                v = self.measure.to_dict()
            else:
                v = getattr(self, f.name)
            d[f.name] = v
        return d

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "Job":
        """Inverse of :meth:`to_dict`."""
        out = dict(d)
        w = out.get("workload")
        if w is not None:
            out["workload"] = Workload.from_dict(_object(w, "a job's workload"))
        plan = out.get("plan")
        if plan is not None:
            out["plan"] = IterationPlan.from_json(plan)
        out["measure"] = construct(MeasureConfig, _object(out.get("measure", {}),
                                                          "a job's measure"))
        return construct(Job, out)
