"""The tensor-parallel group an engine all-reduces over: the :class:`Comm` protocol, its
``torch.distributed`` implementation (one process group per NCCL CTA limit) and a one-process
stand-in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


class Work(Protocol):
    """An asynchronous collective in flight (``torch.distributed``'s ``Work``)."""

    def wait(self) -> object:
        ...


class _Done:
    def wait(self) -> None:
        return None


class Comm(Protocol):
    """The tensor-parallel group of this rank. ``sms`` selects the communicator whose CTA limit
    is that many SMs (``None``: the library's default)."""

    size: int

    def all_reduce(self, t: Tensor, sms: int | None = None, op: str = "sum") -> Work:
        """In-place all-reduce of ``t``, asynchronous; ``wait()`` on the result orders the current
        stream after it."""
        ...


class GroupComm:
    """:class:`Comm` over ``torch.distributed`` process groups: ``groups[None]`` is the default
    TP group, ``groups[k]`` the same ranks with an NCCL CTA limit of ``k``."""

    def __init__(self, groups: dict[int | None, ProcessGroup], size: int) -> None:
        self.groups = groups
        self.size = size

    def all_reduce(self, t: Tensor, sms: int | None = None, op: str = "sum") -> Work:
        import torch.distributed as dist

        group = self.groups.get(sms, self.groups[None])
        red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op]
        return dist.all_reduce(t, op=red, group=group, async_op=True)


class LocalComm:
    """A stand-in collective for one process (tests, single-GPU side-stream checks): an
    all-reduce over ``size`` identical ranks, i.e. ``t *= size`` for a sum (identity for max).
    ``log`` records ``(sms, numel)`` per call."""

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self.log: list[tuple[int | None, int]] = []

    def all_reduce(self, t: Tensor, sms: int | None = None, op: str = "sum") -> Work:
        self.log.append((sms, t.numel()))
        if op == "sum" and self.size != 1:
            t.mul_(self.size)
        return _Done()


def blocking_reduce(comm: Comm | None) -> Callable[[Tensor], object]:
    """A blocking in-place sum all-reduce (what :func:`tensor_parallel_ops` expects)."""
    def reduce(t: Tensor) -> None:
        if comm is not None:
            comm.all_reduce(t).wait()
    return reduce
