"""The results store: one file per finished (configuration, optimizer) cell.

A cell is keyed by everything that determines its result: workload, parallelism, GPU (and any
preset overrides, hashed), backend, optimizer, optimizer settings, seed, suite version and the
content hashes of the code that computed it (:mod:`kareus.suite.provenance`); beside the key it
records who made it (suite version, git commit). It is written
atomically (temporary file + rename) as soon as the optimizer finishes, so an interrupted sweep
(SIGINT, SIGTERM, a crash inside a plugin) keeps every finished cell; a rerun reuses the cells
whose key matches and computes only the missing ones. One run at a time writes a folder
(:func:`hold_run_folder`); within it, no process sees a half-written file, and a lock serialises
the writers of each configuration's summary.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from kareus.atomic import atomic_write_text
from kareus.json_types import is_finite_number
from kareus.suite.harness import OptimizerRun
from kareus.suite.records import Choice, Point

# A configuration's result files (:func:`kareus.suite.report.write_results` writes them, the
# summary last so that its presence means the configuration finished, and returns them in the
# order of RESULT_FILES; ``timings.json`` only when given).
SUMMARY_JSON = "summary.json"
FRONTIERS_CSV = "frontiers.csv"
COMPARISON_MD = "comparison.md"
FRONTIERS_PNG = "frontiers.png"
BREAKDOWN_PNG = "energy_breakdown.png"
TIMINGS_JSON = "timings.json"
RESULT_FILES = (SUMMARY_JSON, FRONTIERS_CSV, COMPARISON_MD, FRONTIERS_PNG, BREAKDOWN_PNG,
                TIMINGS_JSON)


def run_to_record(run: OptimizerRun, key: dict, made_by: dict | None = None) -> dict:
    """A finished run as JSON: its key, who made it (:func:`kareus.suite.provenance.made_by`),
    status, every measured point, frontier and choice."""
    return {
        "key": key, "made_by": made_by, "name": run.name, "status": run.status, "error": run.error,
        "points": [{**p.to_dict(), "plan_id": p.plan_id} for p in run.points],
        "frontier": [p.plan_id for p in run.frontier], "spread": run.spread,
        "choice": None if run.choice is None else run.choice.to_dict(),
        "wall_s": round(run.wall_s, 3), "optimize_s": round(run.optimize_s, 3),
        **({"refused": True} if run.refused else {}),
    }


@contextmanager
def hold_run_folder(folder: Path, option: str = "--out") -> Iterator[None]:
    """Hold ``folder`` for one run (an exclusive lock on the folder itself, released when the
    run's process ends, however it ends); created if missing. A second run into a held folder is
    refused (:class:`~kareus.errors.InputError`, one line): two runs checking the folder at once
    would each find it theirs, and the later would write over the other's finished results."""
    from kareus.errors import InputError

    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{option} {folder}: another run is writing there now; wait for it "
                             "to finish or give another --out") from None
        except OSError:  # a file system without locks (some network mounts): run unheld
            pass
        yield
    finally:
        os.close(fd)


class MalformedCell(ValueError):
    """A cell file that parses as JSON but does not hold a run (:func:`record_to_run`)."""


def _number(v: object, what: str, *, positive: bool = False) -> float:
    if not is_finite_number(v) or (positive and v <= 0):  # type: ignore[operator]
        raise MalformedCell(f"{what} is {v!r}, not a finite{' positive' if positive else ''} "
                            "number")
    return float(v)


def _point(p: object) -> Point:
    if not isinstance(p, dict):
        raise MalformedCell(f"a point is a {type(p).__name__}, not an object")
    plan_id = p.get("plan_id")
    if isinstance(plan_id, bool) or not isinstance(plan_id, int):
        raise MalformedCell(f"plan_id {plan_id!r} is not an integer")
    return Point(_number(p.get("time_s"), "time_s", positive=True),
                 _number(p.get("energy_j"), "energy_j"),
                 _number(p.get("dynamic_energy_j"), "dynamic_energy_j"),
                 _number(p.get("static_energy_j"), "static_energy_j"), plan_id)


def _choice(c: object) -> Choice | None:
    if c is None:
        return None
    if not isinstance(c, dict) or not isinstance(c.get("label"), str):
        raise MalformedCell("choice is not an object with a label")
    try:
        return Choice(_point(c), c["label"])
    except MalformedCell as e:
        raise MalformedCell(f"choice's {e}") from None


