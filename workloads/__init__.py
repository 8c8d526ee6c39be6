"""GPT-style workloads: model shapes (built-in, or any dense decoder's Hugging Face
``config.json``), parallel configurations, the per-layer op list and the torch model the GPU
backend runs. Knows nothing of optimizers, backends or the harness."""

from workloads.errors import WorkloadError
from workloads.hf_config import workload_ref
from workloads.catalog import get_model
from workloads.models import MODELS, ModelSpec
from workloads.parallel import ParallelConfig, Workload, make_workload

__all__ = ["MODELS", "ModelSpec", "ParallelConfig", "Workload", "WorkloadError", "get_model",
           "make_workload", "workload_ref"]
