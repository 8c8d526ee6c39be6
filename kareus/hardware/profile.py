"""Reading measured profiles in the Zeus pipeline-frequency-optimizer format.

A profile is a CSV with columns ``stage,instruction,frequency,time,energy``: the mean time (s) and
energy (J) of one forward or backward of one microbatch on one pipeline stage at one locked SM
clock (MHz). This is the format the Perseus (SOSP '24) artifact publishes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from kareus.errors import ProfileError
from kareus.inputs import file_problem

COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
INSTRUCTIONS = ("forward", "backward")
#: The most power one GPU may be said to draw (W): a static power or a power limit past this is
#: a unit mistake (mW given as W), not a GPU.
MAX_GPU_POWER_W = 1e4


def power_problem(option: str, watts: float) -> str | None:
    """Why ``watts`` cannot be one GPU's power given with ``option`` (one line), or ``None``."""
    if watts > 0 and watts < MAX_GPU_POWER_W:
        return None
    return f"{option} must be watts above 0 and below {MAX_GPU_POWER_W:,.0f}, got {watts:g}"


#: The longest time one instruction (a micro-batch's forward or backward on one stage) may take in
#: a profile (s): anything longer is a unit mistake (ms or µs given as s).
MAX_INSTRUCTION_S = 3600.0


