"""Op-by-op execution of one pipeline stage: nanobatches, launch slots, side-stream collectives and
full recomputation, over the modules of :mod:`workloads.torch_model`.

Why op by op: a Kareus plan launches each partition's collective *together with a chosen compute
op* and joins it at the partition's end, in forward and in backward. So the engine runs every layer
as the ordered op list :mod:`workloads.graph_builder` describes -- the same names, in the same
order, cut at the same collectives -- calling the layer's own submodules (``norm1``, ``attn.qkv``,
``attn.rope``, SDPA, ``attn.proj``, ``mlp.fc1``, ...). The runner checks, per instruction, that the
engine's op names equal the graph's partition op names, so a launch slot index means the same op
in the plan, the simulator and here.

Forward instruction: ``torch.no_grad``; each layer's input is kept as its recomputation
checkpoint (two tensors: the residual stream and the previous layer's reduced branch output, whose
bias-add is the first op, ``bda``, of the next layer in the graph's cut).

Backward instruction (full recomputation, as in the paper's runs): for each layer from the top,
re-run its forward while recording a *tape* -- every op is its own small autograd graph whose
inputs are detached leaves -- then run the backward ops one by one from the tape
(``torch.autograd.backward`` with ``inputs=``: a linear layer's input gradient ("dgrad") and
weight gradient ("wgrad") are two separate ops, as in the graph). Gradients between ops travel in
a table keyed by tensor identity, so residual fan-out sums correctly.

Collectives (tensor parallelism, Megatron layout): forward all-reduce of the row-parallel outputs,
backward all-reduce of the column-parallel inputs' gradients; the embedding and the vocab-parallel
cross-entropy use the model's own :func:`~workloads.torch_model.tensor_parallel_ops`. With
nanobatches, the collective of one nanobatch's segment is launched on a side CUDA stream when the
other nanobatch's next segment reaches the plan's launch slot (the side stream waits on an event
recorded just before that op), and the main stream waits for it at the partition's end. The SM
count of a collective is the CTA limit of the process group it runs on (see
:mod:`kareus.backends.gpu.runner`). On CPU (tests) there are no streams: collectives run when
launched.

Context parallelism is not implemented (the torch model has no ring / all-gather attention).

Modules, one seam each:

- :mod:`~kareus.backends.gpu.engine.collectives` -- the TP group (:class:`Comm`), over process
  groups or a one-process stand-in;
- :mod:`~kareus.backends.gpu.engine.streams` -- main and side CUDA streams;
- :mod:`~kareus.backends.gpu.engine.tape` -- the recomputation tape;
- :mod:`~kareus.backends.gpu.engine.ops` -- nanobatch contexts, a layer's op lists, segments;
- :mod:`~kareus.backends.gpu.engine.stage` -- :class:`StageEngine`, the instructions.
"""

from kareus.backends.gpu.engine.collectives import GroupComm, LocalComm
from kareus.backends.gpu.engine.ops import NanoCtx
from kareus.backends.gpu.engine.stage import ForwardState, Schedule, StageEngine

__all__ = ["ForwardState", "GroupComm", "LocalComm", "NanoCtx", "Schedule", "StageEngine"]
