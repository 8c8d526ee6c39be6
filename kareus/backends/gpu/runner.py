"""The torch execution of one GPU-backend job on this process's GPU (one rank of a torchrun job,
or the only process for single-GPU runs).

- **Ranks.** ``rank = stage · (DP · TP) + dp_rank · TP + tp_rank``: TP groups are consecutive
  ranks (one NVLink node), stages follow each other.
- **Communication SMs.** One communicator per (TP group, SM count the plan uses): the same ranks
  with ``ProcessGroupNCCL.Options().config.min_ctas = max_ctas = k`` (NCCL >= 2.17 honours
  per-communicator CTA limits; NCCL's CTAs are its channels, one SM each). Partitions a plan does
  not list use the default communicator (no limit). On gloo (CPU tests) the limit is ignored.
- **Pipeline.** The synchronous 1F1B schedule, Megatron-LM's loop (warm-up forwards, steady
  1F1B, cool-down backwards) with combined ``batch_isend_irecv`` exchanges so no two stages wait
  on each other's sends. The executed order equals :func:`kareus.graph.one_f_one_b`.
- **Clocks.** Before each instruction whose planned clock differs from the current lock, the
  device is synchronized and the new clock locked (through :class:`ClockController`, only with
  clock control allowed); the stage tail (DP gradient all-reduce, AdamW step) runs at the
  card's maximum clock, as the simulator assumes.
- **Measurement.** :func:`kareus.backends.gpu.measure.measure_window` over whole iterations; every
  rank measures its own GPU and writes its JSON (atomically); the backend takes time = max over
  ranks and energy = sum over GPUs.

Not implemented (raise :class:`InputError`): context parallelism (the torch model has no
distributed attention), more GPUs than one node shows.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kareus.atomic import atomic_write_json
from kareus.backends.gpu.clocks import ClockController
from kareus.backends.gpu.device import Device, open_device
from kareus.backends.gpu.engine import ForwardState, GroupComm, NanoCtx, Schedule, StageEngine
from kareus.backends.gpu.measure import (
    ClockSampler,
    CounterMeter,
    Meter,
    WindowResult,
    ZeusMeter,
    measure_window,
)
from kareus.backends.gpu.serialize import Job, check_supported, plan_sms
from kareus.errors import InputError
from kareus.graph import Instruction, IterationGraph, one_f_one_b
from kareus.plan import InstructionPlan, PartitionSchedule
from workloads.graph_builder import build_iteration_graph
from workloads.parallel import Workload
from workloads.torch_model import GPTStage

# ================================================================================ ranks


@dataclass(frozen=True)
class Rank:
    """Where this process sits in the job."""

    rank: int
    world: int
    local_rank: int
    tp: int
    pp: int
    dp: int

    @property
    def stage(self) -> int:
        return self.rank // (self.dp * self.tp)

    @property
    def dp_rank(self) -> int:
        return (self.rank // self.tp) % self.dp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def prev(self) -> int:
        return self.rank - self.dp * self.tp

    @property
    def next(self) -> int:
        return self.rank + self.dp * self.tp

    def tp_ranks(self, stage: int, dp_rank: int) -> list[int]:
        base = stage * self.dp * self.tp + dp_rank * self.tp
        return list(range(base, base + self.tp))

    def dp_ranks(self, stage: int, tp_rank: int) -> list[int]:
        return [stage * self.dp * self.tp + d * self.tp + tp_rank for d in range(self.dp)]


def env_rank() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment (1 process without it)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))


def torch_device(job: Job, local_rank: int) -> torch.device:
    if job.device == "cuda":
        if not torch.cuda.is_available():
            raise InputError("the job asks for CUDA but torch sees no GPU")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device: torch.device, world: int) -> bool:
    """Initialise the default process group (NCCL on GPUs, gloo on CPU); ``True`` if this call
    did it."""
    import torch.distributed as dist

    if world == 1 or dist.is_initialized():
        return False
    if device.type == "cuda":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    dist.barrier()  # the first collective on the world group involves every rank
    return True


def nccl_options(sms: int) -> Any:
    """Process-group options limiting NCCL to ``sms`` CTAs (one SM each)."""
    import torch.distributed as dist

    opts = dist.ProcessGroupNCCL.Options()
    opts.config.min_ctas = int(sms)
    opts.config.max_ctas = int(sms)
    return opts


def make_groups(r: Rank, sms_list: list[int], nccl: bool) -> tuple[GroupComm | None, Any]:
    """The TP communicators of this rank (default + one per SM count) and its DP group. Every
    rank creates every group, in the same order (``torch.distributed.new_group``'s rule)."""
    import torch.distributed as dist

    tp_groups: dict[int | None, Any] = {}
    if r.tp > 1:
        for sms in [None, *sms_list]:
            for stage in range(r.pp):
                for d in range(r.dp):
                    ranks = r.tp_ranks(stage, d)
                    opts = nccl_options(sms) if (nccl and sms is not None) else None
                    g = dist.new_group(ranks, pg_options=opts) if opts is not None else \
                        dist.new_group(ranks)
                    if r.rank in ranks:
                        tp_groups[sms] = g
    dp_group = None
    if r.dp > 1:
        for stage in range(r.pp):
            for t in range(r.tp):
                ranks = r.dp_ranks(stage, t)
                g = dist.new_group(ranks)
                if r.rank in ranks:
                    dp_group = g
    comm = GroupComm(tp_groups, r.tp) if r.tp > 1 else None
    return comm, dp_group


# ================================================================================ the stage


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def build_stage(w: Workload, stage: int, tp_rank: int, device: torch.device, dtype: torch.dtype,
                seed: int, layers: int | None = None, first: bool | None = None,
                last: bool | None = None) -> GPTStage:
    """The stage's modules for one TP rank, weights seeded by (seed, stage, TP rank)."""
    p = w.parallel
    torch.manual_seed(seed * 7919 + 1000 * stage + tp_rank)
    return GPTStage(
        w.model, layers if layers is not None else w.stage_layers()[stage],
        first=(stage == 0) if first is None else first,
        last=(stage == p.pp - 1) if last is None else last,
        tp=p.tp, tp_rank=tp_rank, max_seq=p.seq, dtype=dtype, device=device)


def partition_keys(graph: IterationGraph, stage: int) -> dict[str, list[str]]:
    return {d: [p.key for p in graph.instruction_graphs[(stage, d)].partitions]
            for d in ("forward", "backward")}


def check_against_graph(engine: StageEngine, graph: IterationGraph, stage: int) -> None:
    """The engine's op names per partition and per sequential segment must equal the graph's,
    so launch slots mean the same op everywhere."""
    for d in ("forward", "backward"):
        ig = graph.instruction_graphs[(stage, d)]
        want_seq = [tuple(op.name for op in s.compute) for s in ig.sequential]
        got_seq = engine.op_names(d, False)
        if want_seq != got_seq:
            raise RuntimeError(f"engine/graph mismatch in {ig.name} (sequential): "
                               f"graph {want_seq} vs engine {got_seq}")
        if ig.partitions:
            want = [tuple(op.name for op in p.compute) for p in ig.partitions]
            got = engine.op_names(d, True)
            if want != got:
                raise RuntimeError(f"engine/graph mismatch in {ig.name} (partitions): "
                                   f"graph {want} vs engine {got}")


def schedule_of(ip: InstructionPlan, has_partitions: bool) -> Schedule:
    return Schedule(ip.nanobatched and has_partitions,
                    tuple((k, (s.comm_sms, s.launch_slot, s.wait_after))
                          for k, s in ip.schedules))


class Data:
    """Synthetic token ids and targets of every microbatch (identical on the ranks of a stage,
    fixed across iterations)."""

    def __init__(self, w: Workload, device: torch.device, seed: int) -> None:
        p, v = w.parallel, w.model.vocab
        g = torch.Generator(device=device)
        self.tokens, self.targets = [], []
        for m in range(p.microbatches):
            g.manual_seed(seed * 100_003 + m)
            self.tokens.append(torch.randint(0, v, (p.mbs, p.seq), generator=g, device=device))
            self.targets.append(torch.randint(0, v, (p.mbs, p.seq), generator=g, device=device))


# ================================================================================ the pipeline


class ForeachAdamW:
    """AdamW (decoupled weight decay) with ``torch._foreach_*`` ops; for CPU runs."""

    def __init__(self, params: list[torch.Tensor], lr: float = 1e-6, betas: tuple = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1) -> None:
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        idx = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not idx:
            return
        self.t += 1
        b1, b2 = self.betas
        ps = [self.params[i] for i in idx]
        gs = [self.params[i].grad for i in idx]
        ms, vs = [self.m[i] for i in idx], [self.v[i] for i in idx]
        torch._foreach_mul_(ps, 1 - self.lr * self.wd)
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1 - b2)
        denom = torch._foreach_add(torch._foreach_sqrt(
            torch._foreach_div(vs, 1 - b2 ** self.t)), self.eps)
        torch._foreach_addcdiv_(ps, ms, denom, -self.lr / (1 - b1 ** self.t))


