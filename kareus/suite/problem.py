"""Assemble an optimization :class:`~kareus.plugins.Problem` from names (CLI and reproduce.py)."""

from __future__ import annotations

from kareus.backends import make_backend
from kareus.errors import InputError
from kareus.hardware.knobs import KnobSpace
from kareus.hardware.presets import GPUPreset, get_preset
from kareus.plugins import Problem
from kareus.progress import SILENT, Progress
from workloads import Workload, make_workload
from workloads.graph_builder import build_iteration_graph


def check_precision(w: Workload, preset: GPUPreset) -> None:
    """Raise :class:`InputError` (one line) when ``preset`` cannot run ``w``'s precision."""
    if w.parallel.precision not in preset.precisions:
        raise InputError(f"{preset.name} cannot run {w.parallel.precision}; choose --precision "
                         f"from {', '.join(preset.precisions)}")


def make_problem(workload: str, *, gpu: str, backend: str = "sim", seed: int = 0,
                 options: dict[str, object] | None = None,
                 gpu_overrides: dict[str, float] | None = None,
                 backend_options: dict[str, object] | None = None,
                 progress: Progress = SILENT, **overrides: object) -> Problem:
    """Validated problem: workload with parallelism overrides, its graph, the backend, the
    default knob space of the GPU (whose parameters ``gpu_overrides`` may change, e.g. the static
    power of a what-if study). ``workload`` is a model name or a Hugging Face config path
    (:func:`workloads.get_model`). A backend that runs a workload rather than a graph (the GPU
    backend's ``bind``) is handed it, so it never has to recover the model from the graph's name.
    Long work reports to ``progress``. Raises InputError / WorkloadError on bad input."""
    preset = get_preset(gpu)
    if gpu_overrides:
        preset = preset.with_overrides(**gpu_overrides)
    # The overrides arrive as a name -> value mapping (CLI options, suite configurations, cell
    # records), checked at run time (make_workload refuses an unknown name, and the workload it
    # builds validates its parallel configuration); mypy cannot tie a value looked up by name to
    # that keyword's type.
    w = make_workload(workload, **overrides)  # type: ignore[arg-type]
    check_precision(w, preset)
    knobs = KnobSpace.default(preset)
    knobs.validate(preset)
    runner = make_backend(backend, preset, **(backend_options or {}))
    bind = getattr(runner, "bind", None)
    graph = bind(w) if callable(bind) else build_iteration_graph(w)
    return Problem(workload=w, graph=graph, backend=runner, gpu=preset, knobs=knobs, seed=seed,
                   options=dict(options or {}), progress=progress)
