"""Plans: what an optimizer decides and a backend executes.

A plan locks one SM clock per pipeline instruction and, for nanobatched instructions, chooses per
partition the number of SMs the communication kernel takes and the compute op it launches with.

This module is the plan's one home: its JSON form (:meth:`IterationPlan.to_json`,
:meth:`IterationPlan.from_json`) and its check against an iteration graph and a GPU
(:meth:`IterationPlan.validate`). The CLI, the GPU backend's job files, the deployment export,
the harness and the backends all go through them.

The JSON form (every value in the units of the dataclasses: MHz, W, SMs, threads)::

    {"label": "...", "power_limit_w": null | W,
     "stages": [{"stage": 0, "instructions": [            # per stage, in 1F1B program order
         {"instruction": "forward" | "backward", "microbatch": 0, "clock_mhz": 1410.0,
          "nanobatched": true,
          "partitions": {"<partition key>": {"comm_sms": null | SMs, "block_size": null | threads,
                                             "launch_slot": s, "wait_after": null | e}}}]}]}

``IterationPlan.meta`` (process-local notes of the optimizer) is not part of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kareus.errors import JobRefused, PlanError
from kareus.graph import Direction, Instruction, IterationGraph, one_f_one_b
from kareus.json_types import JsonObject, construct


#: ``comm_sms`` value in partition grids that means "the collective library's default" (NCCL
#: with its default channel count) rather than a tuned kernel on that many SMs.
LIBRARY_DEFAULT = 0

#: The (launch, wait) window that runs the collective alone before the partition's compute.
SEQUENTIAL = (-1, -1)


@dataclass(frozen=True)
class PartitionSchedule:
    """Fine-grained schedule of one partition: which collective kernel runs the other
    nanobatch's communication, and which compute it overlaps.

    The window follows the Kareus artifact: the collective is launched (on a side stream) just
    before compute op ``launch_slot`` is issued, and the compute stream waits for it right after
    op ``wait_after``. ``launch_slot = wait_after = -1`` runs the collective alone before the
    compute (no overlap).

    Attributes:
        comm_sms: SMs (thread blocks) of a tuned collective kernel; ``None`` runs the collective
            library's default kernel (NCCL, its default channel count).
        launch_slot: Index ``s`` of the compute op the collective is launched before (-1:
            sequential).
        wait_after: Index ``e`` of the compute op after which compute waits for the collective;
            ``None`` means the partition's last op (the collective joins at the end).
        block_size: Threads per block of a tuned kernel; ``None``: the GPU's default (1024 on
            A100).
    """

    comm_sms: int | None = None
    launch_slot: int = 0
    wait_after: int | None = None
    block_size: int | None = None

    def window(self, n_ops: int) -> tuple[int, int]:
        """``(s, e)`` with ``wait_after`` resolved for a partition of ``n_ops`` compute ops."""
        if self.launch_slot < 0:
            return SEQUENTIAL
        return (self.launch_slot, n_ops - 1 if self.wait_after is None else self.wait_after)

    def problem(self, n_ops: int, max_sms: int, max_threads: int = 1024) -> str | None:
        """Why this schedule cannot run on a partition of ``n_ops`` compute ops with at most
        ``max_sms`` communication SMs and ``max_threads`` threads per block, or ``None``."""
        s, e = self.launch_slot, self.wait_after
        for name, v, optional in (("launch_slot", s, False), ("wait_after", e, True),
                                  ("comm_sms", self.comm_sms, True),
                                  ("block_size", self.block_size, True)):
            if not (_is_int(v) or (optional and v is None)):
                return f"{name} {v!r} is not an integer{' or null' if optional else ''}"
        if e is None:
            e = n_ops - 1 if s >= 0 else -1
        if (s < 0) != (e < 0):
            return f"window ({s}, {e}): -1 must be on both sides (sequential) or neither"
        if s < -1 or e < -1 or (s >= 0 and not s <= e < n_ops):
            return (f"window ({s}, {e}) outside the partition's ops: need 0 <= s <= e <= "
                    f"{n_ops - 1}, or (-1, -1)")
        if self.comm_sms is not None and (isinstance(self.comm_sms, bool)
                                          or not 1 <= self.comm_sms <= max_sms):
            library = (" (the library's own kernel is comm_sms=None in a schedule: the knob "
                       "space's 0, LIBRARY_DEFAULT)" if self.comm_sms == LIBRARY_DEFAULT else "")
            return f"communication SMs {self.comm_sms} outside 1..{max_sms}{library}"
        b = self.block_size
        if b is not None and (isinstance(b, bool) or not 32 <= b <= max_threads or b % 32):
            return f"threads per block {b} must be a multiple of 32 in 32..{max_threads}"
        return None

    def to_json(self) -> JsonObject:
        """The schedule as JSON (``comm_sms``/``block_size`` null: the library's kernel / the
        GPU's default threads per block; ``wait_after`` null: the partition's last op)."""
        return {"comm_sms": self.comm_sms, "block_size": self.block_size,
                "launch_slot": self.launch_slot, "wait_after": self.wait_after}

    @staticmethod
    def from_json(d: object) -> "PartitionSchedule":
        """Inverse of :meth:`to_json`; missing fields take their defaults. Raises
        :class:`PlanError` for an unknown field (:meth:`problem`, through
        :meth:`IterationPlan.validate`, checks the values)."""
        return construct(PartitionSchedule, _fields(d, "partition schedule", (),
                                                    ("comm_sms", "block_size", "launch_slot",
                                                     "wait_after")))


@dataclass(frozen=True)
class InstructionPlan:
    """How one pipeline instruction runs.

    Attributes:
        clock_mhz: Locked SM clock (MHz).
        nanobatched: Split the microbatch into nanobatches and overlap communication.
        schedules: Partition key -> schedule, as sorted ``(key, schedule)`` pairs; partitions not
            listed use the collective library's default SM count and launch at the partition start.
    """

    clock_mhz: float
    nanobatched: bool = False
    schedules: tuple[tuple[str, PartitionSchedule], ...] = ()

    @staticmethod
    def make(clock_mhz: float, nanobatched: bool = False,
             schedules: Mapping[str, PartitionSchedule] | None = None) -> "InstructionPlan":
        """The plan; ``schedules`` is keyed by the partitions' :attr:`~kareus.graph.Partition.key`
        strings (:class:`PlanError` for another key)."""
        bad = next((k for k in (schedules or {}) if not isinstance(k, str)), None)
        if bad is not None:
            raise PlanError(f"a partition schedule's key must be its partition's key string "
                            f"(Partition.key), not a {type(bad).__name__}")
        return InstructionPlan(float(clock_mhz), nanobatched,
                               tuple(sorted((schedules or {}).items())))

    def schedule_map(self) -> dict[str, PartitionSchedule]:
        return dict(self.schedules)

    def validate(self, graph: IterationGraph, key: tuple[int, Direction], gpu: "PlanLimits", *,
                 max_comm_sms: int | None = None, block_size_settable: bool = True,
                 where: object = None) -> None:
        """Raise :class:`PlanError` (one line) unless this plan can run instructions of type
        ``key`` (stage, direction) of ``graph`` on ``gpu``: the instruction type exists, the
        clock is one of the GPU's lockable clocks (MHz: its range, in its steps), nanobatching is
        possible, every partition key is one of the instruction's partitions and every schedule
        fits it (window inside its ops, at most ``max_comm_sms`` communication SMs, default
        ``gpu.comm_max_sms``; threads per block only where ``block_size_settable``).
        ``where`` names the instruction in the message (default: ``key``)."""
        where = key if where is None else where
        ig = graph.instruction_graphs.get(key)
        if ig is None:
            raise PlanError(f"unknown instruction {key}; the graph has "
                            f"{sorted(graph.instruction_graphs)}")
        c = self.clock_mhz
        if not _is_number(c) or not math.isfinite(c) or c <= 0:
            raise PlanError(f"{where}: invalid clock {c!r} (not a positive number of MHz)")
        if c < gpu.clock_min_mhz - 1e-6 or c > gpu.clock_max_mhz + 1e-6:
            raise PlanError(f"{where}: clock {c} MHz outside {gpu.name}'s "
                            f"{gpu.clock_min_mhz:.0f}-{gpu.clock_max_mhz:.0f} MHz")
        steps = (c - gpu.clock_min_mhz) / gpu.clock_step_mhz
        if abs(steps - round(steps)) > 1e-6:  # the driver would lock the step below, silently
            below = gpu.clock_min_mhz + math.floor(steps) * gpu.clock_step_mhz
            raise PlanError(f"{where}: clock {c:g} MHz is not one of {gpu.name}'s lockable "
                            f"clocks ({gpu.clock_step_mhz:g} MHz steps): {below:g} or "
                            f"{below + gpu.clock_step_mhz:g}")
        if self.nanobatched and graph.nanobatch_refusal:
            raise JobRefused(graph.nanobatch_refusal)
        parts = {p.key: p for p in ig.partitions}
        sms = gpu.comm_max_sms if max_comm_sms is None else max_comm_sms
        for pkey, s in self.schedules:
            if pkey not in parts:
                raise PlanError(f"{where}: unknown partition {pkey!r} for {ig.name}; valid: "
                                f"{', '.join(parts) or 'none (not nanobatched)'}")
            why = s.problem(len(parts[pkey].compute), sms)
            if why:
                raise PlanError(f"{where}: partition {pkey}: {why}")
            if s.block_size is not None and not block_size_settable:
                raise PlanError(f"{where}: partition {pkey}: the backend runs NCCL kernels, "
                                f"whose threads per block cannot be set (got {s.block_size})")

    def to_json(self, ins: Instruction) -> JsonObject:
        """One entry of the plan's JSON form: this plan as the plan of ``ins``."""
        return {"instruction": ins.direction, "microbatch": ins.microbatch,
                "clock_mhz": self.clock_mhz, "nanobatched": self.nanobatched,
                "partitions": {k: s.to_json() for k, s in self.schedules}}

    @staticmethod
    def from_json(d: object, stage: int) -> tuple[Instruction, "InstructionPlan"]:
        """Inverse of :meth:`to_json` for an entry of stage ``stage``; raises
        :class:`PlanError` on a malformed entry."""
        f = _fields(d, "instruction", ("instruction", "microbatch", "clock_mhz"),
                    ("nanobatched", "partitions"))
        direction, mb, clock = f["instruction"], f["microbatch"], f["clock_mhz"]
        if direction not in ("forward", "backward") or not isinstance(mb, int) \
                or isinstance(mb, bool) or not isinstance(clock, (int, float)) \
                or isinstance(clock, bool):
            raise PlanError(f"plan JSON: bad instruction entry {direction!r} microbatch {mb!r} "
                            f"clock {clock!r} (forward|backward, an integer, MHz)")
        nano = f.get("nanobatched", False)
        parts = f.get("partitions", {})
        if not isinstance(nano, bool) or not isinstance(parts, Mapping):
            raise PlanError("plan JSON: nanobatched must be true or false and partitions an "
                            "object")
        d_: Direction = "forward" if direction == "forward" else "backward"
        return (Instruction(stage, mb, d_),
                InstructionPlan.make(clock, nano, {str(k): PartitionSchedule.from_json(v)
                                                   for k, v in parts.items()}))


