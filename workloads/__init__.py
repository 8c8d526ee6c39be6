"""GPT-style workloads: model shapes, parallel configurations, the per-layer op list and the torch
model the GPU backend runs. Knows nothing of optimizers, backends or the harness."""

from workloads.errors import WorkloadError
from workloads.models import MODELS, ModelSpec, get_model
from workloads.parallel import ParallelConfig, Workload, make_workload

__all__ = ["MODELS", "ModelSpec", "ParallelConfig", "Workload", "WorkloadError", "get_model",
           "make_workload"]
