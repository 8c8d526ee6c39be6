"""Predefined experiment suites: the paper's configurations and the what-if studies.

- ``paper``: the Kareus paper's ten configurations (``shared/method.md`` §8: 16 x A100 SXM4 40 GB,
  PP=2, 8 microbatches, full recomputation; the 28-layer models split 15 + 13 as in the artifact)
  and the Llama 3.3 70B emulation (TP8, MBS 2, seq 4096, 2 x 40 layers, 8 microbatches).
- ``static-sweep``: Llama 3.2 3B TP8 and Qwen 3 1.7B CP2+TP4 with the GPU's static power set from
  40 to 120 W, to show how the value of joint optimization grows with the static share.
- ``scale``: the 70B model on 64, 128 and 256 GPUs with data parallelism and more stages, and
  two production-size jobs on A100 SXM4 80 GB: the 70B model on 512 GPUs (PP8 DP8, 64
  microbatches) and GPT-3 175B on 1,024 GPUs (TP8 PP16 DP8, 128 microbatches).
- ``smoke``: two small configurations, for tests and a quick look.

Each configuration is a cell run independently (and reused on a rerun); the suite's tables are
built from the cells' ``summary.json`` files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kareus.errors import InputError

#: The Kareus paper's headline results (shared/method.md §8), shown beside the suite's.
PAPER_HEADLINES = {
    "iso_time_energy_reduction_pct_max": 28.3,
    "iso_energy_time_reduction_pct_max": 27.5,
    "llama3.3-70b_iso_time_energy_reduction_pct": 15.3,
    "llama3.3-70b_iso_energy_time_reduction_pct": 9.3,
}


@dataclass(frozen=True)
class SuiteConfig:
    """One configuration (cell) of a suite.

    Attributes:
        label: Folder name and table row, e.g. ``llama3.2-3b_cp2tp4_mbs8_seq4096``.
        workload: Model name.
        overrides: Parallelism overrides (``tp``, ``cp``, ``mbs``, ``seq``, ...).
        gpu_overrides: Preset parameters to change (e.g. ``static_power_w``).
        gpu: The GPU preset of this configuration, overriding the suite run's ``--gpu``
            (``None``: the run's).
    """

    label: str
    workload: str
    overrides: dict[str, object] = field(default_factory=dict)
    gpu_overrides: dict[str, float] = field(default_factory=dict)
    gpu: str | None = None


def _paper() -> list[SuiteConfig]:
    rows = [
        ("llama3.2-3b", 8, 1, 8, 4096), ("llama3.2-3b", 4, 2, 8, 4096),
        ("llama3.2-3b", 4, 2, 8, 8192), ("llama3.2-3b", 4, 2, 16, 4096),
        ("qwen3-1.7b", 8, 1, 8, 4096), ("qwen3-1.7b", 8, 1, 8, 8192),
        ("qwen3-1.7b", 8, 1, 16, 4096), ("qwen3-1.7b", 4, 2, 8, 4096),
        ("qwen3-1.7b", 4, 2, 8, 8192), ("qwen3-1.7b", 4, 2, 16, 4096),
    ]
    out = []
    for model, tp, cp, mbs, seq in rows:
        par = f"cp{cp}tp{tp}" if cp > 1 else f"tp{tp}"
        out.append(SuiteConfig(
            label=f"{model}_{par}_mbs{mbs}_seq{seq}", workload=model,
            overrides=dict(tp=tp, cp=cp, pp=2, mbs=mbs, seq=seq, microbatches=8,
                           layer_split=(15, 13)),
        ))
    out.append(SuiteConfig(label="llama3.3-70b_tp8_mbs2_seq4096", workload="llama3.3-70b",
                           overrides=dict(tp=8, cp=1, pp=2, mbs=2, seq=4096, microbatches=8,
                                          layer_split=(40, 40))))
    return out


def _static_sweep() -> list[SuiteConfig]:
    out = []
    for model, tp, cp in (("llama3.2-3b", 8, 1), ("qwen3-1.7b", 4, 2)):
        par = f"cp{cp}tp{tp}" if cp > 1 else f"tp{tp}"
        for watts in (40, 60, 80, 100, 120):
            out.append(SuiteConfig(
                label=f"{model}_{par}_static{watts}w", workload=model,
                overrides=dict(tp=tp, cp=cp, pp=2, mbs=8, seq=4096, microbatches=8,
                               layer_split=(15, 13)),
                gpu_overrides={"static_power_w": float(watts)},
            ))
    return out


def _scale() -> list[SuiteConfig]:
    out = []
    for pp, dp, micro in ((4, 2, 16), (8, 2, 16), (8, 4, 16)):
        gpus = 8 * pp * dp
        out.append(SuiteConfig(
            label=f"llama3.3-70b_{gpus}gpus_tp8pp{pp}dp{dp}", workload="llama3.3-70b",
            overrides=dict(tp=8, cp=1, pp=pp, dp=dp, mbs=2, seq=4096, microbatches=micro),
        ))
    # Production-size jobs on A100 SXM4 80 GB: Llama 3.3 70B on 512 GPUs, and GPT-3 175B on
    # 1,024 GPUs as in Megatron-LM's scaling study (TP8 PP16 DP8, MBS 2, 128 microbatches).
    out.append(SuiteConfig(
        label="llama3.3-70b_512gpus_tp8pp8dp8", workload="llama3.3-70b", gpu="a100-sxm4-80gb",
        overrides=dict(tp=8, cp=1, pp=8, dp=8, mbs=2, seq=4096, microbatches=64)))
    out.append(SuiteConfig(
        label="gpt3-175b_1024gpus_tp8pp16dp8", workload="gpt3-175b", gpu="a100-sxm4-80gb",
        overrides=dict(tp=8, cp=1, pp=16, dp=8, mbs=2, seq=2048, microbatches=128)))
    return out


def _smoke() -> list[SuiteConfig]:
    """Two small configurations for tests and demos (seconds, not minutes)."""
    small = dict(tp=4, pp=2, mbs=2, microbatches=4)
    return [SuiteConfig(label="gpt3-xl_tp4_small", workload="gpt3-xl", overrides=small),
            SuiteConfig(label="qwen3-1.7b_tp4_small", workload="qwen3-1.7b",
                        overrides=dict(small, seq=1024))]


SUITES = {"paper": _paper, "static-sweep": _static_sweep, "scale": _scale, "smoke": _smoke}


def get_suite(name: str) -> list[SuiteConfig]:
    """The configurations of suite ``name``."""
    try:
        return SUITES[name]()
    except KeyError:
        raise InputError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}") from None
