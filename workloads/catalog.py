"""Where a workload's model comes from: the built-in models (:data:`workloads.models.MODELS`)
or a Hugging Face ``config.json`` (:mod:`workloads.hf_config`). The one module that knows both,
so that neither has to import the other."""

from __future__ import annotations

from workloads.errors import WorkloadError
from workloads.hf_config import load_model, looks_like_path
from workloads.models import MODELS, ModelSpec


def get_model(name: str) -> ModelSpec:
    """A built-in model by name, or the model of a Hugging Face ``config.json`` (a path to it or
    its folder; see :mod:`workloads.hf_config`). Raises :class:`WorkloadError` (one line) naming
    the valid choices or what is wrong with the file."""
    if name in MODELS:
        return MODELS[name]
    if looks_like_path(name):
        return load_model(name)
    raise WorkloadError(
        f"unknown workload {name!r}; choose one of: {', '.join(MODELS)}, or give the path of a "
        "Hugging Face config.json (or its folder)"
    )
