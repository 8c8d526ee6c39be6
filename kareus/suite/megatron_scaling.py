"""Megatron-LM's published weak scaling, 32 to 3,072 A100s, as measured runs to simulate.

The Megatron-LM paper (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", SC '21, arXiv 2104.04473, Table 1) reports the throughput its
authors measured for ten GPT models from 1.7B to 1T parameters on NVIDIA's Selene (DGX A100
80 GB nodes of 8 GPUs, one 200 Gb/s HDR InfiniBand NIC per GPU): the GPUs, tensor- and pipeline-
parallel sizes, the global batch and the achieved teraFLOP/s per GPU. The authors' script for
that table (``examples/sc21/run_table_1.sh`` in NVIDIA/Megatron-LM) gives what the table leaves
out: the micro-batch size, PyTorch's DDP (gradient all-reduce overlapped with the backward) for
the models up to 18B and Megatron-LM's own, after the backward, from 39B, and the interleaved
pipeline schedule for 76B to 530B. :data:`SC21_TABLE1` quotes both (the repository's shared data
holds neither; nothing is fitted on them).

The paper counts a model's work per iteration with full activation recomputation as

    F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h))  FLOPs

(batch ``B``, sequence ``s`` = 2048, layers ``l``, hidden ``h``, vocabulary ``V`` = 51,200), and
its throughput is ``F / (GPUs x iteration time)``; :func:`scaling_runs` inverts that into the
measured iteration time (ms), which makes each row a run like vTrain's
(:mod:`kareus.suite.megatron_runs`): the same workload rules (fp16, full recomputation, 1F1B,
Megatron-LM's unfused core attention), simulated by the same
:func:`~kareus.suite.megatron_runs.simulate_runs`, on the A100 80 GB preset, whose network
(25 GB/s per GPU) is Selene's.

The paper's scatter/gather of the activations sent between stages (its section 4.1: each TP rank
sends 1/TP over its own NIC, the receiving node all-gathers them over NVLink; Megatron-LM's
default then) is modelled (``scatter_gather_p2p``). The suite does not model the interleaved
schedule (its ``virtual_chunks`` model chunks per stage shorten the pipeline's fill and drain by
that factor), which makes those measured runs faster than the plain 1F1B the suite simulates.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pandas as pd

#: Sequence length (tokens) and vocabulary size of every model of the table.
SEQ = 2048
VOCAB = 51200


@dataclass(frozen=True)
class PublishedRun:
    """One row of the paper's Table 1: a model, its layout and the measured throughput.

    ``tflops_per_gpu`` is the achieved teraFLOP/s per GPU (10^12 FLOP/s) and
    ``aggregate_pflops`` the whole job's petaFLOP/s, both as printed (rounded); their agreement
    checks the transcription (``tests/test_megatron_scaling.py``). From the authors' script:
    ``mbs`` (sequences per micro-batch), ``torch_ddp`` (PyTorch's DDP, which overlaps the gradient
    all-reduce with the backward) and ``virtual_chunks`` (model chunks per pipeline stage of the
    interleaved schedule; 1: plain 1F1B).
    """

    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops_per_gpu: float
    aggregate_pflops: float
    mbs: int
    torch_ddp: bool
    virtual_chunks: int

    @property
    def dp(self) -> int:
        """Data-parallel replicas."""
        return self.gpus // (self.tp * self.pp)

    def flops_per_iteration(self) -> float:
        """The paper's count of one iteration's work (FLOPs), recomputation included."""
        b, s, l, h = self.global_batch, SEQ, self.layers, self.hidden
        return 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + VOCAB / (16.0 * l * h))

    def measured_iteration_s(self) -> float:
        """The iteration time (s) the published throughput implies."""
        return self.flops_per_iteration() / (self.gpus * self.tflops_per_gpu * 1e12)


#: Narayanan et al., SC '21, Table 1 (all ten rows), with the micro-batch size, the DDP and the
#: interleaving of ``examples/sc21/run_table_1.sh`` (``--num-layers-per-virtual-pipeline-stage``
#: 5, 5, 3 and 1 for 76B, 145B, 310B and 530B: 15/5, 10/5, 6/3 and 3/1 chunks per stage).
SC21_TABLE1: tuple[PublishedRun, ...] = (
    PublishedRun(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 4.4, 16, True, 1),
    PublishedRun(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 8.8, 16, True, 1),
    PublishedRun(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 18.2, 16, True, 1),
    PublishedRun(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 34.6, 8, True, 1),
    PublishedRun(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 70.8, 4, False, 1),
    PublishedRun(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 143.8, 2, False, 3),
    PublishedRun(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 227.1, 2, False, 2),
    PublishedRun(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 297.4, 1, False, 2),
    PublishedRun(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 410.2, 1, False, 3),
    PublishedRun(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 502.0, 1, False, 1),
)


def scaling_runs(mbs: int | None = None) -> pd.DataFrame:
    """The table's rows as runs, in the columns :class:`~kareus.suite.megatron_runs.RunSet`
    reads (``measured_ms`` from the published throughput, ``vocab`` the paper's,
    ``overlap_grad_reduce`` where the authors ran PyTorch's DDP, ``scatter_gather_p2p`` as the
    Megatron-LM of the paper ran), plus the published figures and
    ``flops`` (the paper's count of one iteration). ``mbs``: every row at that micro-batch size
    instead of the authors' (a sensitivity check); rows whose batch per replica it does not divide
    are left out."""
    rows = []
    for r in SC21_TABLE1:
        size = r.mbs if mbs is None else mbs
        if (r.global_batch // r.dp) % size:
            continue
        rows.append({**asdict(r), "dp": r.dp, "mbs": size, "seq": SEQ, "vocab": VOCAB,
                     "microbatches": r.global_batch // (size * r.dp),
                     "overlap_grad_reduce": r.torch_ddp, "scatter_gather_p2p": True,
                     "flops": r.flops_per_iteration(),
                     "measured_ms": 1e3 * r.measured_iteration_s(),
                     "model": f"gpt-{r.params_b:g}b"})
    return pd.DataFrame(rows)


def achieved_tflops(runs: pd.DataFrame, iteration_ms: pd.Series) -> pd.Series:
    """Throughput per GPU (teraFLOP/s) of each of :func:`scaling_runs`'s runs at the given
    iteration times (ms), counted as the paper counts it."""
    return runs.flops / (runs.gpus * iteration_ms * 1e-3) / 1e12
