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

Modules, one seam each:

- :mod:`~kareus.backends.gpu.runner.ranks` -- ranks, devices, process groups with CTA limits;
- :mod:`~kareus.backends.gpu.runner.stage` -- the stage's modules, checked against the graph;
- :mod:`~kareus.backends.gpu.runner.pipeline` -- 1F1B iterations of one rank;
- :mod:`~kareus.backends.gpu.runner.modes` -- the job modes and :func:`execute`.
"""

from kareus.backends.gpu.runner.modes import execute
from kareus.backends.gpu.runner.ranks import nccl_options
from kareus.backends.gpu.runner.stage import check_against_graph, partition_keys

__all__ = ["check_against_graph", "execute", "nccl_options", "partition_keys"]
