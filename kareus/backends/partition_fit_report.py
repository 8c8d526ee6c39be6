"""How well a partition law fits its sweep: the typed report of
:func:`~kareus.backends.partition_calibration.fit_partition`.

A :class:`PartitionFitReport` holds the fit's errors over the whole sweep (MAPE and worst error, %),
where the measured fastest configuration ranks among the predicted ones
(:class:`BestConfigurations`), the floor's rise past each window's fastest SM count
(:class:`FloorSlope`: µs and mJ per collective SM) and the hold-out (:class:`PartitionHoldout`:
the law fitted on half of the windows predicting the other half). Its JSON form
(:meth:`PartitionFitReport.to_dict`) is the ``fit`` object of a calibration file;
:meth:`PartitionFitReport.from_dict` reads it back and raises :class:`ValueError` naming the first
malformed field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kareus.json_types import JsonObject

#: How the hold-out splits the sweep.
HOLDOUT_METHOD = "fit on half the windows (alternating), predict the other half; both ways"


def _number(d: Mapping[str, Any], key: str) -> float:
    v = d.get(key)
    try:
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(float(v))
    except OverflowError:  # an integer past a float's range
        ok = False
    if not ok:
        raise ValueError(f"{key} is {str(v)[:40]!r}, not a finite number")
    return float(v)  # type: ignore[arg-type]


def _integer(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key} is {v!r}, not an integer")
    return v


def _object(d: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = d.get(key)
    if not isinstance(v, Mapping):
        raise ValueError(f"{key} is {type(v).__name__}, not an object")
    return v


@dataclass(frozen=True)
class SweepConfiguration:
    """One configuration of a partition sweep: the collective launched before op
    ``overlap_start`` and waited for after op ``overlap_end``, on ``comm_sm_number`` SMs of
    ``comm_block_size`` threads."""

    overlap_start: int
    overlap_end: int
    comm_sm_number: int
    comm_block_size: int

    def to_dict(self) -> JsonObject:
        return {"overlap_start": self.overlap_start, "overlap_end": self.overlap_end,
                "comm_sm_number": self.comm_sm_number, "comm_block_size": self.comm_block_size}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "SweepConfiguration":
        return SweepConfiguration(*(_integer(d, k) for k in (
            "overlap_start", "overlap_end", "comm_sm_number", "comm_block_size")))

    def text(self) -> str:
        return (f"window ({self.overlap_start}, {self.overlap_end}), {self.comm_sm_number} SMs x "
                f"{self.comm_block_size}")


@dataclass(frozen=True)
class BestConfigurations:
    """The measured fastest configuration and the predicted fastest one.

    Attributes:
        measured: The configuration the sweep measured fastest.
        measured_time_s: Its measured time (s).
        measured_predicted_rank: Its rank among the predicted times (1: predicted fastest too).
        predicted: The configuration the law predicts fastest.
        predicted_time_s: Its predicted time (s).
        predicted_measured_time_s: Its measured time (s).
        predicted_excess_pct: How much slower (%) it measures than the measured fastest.
    """

    measured: SweepConfiguration
    measured_time_s: float
    measured_predicted_rank: int
    predicted: SweepConfiguration
    predicted_time_s: float
    predicted_measured_time_s: float
    predicted_excess_pct: float

    def to_dict(self) -> JsonObject:
        return {"measured_best": {**self.measured.to_dict(), "time_s": self.measured_time_s},
                "measured_best_predicted_rank": self.measured_predicted_rank,
                "predicted_best": {**self.predicted.to_dict(), "time_s": self.predicted_time_s,
                                   "measured_time_s": self.predicted_measured_time_s,
                                   "measured_excess_pct": self.predicted_excess_pct}}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "BestConfigurations":
        m, p = _object(d, "measured_best"), _object(d, "predicted_best")
        return BestConfigurations(
            SweepConfiguration.from_dict(m), _number(m, "time_s"),
            _integer(d, "measured_best_predicted_rank"), SweepConfiguration.from_dict(p),
            _number(p, "time_s"), _number(p, "measured_time_s"),
            _number(p, "measured_excess_pct"))


@dataclass(frozen=True)
class BlockFloorSlope:
    """The floor's rise (µs per collective SM) of the windows run with one block size."""

    windows: int
    measured_us_per_sm: float
    predicted_us_per_sm: float


