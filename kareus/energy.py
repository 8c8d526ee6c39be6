"""The energy accounting of Kareus, Perseus and Zeus -- the one place it is written down.

Every GPU draws its static power ``P_s`` for the whole iteration, bubbles and communication waits
included; on top of that, each op adds its dynamic energy (measured energy minus ``P_s`` times its
duration). For an iteration of length ``T`` on ``G`` GPUs::

    E = sum_ops E_dyn(op) + G * P_s * T
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnergyBreakdown:
    """Energy of one iteration (J), whole cluster unless stated."""

    time_s: float
    dynamic_j: float
    static_j: float

    @property
    def total_j(self) -> float:
        return self.dynamic_j + self.static_j


def static_energy(num_gpus: int, static_power_w: float, time_s: float) -> float:
    """Static energy (J) of ``num_gpus`` GPUs existing for ``time_s`` seconds."""
    return num_gpus * static_power_w * time_s


def iteration_energy(dynamic_j: float, num_gpus: int, static_power_w: float, time_s: float
                     ) -> EnergyBreakdown:
    """Total iteration energy from the summed dynamic energy of all ops on all GPUs (J)."""
    return EnergyBreakdown(time_s=time_s, dynamic_j=dynamic_j,
                           static_j=static_energy(num_gpus, static_power_w, time_s))


def measured_energy(dynamic_j: float, static_power_w: float, time_s: float) -> float:
    """Energy a meter on one GPU reads for an op: its dynamic energy plus ``P_s * t`` (J)."""
    return dynamic_j + static_energy(1, static_power_w, time_s)


def dynamic_from_measured(energy_j: float, static_power_w: float, time: float,
                          unit_s: float = 1.0) -> float:
    """Dynamic energy of an op measured with its static part: ``E - P_s * t`` (J).

    ``t = time * unit_s`` seconds; a quantized time and its unit may be passed separately (the
    product is formed as ``P_s * time * unit_s``, the order the Perseus reference driver uses).
    """
    return energy_j - static_power_w * time * unit_s
