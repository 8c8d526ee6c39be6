"""What one GPU worker rank reports for its job, one record type per job mode, and their JSON form
(``rank<r>.json``, written by :func:`kareus.backends.gpu.runner.execute` and read back by
:meth:`GPUBackend.run_job <kareus.backends.gpu.backend.GPUBackend.run_job>`).

Units: time in s, energy in J, power in W, clocks in MHz. A measurement window is a
:class:`~kareus.backends.gpu.measure.WindowResult` (its length, this rank's GPU energy over it,
the steps run inside it, the mean SM clock sampled).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from kareus.backends.gpu.measure import WindowResult
from kareus.graph import Direction
from kareus.json_types import Json, JsonObject, record_dict


# ------------------------------------------------------------------------ reading JSON values


def _get(d: Mapping[str, object], key: str) -> object:
    if key not in d:
        raise ValueError(f"rank result has no {key!r}")
    return d[key]


def _int(d: Mapping[str, object], key: str) -> int:
    v = _get(d, key)
    if not isinstance(v, int):
        raise ValueError(f"rank result {key!r} is not an integer: {v!r}")
    return v


def _number(v: object) -> float:
    """A number as written (an integer stays one, so that it is written back the same)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"rank result value is not a number: {v!r}")
    return v


def _float(d: Mapping[str, object], key: str) -> float:
    return _number(_get(d, key))


def _opt_float(d: Mapping[str, object], key: str) -> float | None:
    return None if d.get(key) is None else _float(d, key)


def _str(d: Mapping[str, object], key: str) -> str:
    v = _get(d, key)
    if not isinstance(v, str):
        raise ValueError(f"rank result {key!r} is not a string: {v!r}")
    return v


def _bool(d: Mapping[str, object], key: str) -> bool:
    v = _get(d, key)
    if not isinstance(v, bool):
        raise ValueError(f"rank result {key!r} is not true/false: {v!r}")
    return v


def _list(d: Mapping[str, object], key: str) -> list[object]:
    v = _get(d, key)
    if not isinstance(v, list):
        raise ValueError(f"rank result {key!r} is not a list: {v!r}")
    return v


def _object(v: object) -> Mapping[str, object]:
    if not isinstance(v, dict):
        raise ValueError(f"rank result entry is not an object: {v!r}")
    return v


def _window_from(d: Mapping[str, object]) -> WindowResult:
    return WindowResult(time_s=_float(d, "time_s"), energy_j=_float(d, "energy_j"),
                        steps=_int(d, "steps"), sm_clock_mhz=_opt_float(d, "sm_clock_mhz"))


def window_dict(w: WindowResult) -> JsonObject:
    """A window's JSON fields: ``time_s``, ``energy_j``, ``steps``, ``sm_clock_mhz``."""
    return {"time_s": w.time_s, "energy_j": w.energy_j, "steps": w.steps,
            "sm_clock_mhz": w.sm_clock_mhz}


# ------------------------------------------------------------------------ records


@dataclass(frozen=True)
class RankInfo:
    """Where a rank sat in its job and how its GPU's clocks were handled.

    Attributes:
        rank, world: This process's rank and the job's process count.
        stage, tp_rank, dp_rank: Its pipeline stage, TP rank and DP rank.
        gpu_index: Its GPU (local rank).
        gpu_name: The GPU's name as NVML reports it.
        clocks_locked: Whether SM clocks were locked (clock control on and permitted).
        clock_control: One line saying how clocks were handled.
    """

    rank: int
    world: int
    stage: int
    tp_rank: int
    dp_rank: int
    gpu_index: int
    gpu_name: str
    clocks_locked: bool
    clock_control: str

    def to_dict(self) -> JsonObject:
        return record_dict(self)

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "RankInfo":
        return RankInfo(_int(d, "rank"), _int(d, "world"), _int(d, "stage"), _int(d, "tp_rank"),
                        _int(d, "dp_rank"), _int(d, "gpu_index"), _str(d, "gpu_name"),
                        _bool(d, "clocks_locked"), _str(d, "clock_control"))


@dataclass(frozen=True)
class RankResult:
    """One rank's record of its job: :class:`RankInfo` and the job mode's measurement (each
    mode's record is a subclass)."""

    info: RankInfo

    #: The job mode this record answers.
    job_mode: ClassVar[str] = ""

    def _fields(self) -> JsonObject:
        """The mode's own fields, in their JSON order."""
        return {}

    def to_dict(self) -> JsonObject:
        """The JSON form (flat): the rank's fields, the mode's fields, then ``job_mode``."""
        return {**self.info.to_dict(), **self._fields(), "job_mode": self.job_mode}


@dataclass(frozen=True)
class InstructionResult(RankResult):
    """Mode ``instruction``: one window over repetitions of one instruction."""

    window: WindowResult

    job_mode: ClassVar[str] = "instruction"

    def _fields(self) -> JsonObject:
        return window_dict(self.window)

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "InstructionResult":
        return InstructionResult(RankInfo.from_dict(d), _window_from(d))