@dataclass(frozen=True)
class FloorSlope:
    """What each SM given to the collective past a window's fastest SM count costs, measured and
    predicted, averaged over ``windows`` (window, block size) pairs; ``windows`` 0 when no
    window has enough rows past its fastest SM count (the slopes are then NaN).

    Attributes:
        windows: Pairs of window and block size averaged.
        measured_us_per_sm / predicted_us_per_sm: Time per collective SM (µs).
        measured_mj_per_sm / predicted_mj_per_sm: Energy per collective SM (mJ).
        by_block: The time slopes per block size (threads, as a string key).
    """

    windows: int
    measured_us_per_sm: float = math.nan
    predicted_us_per_sm: float = math.nan
    measured_mj_per_sm: float = math.nan
    predicted_mj_per_sm: float = math.nan
    by_block: Mapping[str, BlockFloorSlope] = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        if not self.windows:
            return {"windows": 0}
        return {"windows": self.windows, "measured_us_per_sm": self.measured_us_per_sm,
                "predicted_us_per_sm": self.predicted_us_per_sm,
                "measured_mj_per_sm": self.measured_mj_per_sm,
                "predicted_mj_per_sm": self.predicted_mj_per_sm,
                "by_block": {b: {"windows": s.windows, "measured_us_per_sm": s.measured_us_per_sm,
                                 "predicted_us_per_sm": s.predicted_us_per_sm}
                             for b, s in self.by_block.items()}}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "FloorSlope":
        windows = _integer(d, "windows")
        if not windows:
            return FloorSlope(0)
        blocks = _object(d, "by_block")
        return FloorSlope(
            windows, *(_number(d, k) for k in ("measured_us_per_sm", "predicted_us_per_sm",
                                               "measured_mj_per_sm", "predicted_mj_per_sm")),
            by_block={str(b): BlockFloorSlope(_integer(_object(blocks, b), "windows"),
                                              _number(_object(blocks, b), "measured_us_per_sm"),
                                              _number(_object(blocks, b), "predicted_us_per_sm"))
                      for b in blocks})

    def text(self) -> str:
        """One report line: the floor's rise per collective SM, measured against predicted (or
        why there is none)."""
        if not self.windows:
            return "floor past the fastest SM count: no window has enough rows past it"
        return (f"floor past each window's fastest SM count ({self.windows} pairs of window and "
                f"block size): measured {self.measured_us_per_sm:+.1f} us and "
                f"{self.measured_mj_per_sm:+.2f} mJ per SM, predicted "
                f"{self.predicted_us_per_sm:+.1f} us and {self.predicted_mj_per_sm:+.2f} mJ"
                + "".join(f"; {b}-thread blocks: measured {v.measured_us_per_sm:+.1f} us, "
                          f"predicted {v.predicted_us_per_sm:+.1f} us"
                          for b, v in self.by_block.items()))


@dataclass(frozen=True)
class HoldoutHalf:
    """The law fitted on ``fit_windows`` and its errors (MAPE, %) on ``predicted_windows``."""

    fit_windows: tuple[tuple[int, int], ...]
    predicted_windows: tuple[tuple[int, int], ...]
    time_mape_pct: float
    energy_mape_pct: float

    def to_dict(self) -> JsonObject:
        return {"fit_windows": [list(w) for w in self.fit_windows],
                "predicted_windows": [list(w) for w in self.predicted_windows],
                "time_mape_pct": self.time_mape_pct, "energy_mape_pct": self.energy_mape_pct}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "HoldoutHalf":
        def windows(key: str) -> tuple[tuple[int, int], ...]:
            v = d.get(key)
            if not isinstance(v, list) or not all(
                    isinstance(w, list) and len(w) == 2 and all(
                        isinstance(x, int) and not isinstance(x, bool) for x in w) for w in v):
                raise ValueError(f"{key} is not a list of (start, end) windows")
            return tuple((w[0], w[1]) for w in v)

        return HoldoutHalf(windows("fit_windows"), windows("predicted_windows"),
                           _number(d, "time_mape_pct"), _number(d, "energy_mape_pct"))


