"""The results store: one file per finished (configuration, optimizer) cell.

A cell is keyed by everything that determines its result: workload, parallelism, GPU (and any
preset overrides), backend, optimizer, optimizer settings, seed and suite version. It is written
atomically (temporary file + rename) as soon as the optimizer finishes, so an interrupted sweep
(SIGINT, SIGTERM, a crash inside a plugin) keeps every finished cell; a rerun reuses the cells
whose key matches and computes only the missing ones. Two runs writing the same folder never see a
half-written file; a lock serialises the writers of each configuration's summary.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kareus.atomic import atomic_write_text
from kareus.suite.harness import OptimizerRun
from kareus.suite.records import Point


def run_to_record(run: OptimizerRun, key: dict) -> dict:
    """A finished run as JSON: its key, status, every measured point, frontier and choice."""
    return {
        "key": key, "name": run.name, "status": run.status, "error": run.error,
        "points": [{**p.to_dict(), "plan_id": p.plan_id} for p in run.points],
        "frontier": [p.plan_id for p in run.frontier], "spread": run.spread, "choice": run.choice,
        "wall_s": round(run.wall_s, 3), "optimize_s": round(run.optimize_s, 3),
    }


def record_to_run(record: dict) -> OptimizerRun:
    """Rebuild an :class:`OptimizerRun` (without plans) from a record."""
    pts = [Point(p["time_s"], p["energy_j"], p["dynamic_energy_j"], p["static_energy_j"],
                 p["plan_id"]) for p in record["points"]]
    by_id = {p.plan_id: p for p in pts}
    run = OptimizerRun(name=record["name"], status=record["status"], error=record["error"],
                       wall_s=record.get("wall_s", 0.0), optimize_s=record.get("optimize_s", 0.0),
                       points=pts, frontier=[by_id[i] for i in record["frontier"]],
                       spread=list(record["spread"]), choice=record.get("choice"))
    return run


class ResultsStore:
    """Cells under ``root/<configuration>/cells/<optimizer>.json``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def cell_path(self, config: str, optimizer: str) -> Path:
        return self.root / config / "cells" / f"{optimizer}.json"

    def load(self, config: str, optimizer: str, key: dict) -> dict | None:
        """The cell's record if it finished successfully under the same key, else ``None``."""
        path = self.cell_path(config, optimizer)
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if record.get("key") != key or record.get("status") != "ok":
            return None
        return record

    def save(self, config: str, optimizer: str, record: dict) -> None:
        atomic_write_text(self.cell_path(config, optimizer), json.dumps(record, indent=1) + "\n")

    @contextmanager
    def lock(self, config: str) -> Iterator[None]:
        """Exclusive lock of one configuration's folder (its summary and figures)."""
        path = self.root / config / ".lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
