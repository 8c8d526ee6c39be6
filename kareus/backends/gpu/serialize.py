"""JSON forms of what crosses the process boundary to the GPU workers: the workload, the
measurement settings and the job (whose plan travels in :meth:`IterationPlan.to_json`'s form,
its schedules in :meth:`PartitionSchedule.to_json`'s); and the inverse of
:func:`build_iteration_graph` (which workload an iteration graph was built from), so the backend
can run a graph it is handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace

from kareus.backends.gpu.measure import MeasureConfig
from kareus.errors import InputError
from kareus.graph import Direction, IterationGraph
from kareus.json_types import Json, JsonObject, construct
from kareus.plan import IterationPlan
from workloads.models import MODELS, ModelSpec
from workloads.parallel import ParallelConfig, Recompute, Workload

# ------------------------------------------------------------------------------- workload


def workload_to_dict(w: Workload) -> JsonObject:
    p: JsonObject = asdict(w.parallel)
    split = w.parallel.layer_split
    if split is not None:
        p["layer_split"] = list(split)
    return {"name": w.name, "model": asdict(w.model), "parallel": p}


def _object(v: object, what: str) -> Mapping[str, object]:
    if not isinstance(v, Mapping):
        raise InputError(f"{what} must be a JSON object, got {type(v).__name__}")
    return v


def workload_from_dict(d: Mapping[str, object]) -> Workload:
    par = dict(_object(d["parallel"], "a workload's parallel"))
    split = par.get("layer_split")
    if split is not None:
        if not isinstance(split, (list, tuple)):
            raise InputError(f"layer_split must be a list, got {split!r}")
        par["layer_split"] = tuple(split)
    name = d.get("name", "")
    if not isinstance(name, str):
        raise InputError(f"a workload's name must be a string, got {name!r}")
    return Workload(model=construct(ModelSpec, _object(d["model"], "a workload's model")),
                    parallel=construct(ParallelConfig, par), name=name)


def check_supported(w: Workload) -> None:
    """Raise :class:`InputError` for what the GPU backend does not run."""
    if w.parallel.cp > 1:
        raise InputError(
            f"context parallelism (CP={w.parallel.cp}) is not implemented in the GPU backend: "
            "workloads/torch_model.py has no distributed (ring / all-gather) attention; use "
            "--cp 1 or --backend sim")
    p = w.parallel
    if p.attention != "flash" or p.elementwise != "fused" or p.cross_entropy != "fused":
        raise InputError(
            f"--attention {p.attention} --elementwise {p.elementwise} --cross-entropy "
            f"{p.cross_entropy} is simulator-only: the GPU backend's model "
            "(workloads/torch_model.py) runs flash attention and fused kernels; use --backend sim")


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


def workload_from_graph(graph: IterationGraph,
                        models: Mapping[str, ModelSpec] | None = None) -> Workload:
    """The workload ``graph`` was built from, read back from its ops and verified by rebuilding.

    Works for the suite's models and those in ``models`` (models by workload name, e.g. of the
    workloads bound to the backend, which may come from a Hugging Face config), any layer count
    (reduced runs) and any TP/CP/PP/DP/MBS/seq/microbatch/recompute setting; raises
    :class:`InputError` otherwise (bind the workload to the backend instead).
    """
    from workloads.graph_builder import build_iteration_graph

    base = (models or {}).get(graph.workload) or MODELS.get(graph.workload)
    if base is None:
        raise InputError(f"the GPU backend cannot tell which model graph {graph.workload!r} "
                         "describes; pass the workload with GPUBackend.bind(workload)")
    layer_split = tuple(graph.instruction_graphs[(s, "forward")].layers
                        for s in range(graph.stages))
    model = replace(base, layers=sum(layer_split))
    ig = graph.instruction_graphs[(0, "forward")]
    ops = [op for seg in ig.sequential for op in seg.compute]
    h = model.hidden
    names = {op.name for op in ops}
    loss = graph.instruction_graphs[(graph.stages - 1, "forward")].extra
    unfused_loss = any(op.name == "cross_entropy_max" for seg in loss for op in seg.compute)
    if unfused_loss or not {"bda", "linear_qkv", "attention"} <= names:
        raise InputError(f"the GPU backend cannot recover the job of graph {graph.workload!r} "
                         "(an eager or unfused one is simulator-only); pass the workload with "
                         "GPUBackend.bind(workload)")
    bda = next(op for op in ops if op.name == "bda")
    t = int(round(bda.bytes / (3 * 2 * h)))  # tokens per GPU of one microbatch
    qkv = next(op for op in ops if op.name == "linear_qkv")
    qkv_n = int(round(qkv.flops / (2.0 * t * h)))
    tp = (model.heads + 2 * model.kv_heads) * model.head_dim // qkv_n
    att = next(op for op in ops if op.name == "attention")
    hq = model.heads // tp
    comms = [seg.comm for seg in ig.sequential if seg.comm is not None]
    cp = next((c.group for c in comms if c.collective == "all_gather"), 1)
    # attention flops = 2 * hq * d * t * seq (causal half, CP share already in t)
    seq = int(round(att.flops / (2.0 * hq * model.head_dim * t)))
    mbs = t * cp // seq
    dp = graph.gpus_per_stage // (tp * cp)
    bwd = graph.instruction_graphs[(0, "backward")]
    recompute: Recompute = "full" if bwd.sequential[0].compute[0].name == "bda" else "none"
    nanobatches = 1
    if ig.partitions:
        half = next(op for p in ig.partitions for op in p.compute if op.name == "bda")
        nanobatches = int(round(bda.bytes / half.bytes))
    for gpn in (8, 16, 4, 2, 1):  # gpus_per_node only flips intra_node flags: try, verify
        par = ParallelConfig(tp=tp, cp=cp, pp=graph.stages, dp=dp, mbs=mbs,
                             microbatches=graph.microbatches, seq=seq, recompute=recompute,
                             nanobatches=nanobatches, gpus_per_node=gpn, layer_split=layer_split)
        try:
            w = Workload(model=model, parallel=par, name=graph.workload)
        except Exception:  # noqa: BLE001 - an impossible candidate
            continue
        if build_iteration_graph(w) == graph:
            auto = replace(par, layer_split=None)
            if Workload(model=model, parallel=auto).stage_layers() == layer_split:
                w = Workload(model=model, parallel=auto, name=graph.workload)
            return w
    raise InputError(f"cannot recover the workload of graph {graph.workload!r} exactly; pass "
                     "it with GPUBackend.bind(workload)")


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
                v = workload_to_dict(self.workload) if self.workload is not None else None
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
            out["workload"] = workload_from_dict(_object(w, "a job's workload"))
        plan = out.get("plan")
        if plan is not None:
            out["plan"] = IterationPlan.from_json(plan)
        out["measure"] = construct(MeasureConfig, _object(out.get("measure", {}),
                                                          "a job's measure"))
        return construct(Job, out)
