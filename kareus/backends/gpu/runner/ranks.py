"""Where this process sits in the job (stage, DP and TP rank), its torch device, the default
process group and the TP / DP communicators (one per NCCL CTA limit).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kareus.backends.gpu.engine import GroupComm
from kareus.backends.gpu.serialize import Job
from kareus.errors import InputError

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


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


def nccl_options(sms: int) -> object:
    """Process-group options limiting NCCL to ``sms`` CTAs (one SM each): a
    ``ProcessGroupNCCL.Options``, for ``torch.distributed.new_group``'s ``pg_options``."""
    import torch.distributed as dist

    opts = dist.ProcessGroupNCCL.Options()
    opts.config.min_ctas = int(sms)
    opts.config.max_ctas = int(sms)
    return opts


def make_groups(r: Rank, sms_list: list[int], nccl: bool
                ) -> tuple[GroupComm | None, ProcessGroup | None]:
    """The TP communicators of this rank (default + one per SM count) and its DP group. Every
    rank creates every group, in the same order (``torch.distributed.new_group``'s rule)."""
    import torch.distributed as dist

    tp_groups: dict[int | None, ProcessGroup] = {}
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