def load_profile(path: str | Path) -> pd.DataFrame:
    """Load and validate a Zeus-format profile.

    Returns a frame with columns :data:`COLUMNS`, ``stage`` and ``frequency`` as int, sorted by
    (stage, instruction, frequency). Raises :class:`ProfileError` with one line naming the problem
    for a missing file, missing columns, unknown instructions, non-numeric, non-positive or
    non-finite values, and duplicate (stage, instruction, frequency) rows.
    """
    path = Path(path)
    why = file_problem(path)
    if why is not None:
        raise ProfileError(f"profile {str(path)!r} "
                           f"{'is a folder, not a CSV file' if why.startswith('is a folder') else why}")
    try:
        df = pd.read_csv(path, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise ProfileError(f"profile {str(path)!r} is empty; expected a CSV with header "
                           f"{','.join(COLUMNS)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ProfileError(f"profile {str(path)!r} is not a readable CSV: {e}".splitlines()[0]) from None
    except OSError as e:
        raise ProfileError(f"profile {str(path)!r} cannot be read: "
                           f"{e.strerror or e}".splitlines()[0]) from None
    return validate_profile(df, str(path))


def validate_profile(df: pd.DataFrame, source: str = "profile") -> pd.DataFrame:
    """Validate an in-memory profile frame (see :func:`load_profile`)."""
    df = df.rename(columns=lambda c: str(c).strip())
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ProfileError(
            f"{source}: missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}"
        )
    df = df[list(COLUMNS)].copy()
    if df.empty:
        raise ProfileError(f"{source}: no rows")
    df["instruction"] = _instructions(df["instruction"], source)
    for col in ("stage", "frequency", "time", "energy"):
        df[col] = _numbers(df[col], col, source)
    _check_integers(df, source)
    df["stage"] = df["stage"].astype(int)
    df["frequency"] = df["frequency"].astype(int)
    dup = df.duplicated(subset=["stage", "instruction", "frequency"])
    if dup.any():
        r = df[dup].iloc[0]
        raise ProfileError(
            f"{source}: duplicate row for stage {r.stage}, {r.instruction}, {r.frequency} MHz"
        )
    stages_seen = sorted(df["stage"].unique())
    if stages_seen != list(range(len(stages_seen))):
        raise ProfileError(f"{source}: stages must be numbered 0..S-1, got "
                           f"{[int(s) for s in stages_seen]}")
    missing_pairs = [
        (s, ins) for s in stages_seen for ins in INSTRUCTIONS
        if df[(df.stage == s) & (df.instruction == ins)].empty
    ]
    if missing_pairs:
        s, ins = missing_pairs[0]
        raise ProfileError(f"{source}: no rows for stage {s} {ins}")
    return df.sort_values(["stage", "instruction", "frequency"]).reset_index(drop=True)


def _instructions(column: pd.Series, source: str) -> list[str]:
    """The ``instruction`` column stripped, every value one of :data:`INSTRUCTIONS`."""
    if column.isna().any():
        row = int(column.isna().to_numpy().argmax())
        raise ProfileError(f"{source}: empty instruction (data row {row + 1}); "
                           f"valid: {', '.join(INSTRUCTIONS)}")
    values = [str(v).strip() for v in column]
    bad = sorted(set(values) - set(INSTRUCTIONS))
    if bad:
        raise ProfileError(
            f"{source}: unknown instruction(s) {', '.join(map(repr, bad[:5]))}; "
            f"valid: {', '.join(INSTRUCTIONS)}"
        )
    return values


def _numbers(column: pd.Series, col: str, source: str) -> pd.Series:
    """Column ``col`` as finite numbers; ``time``, ``energy`` and ``frequency`` also positive,
    and an instruction's ``time`` (s) at most :data:`MAX_INSTRUCTION_S`."""
    values = pd.to_numeric(column, errors="coerce")
    if values.isna().any():
        row = int(values.isna().to_numpy().argmax())
        raw = column.iloc[row]
        shown = "empty or NaN" if pd.isna(raw) or not str(raw).strip() else repr(str(raw))
        raise ProfileError(
            f"{source}: data row {row + 1}, column {col!r}: {shown} is not a finite number"
        )
    if col == "stage":
        return values
    vals = values.to_numpy(dtype=float)
    bad_rows = [i for i, v in enumerate(vals) if not (math.isfinite(v) and v > 0)]
    if bad_rows:
        v = float(vals[bad_rows[0]])
        what = "is not a finite number" if not math.isfinite(v) else "is not positive"
        raise ProfileError(f"{source}: data row {bad_rows[0] + 1}, column {col!r}: {v:g} {what}")
    long_rows = np.flatnonzero(vals > MAX_INSTRUCTION_S) if col == "time" else ()
    if len(long_rows):
        row = int(long_rows[0])
        raise ProfileError(
            f"{source}: data row {row + 1}, column 'time': {vals[row]:g} s for one "
            f"instruction is over {MAX_INSTRUCTION_S:g} s; time must be seconds per instruction")
    return values


def _check_integers(df: pd.DataFrame, source: str) -> None:
    """Stages are non-negative integers and clocks whole MHz."""
    stages = df["stage"].to_numpy(dtype=float)
    if any(not math.isfinite(s) or s < 0 or s != int(s) for s in stages):
        raise ProfileError(f"{source}: column 'stage' must hold non-negative integers")
    freqs = df["frequency"].to_numpy(dtype=float)
    if any(f != int(f) for f in freqs):
        raise ProfileError(f"{source}: column 'frequency' must hold integer MHz values")


def check_clock_sweep(df: pd.DataFrame, source: str = "profile") -> int:
    """Check that a validated profile sweeps clocks, as a clock tradeoff (Perseus, EnvPipe)
    needs: every (stage, instruction) at two clocks or more, all clocks on one step grid.
    Returns the grid's step (MHz); raises :class:`ProfileError` naming the first problem."""
    for (s, ins), g in df.groupby(["stage", "instruction"]):
        if len(g) < 2:
            raise ProfileError(f"{source}: stage {s} {ins} has one clock only "
                               f"({int(g.frequency.iloc[0])} MHz); a tradeoff needs two or more")
    step = clock_step_mhz(df["frequency"].to_numpy(dtype=int))
    off = df[(df["frequency"] - df["frequency"].min()) % step != 0]
    if not off.empty:
        r = off.iloc[0]
        raise ProfileError(f"{source}: clocks are not on a common step grid of {step} MHz "
                           f"({int(r.frequency)} MHz, stage {r.stage} {r.instruction})")
    return step


def clock_step_mhz(frequencies: "pd.Series | object") -> int:
    """The clock grid's step (MHz): the most common gap between a profile's sorted distinct
    clocks (15 MHz on A100 / A40). Clocks off ``min + k · step`` are not on the grid."""
    import numpy as np

    f = np.unique(np.asarray(frequencies, dtype=int))
    if f.size < 2:
        return 0
    gaps, counts = np.unique(np.diff(f), return_counts=True)
    return int(gaps[np.argmax(counts)])