@dataclass(frozen=True)
class PartitionHoldout:
    """The hold-out: each half of the windows predicted by the law fitted on the other
    (``halves``), or why it could not run (``skipped``, then no halves)."""

    halves: tuple[HoldoutHalf, ...] = ()
    skipped: str = ""
    method: str = HOLDOUT_METHOD

    @property
    def time_mape_pct(self) -> float:
        """Mean time MAPE (%) over the predicted halves (NaN when skipped)."""
        return (sum(h.time_mape_pct for h in self.halves) / len(self.halves)
                if self.halves else math.nan)

    @property
    def energy_mape_pct(self) -> float:
        """Mean energy MAPE (%) over the predicted halves (NaN when skipped)."""
        return (sum(h.energy_mape_pct for h in self.halves) / len(self.halves)
                if self.halves else math.nan)

    def to_dict(self) -> JsonObject:
        if self.skipped:
            return {"method": self.method, "skipped": self.skipped}
        return {"method": self.method, "time_mape_pct": self.time_mape_pct,
                "energy_mape_pct": self.energy_mape_pct,
                "halves": [h.to_dict() for h in self.halves]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "PartitionHoldout":
        method = d.get("method", HOLDOUT_METHOD)
        if not isinstance(method, str):
            raise ValueError("holdout method is not a string")
        if "skipped" in d:
            if not isinstance(d["skipped"], str) or not d["skipped"]:
                raise ValueError("holdout skipped is not a reason")
            return PartitionHoldout(skipped=d["skipped"], method=method)
        halves = d.get("halves")
        if not isinstance(halves, list) or not halves:
            raise ValueError("holdout has neither halves nor a reason it was skipped")
        if not all(isinstance(h, Mapping) for h in halves):
            raise ValueError("a holdout half is not an object")
        return PartitionHoldout(tuple(HoldoutHalf.from_dict(h) for h in halves), method=method)

    def text(self) -> str:
        return (f"hold-out ({self.method}): "
                + (self.skipped if self.skipped else
                   f"time MAPE {self.time_mape_pct:.2f} %, energy MAPE "
                   f"{self.energy_mape_pct:.2f} %"))


@dataclass(frozen=True)
class PartitionFitReport:
    """How well a partition law fits its sweep (see the module docstring).

    Attributes:
        rows: Configurations of the sweep.
        repeats: Measurements averaged per configuration.
        time_mape_pct / energy_mape_pct: The fit's MAPE (%) over every configuration.
        time_max_ape_pct: Its worst time error (%).
        best: The measured and the predicted fastest configurations.
        floor: The floor's rise per collective SM, measured and predicted.
        kept_from_preset: Law parameters the sweep cannot identify (the preset's values kept).
        holdout: The hold-out, when one was asked for.
    """

    rows: int
    repeats: int
    time_mape_pct: float
    energy_mape_pct: float
    time_max_ape_pct: float
    best: BestConfigurations
    floor: FloorSlope
    kept_from_preset: tuple[str, ...] = ()
    holdout: PartitionHoldout | None = None

    def to_dict(self) -> JsonObject:
        out: JsonObject = {"rows": self.rows, "repeats": self.repeats,
                           "time_mape_pct": self.time_mape_pct,
                           "energy_mape_pct": self.energy_mape_pct,
                           "time_max_ape_pct": self.time_max_ape_pct, **self.best.to_dict()}
        if self.kept_from_preset:  # only a sweep that cannot identify them says so
            out["kept_from_preset"] = list(self.kept_from_preset)
        out["floor_slope"] = self.floor.to_dict()
        if self.holdout is not None:
            out["holdout"] = self.holdout.to_dict()
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "PartitionFitReport":
        """The report of a calibration file's ``fit`` object; :class:`ValueError` names the first
        malformed field."""
        kept = d.get("kept_from_preset", [])
        if not isinstance(kept, list) or not all(isinstance(k, str) for k in kept):
            raise ValueError("kept_from_preset is not a list of parameter names")
        holdout = d.get("holdout")
        if holdout is not None and not isinstance(holdout, Mapping):
            raise ValueError("holdout is not an object")
        return PartitionFitReport(
            _integer(d, "rows"), _integer(d, "repeats"), _number(d, "time_mape_pct"),
            _number(d, "energy_mape_pct"), _number(d, "time_max_ape_pct"),
            BestConfigurations.from_dict(d), FloorSlope.from_dict(_object(d, "floor_slope")),
            tuple(kept), None if holdout is None else PartitionHoldout.from_dict(holdout))

    def lines(self) -> list[str]:
        """The report's lines: the fit, the hold-out, the two fastest configurations, the floor
        and the parameters kept from the preset."""
        b = self.best
        out = [f"fit: time MAPE {self.time_mape_pct:.2f} % (max {self.time_max_ape_pct:.2f} %), "
               f"energy MAPE {self.energy_mape_pct:.2f} %"]
        if self.holdout is not None:
            out.append(self.holdout.text())
        out += [f"measured fastest: {b.measured.text()} threads, {b.measured_time_s * 1e3:.3f} "
                f"ms; predicted rank {b.measured_predicted_rank} of {self.rows}",
                f"predicted fastest: {b.predicted.text()} threads, measures "
                f"{b.predicted_measured_time_s * 1e3:.3f} ms ({b.predicted_excess_pct:+.1f} % "
                "over the measured fastest)",
                self.floor.text()]
        if self.kept_from_preset:
            out.append("kept from the preset, not fitted (the sweep cannot identify them): "
                       + ", ".join(self.kept_from_preset))
        return out