def record_to_run(record: dict) -> OptimizerRun:
    """Rebuild an :class:`OptimizerRun` (without plans) from a record; :class:`MalformedCell`
    when it does not hold one (a hand-edited or foreign file)."""
    try:
        points, frontier = record["points"], record["frontier"]
        if not isinstance(points, list) or not isinstance(frontier, list):
            raise MalformedCell("points and frontier must be lists")
        pts = [_point(p) for p in points]
        by_id = {p.plan_id: p for p in pts}
        missing = [i for i in frontier if not isinstance(i, int) or i not in by_id]
        if missing:
            raise MalformedCell(f"frontier names plan(s) {missing[:3]} that no point has")
        choice = _choice(record.get("choice"))
        spread = record["spread"]
        if not isinstance(spread, list) or not all(isinstance(i, int) and i in by_id
                                                   for i in spread):
            raise MalformedCell("spread must list plan ids of the points")
        made_by = record.get("made_by")
        if not isinstance(record["key"], dict) or not (made_by is None or (
                isinstance(made_by, dict) and all(isinstance(made_by.get(k), (str, type(None)))
                                                  for k in ("suite", "git_commit")))):
            raise MalformedCell("key is not an object, or made_by not one of strings")
        if not isinstance(record["name"], str) or not isinstance(record["status"], str) \
                or not isinstance(record["error"], (str, type(None))):
            raise MalformedCell("name, status or error has the wrong type")
        return OptimizerRun(name=record["name"], status=record["status"], error=record["error"],
                            wall_s=_number(record.get("wall_s", 0.0), "wall_s"),
                            optimize_s=_number(record.get("optimize_s", 0.0), "optimize_s"),
                            points=pts, frontier=[by_id[i] for i in frontier],
                            spread=list(spread), choice=choice,
                            refused=bool(record.get("refused", False)))
    except KeyError as e:
        raise MalformedCell(f"no {e.args[0]!r} field") from None


class ResultsStore:
    """Cells under ``root/<configuration>/cells/<optimizer>.json``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def cell_path(self, config: str, optimizer: str) -> Path:
        return self.root / config / "cells" / f"{optimizer}.json"

    def exists(self, config: str, optimizer: str) -> bool:
        """Whether a cell file exists (readable or not)."""
        return self.cell_path(config, optimizer).is_file()

    def read(self, config: str, optimizer: str) -> dict | None:
        """The cell's stored record, whatever its key and status; ``None`` when missing or
        unreadable (not JSON, or not a run: :class:`MalformedCell`), so that it is recomputed."""
        try:
            record = json.loads(self.cell_path(config, optimizer).read_text())
            if not isinstance(record, dict):
                return None
            record_to_run(record)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, MalformedCell):
            return None
        return record

    def load(self, config: str, optimizer: str, key: dict) -> dict | None:
        """The cell's record if it finished successfully under the same key, else ``None``."""
        record = self.read(config, optimizer)
        if record is None or record.get("key") != key or record.get("status") != "ok":
            return None
        return record

    def optimizers(self, config: str) -> list[str]:
        """Names of the optimizers with a cell file under ``config``, sorted."""
        return sorted(p.stem for p in (self.root / config / "cells").glob("*.json"))

    def check_layout(self, config: str, optimizers: Sequence[str]) -> None:
        """Raise :class:`~kareus.errors.InputError` (one line) before any work when ``config``'s
        folder cannot hold results: it, or its ``cells``, is not a folder, or what the run
        writes there (its ``.lock``, the cells of ``optimizers``, the result files) is not a
        regular file (a folder, or a FIFO or device, which opening would block on or
        damage)."""
        from kareus.errors import InputError

        folder = self.root / config
        files = [".lock", *RESULT_FILES] + [f"cells/{name}.json" for name in optimizers]
        for path, want_dir in ((folder, True), (folder / "cells", True),
                               *((folder / name, False) for name in files)):
            if path.exists() and not (path.is_dir() if want_dir else path.is_file()):
                raise InputError(f"{path}: should be a {'folder' if want_dir else 'regular file'}"
                                 f"; the results folder is damaged (move it away or use another "
                                 f"--out)")

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