class PipelineRunner:
    """One rank's iterations: 1F1B over its stage with P2P to the neighbours, per-instruction
    clocks, DP gradient all-reduce and an AdamW step."""

    def __init__(self, w: Workload, r: Rank, engine: StageEngine, graph: IterationGraph,
                 plan_of: Callable[[Instruction], InstructionPlan], data: Data,
                 device: torch.device, dtype: torch.dtype, dp_group: Any = None,
                 clocks: ClockController | None = None, max_clock_mhz: float | None = None,
                 optimizer_step: bool = True) -> None:
        self.w, self.r, self.engine, self.graph = w, r, engine, graph
        self.plan_of = plan_of
        self.data, self.device, self.dtype = data, device, dtype
        self.dp_group = dp_group
        self.clocks = clocks
        self.max_clock_mhz = max_clock_mhz
        self.cuda = device.type == "cuda"
        p = w.parallel
        self.shape = (p.mbs, p.seq, w.model.hidden)
        self.has_parts = {d: bool(graph.instruction_graphs[(r.stage, d)].partitions)
                          for d in ("forward", "backward")}
        params = [q for q in engine.stage.parameters() if q.requires_grad]
        self.optim: Any = None
        if optimizer_step:
            # CUDA: torch's fused AdamW. CPU (tests): the same update with foreach ops, since
            # importing torch.optim loads torch._dynamo (seconds per process).
            self.optim = torch.optim.AdamW(params, lr=1e-6, fused=True) if self.cuda \
                else ForeachAdamW(params, lr=1e-6)
        self._clock: float | None = None
        self.executed: list[Instruction] = []
        self._marks: list[tuple[Instruction, Any, Any]] = []
        self._t0: Any = None
        self.losses: list[torch.Tensor] = []

    # ------------------------------------------------------------------ helpers
    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _lock(self, mhz: float | None) -> None:
        if mhz is None or self.clocks is None or not self.clocks.active or mhz == self._clock:
            return
        self.sync()  # the previous instruction finishes at its own clock
        self.clocks.lock(mhz)
        self._clock = mhz

    def _mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _timed(self, ins: Instruction, fn: Callable[[], Any]) -> Any:
        self.executed.append(ins)
        start = self._mark()
        out = fn()
        self._marks.append((ins, start, self._mark()))
        return out

    def instruction_times(self) -> list[tuple[int, str, float, float]]:
        """(microbatch, direction, start s, end s) of the last iteration, from its start (call
        after a synchronize)."""
        out = []
        for ins, a, b in self._marks:
            if self.cuda:
                s, e = self._t0.elapsed_time(a) / 1e3, self._t0.elapsed_time(b) / 1e3
            else:
                s, e = a - self._t0, b - self._t0
            out.append((ins.microbatch, ins.direction, s, e))
        return out

    def _p2p(self, send_prev: torch.Tensor | None = None, recv_prev: bool = False,
             send_next: torch.Tensor | None = None, recv_next: bool = False
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        import torch.distributed as dist

        ops, got_prev, got_next = [], None, None
        if send_prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev.contiguous(), self.r.prev))
        if recv_prev:
            got_prev = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, got_prev, self.r.prev))
        if send_next is not None:
            ops.append(dist.P2POp(dist.isend, send_next.contiguous(), self.r.next))
        if recv_next:
            got_next = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, got_next, self.r.next))
        if ops:
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return got_prev, got_next

    # ------------------------------------------------------------------ instructions
    def _forward(self, m: int, x: torch.Tensor | None) -> ForwardState:
        ins = Instruction(self.r.stage, m, "forward")
        ip = self.plan_of(ins)
        self._lock(ip.clock_mhz)
        inp = self.data.tokens[m] if self.engine.first else x
        tgt = self.data.targets[m] if self.engine.last else None
        sched = schedule_of(ip, self.has_parts["forward"])
        st = self._timed(ins, lambda: self.engine.forward(inp, sched, tgt))  # type: ignore[arg-type]
        if st.loss is not None:
            self.losses.append(st.loss.detach())
        return st

    def _backward(self, m: int, st: ForwardState, g: torch.Tensor | None) -> torch.Tensor | None:
        ins = Instruction(self.r.stage, m, "backward")
        ip = self.plan_of(ins)
        self._lock(ip.clock_mhz)
        sched = schedule_of(ip, self.has_parts["backward"])
        return self._timed(ins, lambda: self.engine.backward(st, sched, g))

    def iteration(self) -> None:
        """One training iteration of this rank (Megatron-LM's 1F1B without interleaving)."""
        import torch.distributed as dist

        self.executed, self._marks, self.losses = [], [], []
        self._t0 = self._mark()
        for q in self.engine.stage.parameters():
            q.grad = None
        S, s, M = self.r.pp, self.r.stage, self.w.parallel.microbatches
        first, last = s == 0, s == S - 1
        warm = min(S - s - 1, M)
        rem = M - warm
        states: deque[ForwardState] = deque()
        fm = bm = 0
        for _ in range(warm):
            x = None if first else self._p2p(recv_prev=True)[0]
            st = self._forward(fm, x)
            fm += 1
            if not last:
                self._p2p(send_next=st.output)
            st.output = None
            states.append(st)
        x = None
        if rem > 0 and not first:
            x = self._p2p(recv_prev=True)[0]
        for i in range(rem):
            st = self._forward(fm, x)
            fm += 1
            g = None if last else self._p2p(send_next=st.output, recv_next=True)[1]
            st.output = None
            states.append(st)
            gin = self._backward(bm, states.popleft(), g)
            bm += 1
            if i == rem - 1:
                if not first:
                    self._p2p(send_prev=gin)
                x = None
            else:
                x = self._p2p(send_prev=None if first else gin, recv_prev=not first)[0]
        for _ in range(warm):
            g = None if last else self._p2p(recv_next=True)[1]
            gin = self._backward(bm, states.popleft(), g)
            bm += 1
            if not first:
                self._p2p(send_prev=gin)
        # stage tail at the maximum clock: TP sync of QK-norm grads, DP gradient sync, step
        self._lock(self.max_clock_mhz)
        self.engine.sync_replicated_grads()
        if self.dp_group is not None:
            works = [dist.all_reduce(q.grad, group=self.dp_group, async_op=True)
                     for q in self.engine.stage.parameters() if q.grad is not None]
            for wk in works:
                wk.wait()
        if self.optim is not None:
            self.optim.step()