#: Marks an instruction a plan has no entry for (:meth:`IterationPlan.validate`).
_MISSING = object()

#: The :attr:`IterationPlan.meta` key an optimizer sets (to ``True``) on the one plan it singles
#: out as its own pick (e.g. Zeus's power limit at its η); the harness reports that plan as the
#: run's ``choice``.
CHOICE = "choice"


@dataclass(frozen=True)
class IterationPlan:
    """A complete plan for one iteration.

    Attributes:
        instructions: Plan of every instruction of the 1F1B DAG.
        power_limit_w: Board power limit to apply (``None``: the GPU's default).
        label: Free-form description (e.g. which optimizer step produced it).
        meta: The optimizer's notes on the plan, in this process only (e.g. :data:`CHOICE`).
    """

    instructions: Mapping[Instruction, InstructionPlan]
    power_limit_w: float | None = None
    label: str = ""
    meta: Mapping[str, object] = field(default_factory=dict, compare=False)

    @staticmethod
    def uniform(graph: IterationGraph, clock_mhz: float, nanobatched: bool = False,
                schedules: Mapping[str, PartitionSchedule] | None = None,
                power_limit_w: float | None = None, label: str = "") -> "IterationPlan":
        """The same clock and schedule for every instruction."""
        ip = InstructionPlan.make(clock_mhz, nanobatched, schedules)
        return IterationPlan(
            {ins: ip for seq in graph.schedule().values() for ins in seq},
            power_limit_w=power_limit_w, label=label,
        )

    def validate(self, graph: IterationGraph, gpu: "PlanLimits", *,
                 max_comm_sms: int | None = None, block_size_settable: bool = True) -> None:
        """Raise :class:`PlanError` (one line) unless this plan can run ``graph`` on ``gpu``.

        The one check of a plan, which the harness and every backend call: the power limit is
        a number of watts above the GPU's static power and at most its board limit; the plan has an entry for every
        instruction of the 1F1B schedule and none for an instruction the graph does not run;
        and every instruction's plan passes :meth:`InstructionPlan.validate` (clock range,
        nanobatching, partition keys, schedules; ``max_comm_sms`` and
        ``block_size_settable`` are the backend's limits).
        """
        lim = self.power_limit_w
        if lim is not None and (not _is_number(lim) or not math.isfinite(lim)
                                or not gpu.static_power_w < lim <= gpu.power_limit_w * (1 + 1e-9)):
            raise PlanError(f"invalid power limit {lim!r}: must be a number of watts above "
                            f"{gpu.name}'s static power {gpu.static_power_w} W and at most its "
                            f"board limit {gpu.power_limit_w:g} W")
        if not isinstance(self.instructions, Mapping):
            raise PlanError(f"instructions must map Instruction to InstructionPlan, got "
                            f"{type(self.instructions).__name__}")
        bad = next((k for k in self.instructions if not isinstance(k, Instruction)), None)
        if bad is not None:
            raise PlanError(f"a plan's keys must be kareus.graph.Instruction (stage, microbatch, "
                            f"direction; graph.schedule() lists them), not {bad!r}")
        order = [ins for seq in graph.schedule().values() for ins in seq]
        plans = [self.instructions.get(ins, _MISSING) for ins in order]
        missing = [ins for ins, ip in zip(order, plans) if ip is _MISSING]
        if missing:
            raise PlanError(f"plan has no entry for {len(missing)} instruction(s), e.g. "
                            f"{missing[0]}")
        if len(self.instructions) != len(order):
            known = set(order)
            extra = [ins for ins in self.instructions if ins not in known]
            raise PlanError(f"plan has {len(extra)} entry(ies) for instructions the graph does "
                            f"not run ({graph.stages} stages x {graph.microbatches} "
                            f"microbatches), e.g. {extra[0]!r}")
        seen: set[tuple[int, str, int]] = set()
        for ins, ip in zip(order, plans):
            if not isinstance(ip, InstructionPlan):
                raise PlanError(f"{ins}: {type(ip).__name__} is not an InstructionPlan")
            kind = (ins.stage, ins.direction, id(ip))  # one plan object of one type: one check
            if kind not in seen:
                seen.add(kind)
                ip.validate(graph, ins.type_key, gpu, max_comm_sms=max_comm_sms,
                            block_size_settable=block_size_settable, where=ins)

    def stage_programs(self) -> list[tuple[int, list[Instruction]]]:
        """The plan's instructions per stage (by stage): in 1F1B program order when the plan
        covers a whole 1F1B schedule, else by microbatch."""
        ins = list(self.instructions)
        stages: dict[int, list[Instruction]] = {}
        if ins:
            order = one_f_one_b(1 + max(i.stage for i in ins), 1 + max(i.microbatch for i in ins))
            if sum(map(len, order.values())) == len(ins) and all(
                    i in self.instructions for seq in order.values() for i in seq):
                stages = order
            else:
                for i in sorted(ins, key=lambda i: (i.stage, i.microbatch, i.direction)):
                    stages.setdefault(i.stage, []).append(i)
        return sorted(stages.items())

    def to_json(self) -> JsonObject:
        """The plan's JSON form (see the module docstring); instructions per stage as
        :meth:`stage_programs` orders them."""
        return {"label": self.label, "power_limit_w": self.power_limit_w,
                "stages": [{"stage": s, "instructions": [self.instructions[i].to_json(i)
                                                         for i in seq]}
                           for s, seq in self.stage_programs()]}

    @staticmethod
    def from_json(d: object) -> "IterationPlan":
        """Inverse of :meth:`to_json`; raises :class:`PlanError` (one line) on malformed JSON
        (it does not check the plan against a graph: :meth:`validate` does)."""
        f = _fields(d, "plan", ("stages",), ("label", "power_limit_w"))
        label, lim = f.get("label", ""), f.get("power_limit_w")
        if not isinstance(label, str) or not (
                lim is None or (isinstance(lim, (int, float)) and not isinstance(lim, bool))):
            raise PlanError(f"plan JSON: label must be a string and power_limit_w null or "
                            f"watts, got {label!r}, {lim!r}")
        stages = f["stages"]
        if not isinstance(stages, list):
            raise PlanError("plan JSON: stages must be a list")
        instructions: dict[Instruction, InstructionPlan] = {}
        for entry_of_stage in stages:
            st = _fields(entry_of_stage, "stage", ("stage", "instructions"), ())
            stage, entries = st["stage"], st["instructions"]
            if not isinstance(stage, int) or isinstance(stage, bool) \
                    or not isinstance(entries, list):
                raise PlanError("plan JSON: a stage needs an integer stage and a list of "
                                "instructions")
            for entry in entries:
                ins, ip = InstructionPlan.from_json(entry, stage)
                if ins in instructions:
                    raise PlanError(f"plan JSON: {ins} appears twice")
                instructions[ins] = ip
        return IterationPlan(instructions, None if lim is None else float(lim), label)


