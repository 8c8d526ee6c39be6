"""The recomputation tape: every op of a backward instruction's recomputed forward as its own
small autograd graph, and the gradients flowing between them keyed by tensor identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(eq=False)
class AutogradEntry:
    """An op recorded with autograd: detached leaf inputs, their source tensors, outputs."""

    leaves: list[Tensor]
    srcs: list[Tensor]
    outs: list[Tensor]
    params: list[Tensor]


@dataclass(eq=False)
class ResidualAddEntry:
    """A residual add ``out = sum(ins) (+ bias)``; backward by hand (gradients pass through)."""

    ins: list[Tensor]
    bias: Tensor | None
    out: Tensor


class Tape:
    """Recorded ops of one nanobatch, and the gradients flowing between them (by tensor id).

    Args:
        keep: Never consume entries or gradients (for repeating one op or partition in a
            measurement window); the caller snapshots and restores :attr:`grads`.
    """

    def __init__(self, keep: bool = False) -> None:
        self.entries: dict[tuple, AutogradEntry | ResidualAddEntry] = {}
        self.grads: dict[int, Tensor] = {}
        self.keep = keep

    def add_grad(self, t: Tensor, g: Tensor) -> None:
        k = id(t)
        old = self.grads.get(k)
        self.grads[k] = g if old is None else old + g

    def pop_grad(self, t: Tensor) -> Tensor | None:
        return self.grads.get(id(t)) if self.keep else self.grads.pop(id(t), None)

    def backward(self, label: tuple, part: str = "all") -> None:
        """Run the backward of entry ``label``: ``part`` is ``"all"``, ``"dgrad"`` (input
        gradients only) or ``"wgrad"`` (parameter gradients only; consumes the entry)."""
        e = self.entries.get(label)
        if e is None:
            return
        if isinstance(e, ResidualAddEntry):
            g = self.pop_grad(e.out)
            if g is not None:
                for t in e.ins:
                    self.add_grad(t, g)
                if e.bias is not None:
                    gb = g.reshape(-1, g.shape[-1]).sum(0)
                    e.bias.grad = gb if e.bias.grad is None else e.bias.grad + gb
            if not self.keep:
                del self.entries[label]
            return
        outs, grads = [], []
        for o in e.outs:
            g = self.grads.get(id(o))
            if g is not None:
                outs.append(o)
                grads.append(g)
        last = part in ("all", "wgrad")
        if outs:
            params = [p for p in e.params if p is not None and p.requires_grad]
            if part == "dgrad":
                inputs = list(e.leaves)
            elif part == "wgrad":
                inputs = params
            else:
                inputs = list(e.leaves) + params
            if inputs:
                for leaf in e.leaves:
                    leaf.grad = None
                torch.autograd.backward(outs, grads, inputs=inputs,
                                        retain_graph=self.keep or not last)
                if part != "wgrad":
                    for leaf, src in zip(e.leaves, e.srcs):
                        if leaf.grad is not None:
                            self.add_grad(src, leaf.grad)
                            leaf.grad = None
        if last and not self.keep:
            for o in e.outs:
                self.grads.pop(id(o), None)
            del self.entries[label]

    def rebind(self, label: tuple, ins: list[Tensor]) -> None:
        """Point a residual add's inputs at other tensors (the recomputed ones)."""
        e = self.entries.get(label)
        if isinstance(e, ResidualAddEntry):
            e.ins = list(ins)