# ================================================================================ modes


@dataclass
class _Setup:
    job: Job
    r: Rank
    device: torch.device
    dtype: torch.dtype
    dev: Device
    graph: IterationGraph | None = None


def _meter(s: _Setup) -> Meter:
    """Zeus's monitor over this rank's GPU; the same NVML energy counter read directly through
    ``s.dev`` where zeus is not installed or the monitor cannot start (its CPU/RAPL probing can
    fail in VMs and containers with a partial powercap tree, which says nothing about the GPU)."""
    from kareus.backends.gpu.device import zeus_available

    if not s.job.fake_device and zeus_available():
        try:
            return ZeusMeter([s.r.local_rank])
        except Exception as e:  # noqa: BLE001 -- any zeus init failure; the fallback is equivalent
            print(f"kareus: zeus.monitor.ZeusMonitor failed ({type(e).__name__}: {e}); reading "
                  "NVML's energy counter directly", file=sys.stderr)
    return CounterMeter([s.dev], sync=lambda: _sync(s.device))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree_barrier(s: _Setup) -> tuple[Callable[[int], int] | None, Callable[[], None] | None]:
    if s.r.world == 1:
        return None, None
    import torch.distributed as dist

    def agree(n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64, device=s.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    return agree, dist.barrier


def _measure(s: _Setup, step: Callable[[], None]) -> WindowResult:
    agree, barrier = _agree_barrier(s)
    return measure_window(step, _meter(s), s.job.measure, sync=lambda: _sync(s.device),
                          agree=agree, barrier=barrier,
                          sampler=ClockSampler(None if s.job.fake_device else s.dev))


def _base_result(s: _Setup, clocks: ClockController) -> dict[str, Any]:
    return {"rank": s.r.rank, "world": s.r.world, "stage": s.r.stage, "tp_rank": s.r.tp_rank,
            "dp_rank": s.r.dp_rank, "gpu_index": s.r.local_rank, "gpu_name": s.dev.name(),
            "clocks_locked": clocks.active, "clock_control": clocks.describe()}


def _window_dict(res: WindowResult) -> dict[str, Any]:
    return {"time_s": res.time_s, "energy_j": res.energy_j, "steps": res.steps,
            "sm_clock_mhz": res.sm_clock_mhz}


def run_plan(s: _Setup) -> dict[str, Any]:
    """Mode ``plan``: measure whole iterations of the job's plan."""
    job = s.job
    w, plan = job.workload, job.plan
    assert w is not None and plan is not None
    graph = s.graph or build_iteration_graph(w)
    comm, dp_group = make_groups(s.r, plan_sms(plan), s.device.type == "cuda")
    stage = build_stage(w, s.r.stage, s.r.tp_rank, s.device, s.dtype, job.seed)
    engine = StageEngine(stage, comm, nanobatches=w.parallel.nanobatches,
                         partition_keys=partition_keys(graph, s.r.stage))
    check_against_graph(engine, graph, s.r.stage)
    data = Data(w, s.device, job.seed)
    with ClockController([s.dev], job.allow_clock_control) as clocks:
        runner = PipelineRunner(w, s.r, engine, graph, lambda ins: plan.instructions[ins], data,
                                s.device, s.dtype, dp_group, clocks,
                                max_clock_mhz=s.dev.max_sm_clock_mhz())
        if plan.power_limit_w is not None:
            clocks.set_power_limit(plan.power_limit_w)
        res = _measure(s, runner.iteration)
        runner.sync()
        out = _base_result(s, clocks)
    expected = one_f_one_b(s.r.pp, w.parallel.microbatches)[s.r.stage]
    if runner.executed != expected:  # pragma: no cover - the loop is the schedule
        raise RuntimeError(f"executed order {runner.executed} differs from 1F1B {expected}")
    out.update(_window_dict(res))
    out["power_limit_applied"] = plan.power_limit_w is not None and clocks.active
    out["instruction_times"] = [list(t) for t in runner.instruction_times()]
    out["losses"] = [float(x) for x in runner.losses]
    return out


def _instruction_inputs(s: _Setup, w: Workload, engine: StageEngine
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    p = w.parallel
    g = torch.Generator(device=s.device)
    g.manual_seed(s.job.seed + 17)
    if engine.first:
        x = torch.randint(0, w.model.vocab, (p.mbs, p.seq), generator=g, device=s.device)
    else:
        x = torch.randn((p.mbs, p.seq, w.model.hidden), generator=g, device=s.device,
                        dtype=s.dtype)
    tgt = torch.randint(0, w.model.vocab, (p.mbs, p.seq), generator=g, device=s.device) \
        if engine.last else None
    return x, tgt


def run_instruction(s: _Setup) -> dict[str, Any]:
    """Mode ``instruction``: one forward or backward of one microbatch of one stage, repeated, on
    the stage's TP group (the job's world is TP ranks)."""
    job = s.job
    w = job.workload
    assert w is not None
    graph = s.graph or build_iteration_graph(w)
    ip = InstructionPlan.make(job.clock_mhz, job.nanobatched,
                              {k: PartitionSchedule.from_json(v) for k, v in job.schedules.items()})
    sms = sorted({ps.comm_sms for _, ps in ip.schedules if ps.comm_sms is not None})
    r1 = Rank(s.r.rank, s.r.world, s.r.local_rank, w.parallel.tp, 1, 1)
    comm, _ = make_groups(r1, sms, s.device.type == "cuda")
    stage = build_stage(w, job.stage, r1.tp_rank, s.device, s.dtype, job.seed)
    engine = StageEngine(stage, comm, nanobatches=w.parallel.nanobatches,
                         partition_keys=partition_keys(graph, job.stage))
    check_against_graph(engine, graph, job.stage)
    has_parts = bool(graph.instruction_graphs[(job.stage, job.direction)].partitions)
    sched = schedule_of(ip, has_parts)
    x, tgt = _instruction_inputs(s, w, engine)
    if job.direction == "forward":
        def step() -> None:
            engine.forward(x, sched, tgt)
    else:
        state = engine.forward(x, sched, tgt)
        gout = None if engine.last else torch.randn(
            (w.parallel.mbs, w.parallel.seq, w.model.hidden), device=s.device, dtype=s.dtype)

        def step() -> None:
            engine.backward(state, sched, gout, keep=True)
    with ClockController([s.dev], job.allow_clock_control) as clocks:
        clocks.lock(job.clock_mhz)
        res = _measure(s, step)
        out = _base_result(s, clocks)
    out.update(_window_dict(res))
    return out


def run_partition(s: _Setup) -> dict[str, Any]:
    """Mode ``partition``: one partition (compute of one nanobatch + the other's collective, or
    one compute op of it alone) of a middle layer, at each (clock, SMs, window start, window end)
    point (SMs 0: the library's default).

    A three-layer middle stage is built and run up to the partition once; each measured step
    restores that state and runs the partition only (tapes are kept, collectives run on a zeroed
    scratch copy so repeated all-reduces do not grow the values).
    """
    job = s.job
    w = job.workload
    assert w is not None
    graph = s.graph or build_iteration_graph(w)
    ig = graph.instruction_graphs[(job.stage, job.direction)]
    if not ig.partitions:
        raise InputError("the workload has no partitions (nanobatches = 1)")
    sms = sorted({int(p[1]) for p in job.points if int(p[1]) > 0})
    r1 = Rank(s.r.rank, s.r.world, s.r.local_rank, w.parallel.tp, 1, 1)
    comm, _ = make_groups(r1, sms, s.device.type == "cuda")
    stage = build_stage(w, 1, r1.tp_rank, s.device, s.dtype, job.seed, layers=3, first=False,
                        last=False)
    engine = StageEngine(stage, comm, nanobatches=w.parallel.nanobatches,
                         partition_keys=partition_keys(graph, job.stage))
    sched = Schedule(True, ())
    bench = PartitionBench(engine, job.direction, job.partition_index, sched, s, w, job.op_index)
    rows = []
    with ClockController([s.dev], job.allow_clock_control) as clocks:
        for clock, k, start, end in job.points:
            clocks.lock(clock)
            res = _measure(s, lambda k=int(k), a=int(start), b=int(end): bench.step(
                k or None, a, b))
            rows.append({"clock_mhz": clock, "comm_sms": int(k), "start": int(start),
                         "end": int(end), **_window_dict(res)})
        out = _base_result(s, clocks)
    out["key"] = ig.partitions[job.partition_index].key
    out["rows"] = rows
    return out


class PartitionBench:
    """The state right before one partition of the middle layer of a 3-layer stage, and a step
    that runs that partition (or one op of it) from there."""

    def __init__(self, engine: StageEngine, direction: str, pidx: int, sched: Schedule,
                 s: _Setup, w: Workload, op_index: int | None) -> None:
        self.engine = engine
        p = w.parallel
        gen = torch.Generator(device=s.device)
        gen.manual_seed(s.job.seed + 29)
        x = torch.randn((p.mbs, p.seq, w.model.hidden), generator=gen, device=s.device,
                        dtype=s.dtype)
        if direction == "forward":
            ctxs = [NanoCtx(st={"x": part}) for part in engine._split(x, True)]
            items = engine._items("forward", [0, 1, 2], ctxs, True)
            per_layer = len(items) // 3
            idx = per_layer + pidx
            self._grad = torch.no_grad
        else:
            state = engine.forward(x, sched)
            gout = torch.randn_like(x)
            ctxs, items = engine.backward_items(state, sched, gout, keep=True,
                                                layers=[2, 1, 0])
            per_layer = len(items) // 3
            idx = per_layer + pidx
            self._grad = torch.enable_grad
        with self._grad():
            pending = engine.run_chain(items[:idx], True, sched, flush=False)
        self.seg, self.ctx, _ = items[idx]
        self.scratch = torch.zeros_like(pending) if pending is not None else None
        self.op_index = op_index
        if op_index is not None:  # run the ops before it once, measure it alone
            with self._grad():
                if self.seg.before is not None:
                    self.seg.before(self.ctx)
                for op in self.seg.ops[:op_index]:
                    op.run(self.ctx)
        self._snap = self._snapshot()
        _sync(s.device)

    def _snapshot(self) -> tuple:
        c = self.ctx
        tape = c.tape
        return (dict(c.st), dict(tape.grads) if tape else None,
                dict(tape.entries) if tape else None, dict(c.ar_pairs), dict(c.f_pairs))

    def _restore(self) -> None:
        st, grads, entries, ar, f = self._snap
        c = self.ctx
        c.st = dict(st)
        if c.tape is not None:
            c.tape.grads = dict(grads)
            c.tape.entries = dict(entries)
        c.ar_pairs, c.f_pairs = dict(ar), dict(f)

    def step(self, sms: int | None, slot: int, wait: int | None = None) -> None:
        self._restore()
        with self._grad():
            if self.op_index is not None:
                self.seg.ops[self.op_index].run(self.ctx)
            else:
                self.engine.run_segment(self.seg, self.ctx, self.scratch, sms, slot, wait)


def run_static_power(s: _Setup) -> dict[str, Any]:
    """Mode ``static_power`` (two ranks): rank 0 blocks in a P2P receive while rank 1 sleeps
    through the window, then sends; rank 0's energy over the window / its length is the
    blocked-on-P2P ("static") power, rank 1's the idle power. Repeated ``measure.min_steps``
    times after ``measure.cooldown_s`` each."""
    import torch.distributed as dist

    if s.r.world != 2:
        raise InputError("measuring static power needs exactly 2 GPUs (one blocked in a "
                         "receive, one sleeping peer)")
    cfg = s.job.measure
    meter = _meter(s)
    buf = torch.zeros(1, device=s.device)
    # Warm-up exchange: creates the P2P communicator outside the window.
    if s.r.rank == 0:
        dist.recv(buf, src=1)
    else:
        dist.send(buf, dst=0)
    _sync(s.device)
    trials = []
    with ClockController([s.dev], s.job.allow_clock_control) as clocks:
        for _ in range(max(1, cfg.min_steps)):
            dist.barrier()
            if cfg.cooldown_s > 0:
                time.sleep(cfg.cooldown_s)
            dist.barrier()
            meter.begin()
            if s.r.rank == 0:
                dist.recv(buf, src=1)
                _sync(s.device)  # the GPU sits in the receive kernel until the peer sends
            else:
                time.sleep(cfg.window_s)
                dist.send(buf, dst=0)
                _sync(s.device)
            t, e = meter.end()
            trials.append({"time_s": t, "energy_j": e, "power_w": e / t})
        out = _base_result(s, clocks)
    out["role"] = "blocked_recv" if s.r.rank == 0 else "sleeping_peer"
    out["trials"] = trials
    out["power_w"] = sum(x["power_w"] for x in trials) / len(trials)
    return out


MODES: dict[str, Callable[[_Setup], dict[str, Any]]] = {
    "plan": run_plan, "instruction": run_instruction, "partition": run_partition,
    "static_power": run_static_power,
}


def execute(job: Job, out_dir: str | Path, *, graph: IterationGraph | None = None,
            device_override: Device | None = None) -> dict[str, Any]:
    """Run ``job`` as this process's rank and write ``out_dir/rank<r>.json`` atomically.

    Args:
        graph: The job's iteration graph, if the caller has it (saves a rebuild).
        device_override: Use this device object (tests inject a fake).
    """
    import torch.distributed as dist

    if job.mode not in MODES:
        raise InputError(f"unknown job mode {job.mode!r}; valid: {', '.join(MODES)}")
    rank, world, local_rank = env_rank()
    w = job.workload
    if w is not None:
        check_supported(w)
        p = w.parallel
        want = {"plan": p.num_gpus, "instruction": p.tp, "partition": p.tp}.get(job.mode)
        if want is not None and want != world:
            raise InputError(f"job {job.mode} of {w.name} needs {want} processes, got {world}")
        r = Rank(rank, world, local_rank, p.tp, p.pp if job.mode == "plan" else 1,
                 p.dp if job.mode == "plan" else 1)
    else:
        r = Rank(rank, world, local_rank, 1, world, 1)
    device = torch_device(job, local_rank)
    dtype = _DTYPES[job.dtype]
    dev = device_override or open_device(local_rank, fake=job.fake_device)
    inited = init_distributed(device, world)
    try:
        setup = _Setup(job, r, device, dtype, dev, graph)
        result = MODES[job.mode](setup)
        result["job_mode"] = job.mode
        atomic_write_json(Path(out_dir) / f"rank{rank}.json", result)
        return result
    finally:
        if inited and dist.is_initialized():
            dist.destroy_process_group()
        if device.type == "cuda":
            torch.cuda.empty_cache()