class PlanLimits(Protocol):
    """What :meth:`IterationPlan.validate` needs of a GPU (a
    :class:`~kareus.hardware.presets.GPUPreset` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def clock_min_mhz(self) -> float: ...  # lowest lockable SM clock (MHz)
    @property
    def clock_max_mhz(self) -> float: ...  # highest lockable SM clock (MHz)
    @property
    def comm_max_sms(self) -> int: ...  # most SMs one collective kernel may take
    @property
    def static_power_w(self) -> float: ...  # power while blocked on P2P (W)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fields(d: object, what: str, required: tuple[str, ...], optional: tuple[str, ...]
            ) -> dict[str, object]:
    """``d`` as a dict after checking it is a JSON object with the ``required`` keys and no
    keys beyond ``required + optional``; raises :class:`PlanError`."""
    if not isinstance(d, Mapping):
        raise PlanError(f"plan JSON: a {what} must be an object, got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    unknown = sorted(set(d) - set(required) - set(optional))
    if missing or unknown:
        raise PlanError(f"plan JSON: {what} " + "; ".join(
            ([f"lacks {', '.join(missing)}"] if missing else [])
            + ([f"has unknown field(s) {', '.join(map(str, unknown))}"] if unknown else []))
            + f" (fields: {', '.join(required + optional)})")
    return dict(d)
