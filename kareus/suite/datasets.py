"""Where the project's shared measurement data lives (never copied into the repository).

The Perseus SOSP '24 profiles sit in ``shared/perseus_sosp24/`` and the Kareus artifact's
measurements in ``shared/kareus_artifact/`` beside the repository; a user's clone may not have
them, so every caller must handle ``None``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kareus.graph import Partition
    from kareus.hardware.partition_sweep import PartitionSweep
    from workloads.partition_spec import PartitionSpec

_REPO = Path(__file__).resolve().parents[2]


def shared_dir() -> Path | None:
    """``$KAREUS_SHARED_DIR`` if set, else ``../shared`` next to the repository, if it exists.
    Raises :class:`~kareus.errors.InputError` where ``$KAREUS_SHARED_DIR`` names no folder (the
    user asked for that data; another copy must not stand in for it silently)."""
    env = os.environ.get("KAREUS_SHARED_DIR")
    if env:
        if not Path(env).is_dir():
            from kareus.errors import InputError

            raise InputError(f"$KAREUS_SHARED_DIR={env}: not a folder")
        return Path(env)
    default = _REPO.parent / "shared"
    return default if default.is_dir() else None


def _shared_path(*parts: str, file: bool = True) -> Path | None:
    """``shared/<parts...>`` if the shared folder and that file (``file``) or path exist."""
    base = shared_dir()
    if base is None:
        return None
    p = base.joinpath(*parts)
    return p if (p.is_file() if file else p.exists()) else None


def perseus_profile(name: str) -> Path | None:
    """Path of ``perseus_sosp24/stage_profile/<name>`` (e.g. ``gpt3-175b+a100_sxm_bf16.csv``)."""
    return _shared_path("perseus_sosp24", "stage_profile", name)


def kareus_artifact(name: str) -> Path | None:
    """Path of ``kareus_artifact/<name>`` (e.g. ``calibration_frontiers.csv``,
    ``attention_partition/spec.json``)."""
    return _shared_path("kareus_artifact", name, file=False)


def vtrain_runs(name: str) -> Path | None:
    """Path of ``vtrain_megatron/<name>`` (``single_node.csv``, ``multi_node_3.6b.csv``)."""
    return _shared_path("vtrain_megatron", name)


def perseus_measured(name: str) -> Path | None:
    """Path of ``perseus_sosp24/measured/<name>`` (``gpt3-xl_a100-pcie_pp4.csv``)."""
    return _shared_path("perseus_sosp24", "measured", name)


def artifact_partition_sweep(comm_max_sms: int
                             ) -> "tuple[PartitionSpec, Partition, PartitionSweep] | None":
    """The Kareus artifact's attention partition: its spec, the partition it describes and its
    measured sweep at the default clock (``attention_partition/``), read for a GPU whose
    collective may take up to ``comm_max_sms`` SMs; ``None`` without the shared data."""
    from kareus.hardware.partition_sweep import load_sweep
    from workloads.partition_spec import PartitionSpec

    spec_path = kareus_artifact("attention_partition/spec.json")
    csv = kareus_artifact("attention_partition/default_clock.csv")
    if spec_path is None or csv is None:
        return None
    spec = PartitionSpec.load(spec_path)
    partition = spec.partition()
    return spec, partition, load_sweep(csv, len(partition.compute), comm_max_sms)