@dataclass(frozen=True)
class InstructionSpan:
    """When one instruction of the last measured iteration ran: its microbatch, direction, and
    start and end (s from the iteration's start)."""

    microbatch: int
    direction: Direction
    start_s: float
    end_s: float

    def to_json(self) -> list[Json]:
        return [self.microbatch, self.direction, self.start_s, self.end_s]

    @staticmethod
    def from_json(v: object) -> "InstructionSpan":
        if not (isinstance(v, list) and len(v) == 4):
            raise ValueError(f"instruction time is not [microbatch, direction, start, end]: "
                             f"{v!r}")
        m, d, a, b = v
        if not (isinstance(m, int) and d in ("forward", "backward")
                and isinstance(a, (int, float)) and isinstance(b, (int, float))):
            raise ValueError(f"bad instruction time {v!r}")
        return InstructionSpan(m, "forward" if d == "forward" else "backward", a, b)


@dataclass(frozen=True)
class PlanResult(RankResult):
    """Mode ``plan``: one window over whole iterations of the plan.

    Attributes:
        window: The window (its steps are iterations).
        power_limit_applied: Whether the plan's power limit was set.
        instruction_times: This rank's instructions in the last iteration.
        losses: The loss of each microbatch of the last iteration (last stage; else empty).
    """

    window: WindowResult
    power_limit_applied: bool
    instruction_times: tuple[InstructionSpan, ...]
    losses: tuple[float, ...]

    job_mode: ClassVar[str] = "plan"

    def _fields(self) -> JsonObject:
        return {**window_dict(self.window), "power_limit_applied": self.power_limit_applied,
                "instruction_times": [s.to_json() for s in self.instruction_times],
                "losses": list(self.losses)}

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "PlanResult":
        return PlanResult(RankInfo.from_dict(d), _window_from(d),
                          power_limit_applied=_bool(d, "power_limit_applied"),
                          instruction_times=tuple(InstructionSpan.from_json(x)
                                                  for x in _list(d, "instruction_times")),
                          losses=tuple(_number(x) for x in _list(d, "losses")))


@dataclass(frozen=True)
class PartitionRow:
    """One knob point of a partition measurement: clock (MHz), communication SMs (0: the
    library's default), the collective's window (first, last compute op), and the window."""

    clock_mhz: float
    comm_sms: int
    start: int
    end: int
    window: WindowResult

    def to_dict(self) -> JsonObject:
        return {"clock_mhz": self.clock_mhz, "comm_sms": self.comm_sms, "start": self.start,
                "end": self.end, **window_dict(self.window)}

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "PartitionRow":
        return PartitionRow(_float(d, "clock_mhz"), _int(d, "comm_sms"), _int(d, "start"),
                            _int(d, "end"), _window_from(d))


@dataclass(frozen=True)
class PartitionResult(RankResult):
    """Mode ``partition``: one window per knob point of one partition (or one of its ops)."""

    key: str
    rows: tuple[PartitionRow, ...]

    job_mode: ClassVar[str] = "partition"

    def _fields(self) -> JsonObject:
        return {"key": self.key, "rows": [r.to_dict() for r in self.rows]}

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "PartitionResult":
        return PartitionResult(RankInfo.from_dict(d), _str(d, "key"),
                               tuple(PartitionRow.from_dict(_object(r)) for r in _list(d, "rows")))


@dataclass(frozen=True)
class PowerTrial:
    """One static-power window: its length (s), the GPU's energy (J) and mean power (W)."""

    time_s: float
    energy_j: float
    power_w: float

    def to_dict(self) -> JsonObject:
        return record_dict(self)

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "PowerTrial":
        return PowerTrial(_float(d, "time_s"), _float(d, "energy_j"), _float(d, "power_w"))


@dataclass(frozen=True)
class StaticPowerResult(RankResult):
    """Mode ``static_power``: rank 0 blocked in a receive (``role`` ``"blocked_recv"``), rank 1
    asleep (``"sleeping_peer"``); ``power_w`` is the mean over the trials (W)."""

    role: str
    trials: tuple[PowerTrial, ...]
    power_w: float

    job_mode: ClassVar[str] = "static_power"

    def _fields(self) -> JsonObject:
        return {"role": self.role, "trials": [t.to_dict() for t in self.trials],
                "power_w": self.power_w}

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> "StaticPowerResult":
        return StaticPowerResult(RankInfo.from_dict(d), _str(d, "role"),
                                 tuple(PowerTrial.from_dict(_object(t)) for t in
                                       _list(d, "trials")),
                                 _float(d, "power_w"))


R = TypeVar("R", bound=RankResult)


def result_from_dict(d: Mapping[str, object], kind: type[R]) -> R:
    """Read one rank's JSON record, which must be a ``kind`` (its ``job_mode`` says)."""
    mode = d.get("job_mode")
    if mode != kind.job_mode:
        raise ValueError(f"rank {d.get('rank')} answered a {mode!r} job, not {kind.job_mode!r}")
    parsers = {"plan": PlanResult.from_dict, "instruction": InstructionResult.from_dict,
               "partition": PartitionResult.from_dict,
               "static_power": StaticPowerResult.from_dict}
    rec = parsers[kind.job_mode](d)
    if not isinstance(rec, kind):  # pragma: no cover - the parsers above build their own types
        raise TypeError(f"{type(rec).__name__} is not a {kind.__name__}")
    return rec
