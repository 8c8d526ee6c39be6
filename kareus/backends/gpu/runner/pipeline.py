"""One rank's training iterations: Megatron-LM's 1F1B over its stage with P2P exchanges,
per-instruction clock locks, the DP gradient all-reduce and the AdamW step.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypeVar

import torch

from kareus.backends.gpu.clocks import ClockController
from kareus.backends.gpu.engine import ForwardState, StageEngine
from kareus.backends.gpu.results import InstructionSpan
from kareus.backends.gpu.runner.ranks import Rank
from kareus.backends.gpu.runner.stage import Data, schedule_of
from kareus.graph import Instruction, IterationGraph
from kareus.plan import InstructionPlan
from workloads.parallel import Workload

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

T = TypeVar("T")

#: A point in time on the stream: a recorded CUDA event, or ``time.perf_counter()`` (s) on CPU.
_Mark: TypeAlias = "torch.cuda.Event | float"


class _Optimizer(Protocol):
    def step(self) -> object: ...


class ForeachAdamW:
    """AdamW (decoupled weight decay) with ``torch._foreach_*`` ops; for CPU runs."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float = 1e-6,
                 betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1) -> None:
        self.params, self.lr, self.betas, self.eps, self.wd = list(params), lr, betas, eps, \
            weight_decay
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
        gs = [g for i in idx if (g := self.params[i].grad) is not None]
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
                 device: torch.device, dtype: torch.dtype, dp_group: ProcessGroup | None = None,
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
        self.optim: _Optimizer | None = None
        if optimizer_step:
            # CUDA: torch's fused AdamW. CPU (tests): the same update with foreach ops, since
            # importing torch.optim loads torch._dynamo (seconds per process).
            self.optim = torch.optim.AdamW(params, lr=1e-6, fused=True) if self.cuda \
                else ForeachAdamW(params, lr=1e-6)
        self._clock: float | None = None
        self.executed: list[Instruction] = []
        self._marks: list[tuple[Instruction, _Mark, _Mark]] = []
        self._t0: _Mark = 0.0
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

    def _mark(self) -> _Mark:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _timed(self, ins: Instruction, fn: Callable[[], T]) -> T:
        self.executed.append(ins)
        start = self._mark()
        out = fn()
        self._marks.append((ins, start, self._mark()))
        return out

    def _since_start(self, mark: _Mark) -> float:
        """Seconds from the iteration's start to ``mark``."""
        t0 = self._t0
        if isinstance(t0, float) and isinstance(mark, float):
            return mark - t0
        if isinstance(t0, torch.cuda.Event) and isinstance(mark, torch.cuda.Event):
            return t0.elapsed_time(mark) / 1e3
        raise TypeError("CUDA event and host time marks mixed")

    def instruction_times(self) -> list[InstructionSpan]:
        """When each instruction of the last iteration ran, from its start (call after a
        synchronize)."""
        return [InstructionSpan(ins.microbatch, ins.direction, self._since_start(a),
                                self._since_start(b)) for ins, a, b in self._marks]

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
        if inp is None:
            raise RuntimeError(f"stage {self.r.stage} has no input for microbatch {m}")
        tgt = self.data.targets[m] if self.engine.last else None
        sched = schedule_of(ip, self.has_parts["forward"])
        st = self._timed(ins, lambda: self.engine.forward(inp, sched, tgt))
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
