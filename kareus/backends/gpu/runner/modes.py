"""The job modes (``plan``, ``instruction``, ``partition``, ``static_power``), their measurement
windows, and :func:`execute`, which runs one job as this process's rank and writes its JSON.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ContextManager

import torch

from kareus.atomic import atomic_write_json
from kareus.backends.gpu.clocks import ClockController
from kareus.backends.gpu.device import Device, open_device
from kareus.backends.gpu.engine import NanoCtx, Schedule, StageEngine
from kareus.backends.gpu.measure import (
    ClockSampler,
    CounterMeter,
    Meter,
    WindowResult,
    ZeusMeter,
    measure_window,
)
from kareus.backends.gpu.runner.pipeline import PipelineRunner
from kareus.backends.gpu.runner.ranks import Rank, env_rank, init_distributed, make_groups, torch_device
from kareus.backends.gpu.runner.stage import (
    _DTYPES,
    Data,
    build_stage,
    check_against_graph,
    partition_keys,
    schedule_of,
)
from kareus.backends.gpu.results import (
    InstructionResult,
    PartitionResult,
    PartitionRow,
    PlanResult,
    PowerTrial,
    RankInfo,
    RankResult,
    StaticPowerResult,
)
from kareus.backends.gpu.serialize import Job, check_supported, plan_sms
from kareus.errors import InputError
from kareus.graph import IterationGraph, one_f_one_b
from kareus.plan import InstructionPlan, PartitionSchedule
from workloads.graph_builder import build_iteration_graph
from workloads.parallel import Workload


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


def _rank_info(s: _Setup, clocks: ClockController) -> RankInfo:
    return RankInfo(rank=s.r.rank, world=s.r.world, stage=s.r.stage, tp_rank=s.r.tp_rank,
                    dp_rank=s.r.dp_rank, gpu_index=s.r.local_rank, gpu_name=s.dev.name(),
                    clocks_locked=clocks.active, clock_control=clocks.describe())


def run_plan(s: _Setup) -> PlanResult:
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
        info = _rank_info(s, clocks)
    expected = one_f_one_b(s.r.pp, w.parallel.microbatches)[s.r.stage]
    if runner.executed != expected:  # pragma: no cover - the loop is the schedule
        raise RuntimeError(f"executed order {runner.executed} differs from 1F1B {expected}")
    return PlanResult(info, res,
                      power_limit_applied=plan.power_limit_w is not None and clocks.active,
                      instruction_times=tuple(runner.instruction_times()),
                      losses=tuple(float(x) for x in runner.losses))


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


def run_instruction(s: _Setup) -> InstructionResult:
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
        info = _rank_info(s, clocks)
    return InstructionResult(info, res)


def run_partition(s: _Setup) -> PartitionResult:
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
    rows: list[PartitionRow] = []
    with ClockController([s.dev], job.allow_clock_control) as clocks:
        for clock, k, start, end in job.points:
            clocks.lock(clock)
            res = _measure(s, bench.stepper(int(k) or None, int(start), int(end)))
            rows.append(PartitionRow(clock, int(k), int(start), int(end), res))
        info = _rank_info(s, clocks)
    return PartitionResult(info, ig.partitions[job.partition_index].key, tuple(rows))


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
            ctxs = [NanoCtx(st={"x": part}) for part in engine.split_nanobatches(x, True)]
            items = engine.segment_items("forward", [0, 1, 2], ctxs, True)
            per_layer = len(items) // 3
            idx = per_layer + pidx
            self._grad: Callable[[], ContextManager[None]] = torch.no_grad
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

    def stepper(self, sms: int | None, slot: int, wait: int | None = None
                ) -> Callable[[], None]:
        """:meth:`step` with these arguments."""
        return lambda: self.step(sms, slot, wait)

    def step(self, sms: int | None, slot: int, wait: int | None = None) -> None:
        self._restore()
        with self._grad():
            if self.op_index is not None:
                self.seg.ops[self.op_index].run(self.ctx)
            else:
                self.engine.run_segment(self.seg, self.ctx, self.scratch, sms, slot, wait)


def run_static_power(s: _Setup) -> StaticPowerResult:
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
    trials: list[PowerTrial] = []
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
            trials.append(PowerTrial(t, e, e / t))
        info = _rank_info(s, clocks)
    return StaticPowerResult(info, "blocked_recv" if s.r.rank == 0 else "sleeping_peer",
                             tuple(trials), sum(x.power_w for x in trials) / len(trials))


MODES: dict[str, Callable[[_Setup], RankResult]] = {
    "plan": run_plan, "instruction": run_instruction, "partition": run_partition,
    "static_power": run_static_power,
}


def execute(job: Job, out_dir: str | Path, *, graph: IterationGraph | None = None,
            device_override: Device | None = None) -> RankResult:
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
        atomic_write_json(Path(out_dir) / f"rank{rank}.json", result.to_dict())
        return result
    finally:
        if inited and dist.is_initialized():
            dist.destroy_process_group()
        if device.type == "cuda":
            torch.cuda.empty_cache()
