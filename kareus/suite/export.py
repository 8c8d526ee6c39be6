"""Export plans for deployment with existing tooling.

- :func:`zeus_frequency_schedule`: per pipeline stage, the ordered list of
  ``(instruction, frequency)`` the Zeus pipeline-frequency optimizer serves (its ``PointSolution``
  reads a Python file holding ``list[list[tuple[str, int]]]``, one list per stage, each in 1F1B
  program order).
- :func:`partition_schedules`: the per-partition communication schedule of every instruction
  (SMs, threads per block and the launch/wait window), as JSON, for the runtime that launches
  the collectives.
"""

from __future__ import annotations

from kareus.graph import IterationGraph, Partition
from kareus.json_types import JsonObject
from kareus.plan import IterationPlan, PartitionSchedule


def zeus_frequency_schedule(graph: IterationGraph, plan: IterationPlan
                            ) -> list[list[tuple[str, int]]]:
    """Per stage, ``[(\"forward\" | \"backward\", MHz), ...]`` in 1F1B order."""
    return [[(ins.direction, int(round(plan.instructions[ins].clock_mhz))) for ins in seq]
            for _, seq in sorted(graph.schedule().items())]


def partition_schedules(graph: IterationGraph, plan: IterationPlan) -> JsonObject:
    """The deployment view of ``plan`` (``schedules.json``): the plan's JSON form
    (:meth:`IterationPlan.to_json`; per stage, in 1F1B order, every instruction's clock,
    nanobatched and per partition key the communication SMs, ``null``: the collective library's
    kernel, and threads per block) under the graph's ``workload`` name, with each window resolved
    on the partition's ops (launch before op ``launch_slot``, wait after op ``wait_after``; -1,
    -1: sequential) and the labels of those ops (``launch_before``, ``wait_after_op``, e.g.
    ``linear_0``). The plan's power limit is not part of it."""
    stages: list[JsonObject] = []
    for stage, seq in plan.stage_programs():
        rows: list[JsonObject] = []
        for ins in seq:
            ip = plan.instructions[ins]
            parts = {p.key: p for p in graph.instruction_graphs[ins.type_key].partitions}
            row = ip.to_json(ins)
            row["partitions"] = {key: {**s.to_json(), **_deployed_window(s, parts.get(key))}
                                 for key, s in ip.schedules}
            rows.append(row)
        stages.append({"stage": stage, "instructions": rows})
    return {"workload": graph.workload, "label": plan.label, "stages": stages}


def _deployed_window(s: PartitionSchedule, part: Partition | None) -> JsonObject:
    """The window of ``s`` resolved on ``part``'s ops, and the labels of its two ops."""
    n = len(part.compute) if part is not None else 0
    start, end = s.window(n) if n else (s.launch_slot, s.wait_after)
    label = (lambda i: part.slots[i] if part is not None and 0 <= i < n else None)  # noqa: E731
    return {"launch_slot": start, "wait_after": end, "launch_before": label(start),
            "wait_after_op": label(end)}


def zeus_solution_text(graph: IterationGraph, plan: IterationPlan) -> str:
    """The Python file Zeus's ``PointSolution`` scheduler evaluates (one list per stage)."""
    sched = zeus_frequency_schedule(graph, plan)
    return "\n".join(["["] + [f"    {stage!r}," for stage in sched] + ["]"]) + "\n"
