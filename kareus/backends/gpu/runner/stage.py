"""One stage's modules, checked against the iteration graph: seeded construction, partition keys,
plan schedules for the engine, and the synthetic microbatch data.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from kareus.backends.gpu.engine import Schedule, StageEngine
from kareus.graph import IterationGraph
from kareus.plan import InstructionPlan
from workloads.parallel import Workload
from workloads.torch_model import GPTStage


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def build_stage(w: Workload, stage: int, tp_rank: int, device: torch.device, dtype: torch.dtype,
                seed: int, layers: int | None = None, first: bool | None = None,
                last: bool | None = None) -> GPTStage:
    """The stage's modules for one TP rank, weights seeded by (seed, stage, TP rank); the
    vocabulary padded as the workload pads it (:attr:`Workload.padded_vocab`)."""
    p = w.parallel
    torch.manual_seed(seed * 7919 + 1000 * stage + tp_rank)
    return GPTStage(
        replace(w.model, vocab=w.padded_vocab), layers if layers is not None else w.stage_layers()[stage],
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
