"""Measured partition sweeps in the Kareus artifact's format, and configuration lists to predict.

A sweep CSV (``shared/kareus_artifact/attention_partition/default_clock.csv``) has one row per
configuration: the window ``overlap_start, overlap_end`` (the collective is launched before op
``s`` and compute waits for it after op ``e``; ``-1, -1`` is sequential), ``comm_sm_number`` and
``comm_block_size`` (threads per block), then per repeat ``k``: ``k:time (s)`` (per execution of
the partition) and ``k:total energy (J)`` (both GPUs, static power included). A configuration
CSV needs only the four configuration columns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from kareus.errors import SweepError
from kareus.inputs import file_problem

CONFIG_COLUMNS = ("overlap_start", "overlap_end", "comm_sm_number", "comm_block_size")
_REPEAT = re.compile(r"^(\d+):(time \(s\)|total energy \(J\))$")


@dataclass(frozen=True)
class PartitionConfigs:
    """Configurations of one partition (arrays of equal length).

    Attributes:
        start, end: Window ``(s, e)`` of each configuration.
        sms: SMs of the collective kernel.
        threads: Threads per block.
    """

    start: NDArray[np.int64]
    end: NDArray[np.int64]
    sms: NDArray[np.int64]
    threads: NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.start.size)

    def subset(self, mask: NDArray[np.bool_]) -> "PartitionConfigs":
        return PartitionConfigs(self.start[mask], self.end[mask], self.sms[mask],
                                self.threads[mask])

    def windows(self) -> NDArray[np.int64]:
        """The distinct windows, shape (W, 2), sequential first."""
        return np.unique(np.stack([self.start, self.end], axis=1), axis=0)


@dataclass(frozen=True)
class PartitionSweep:
    """A measured sweep: configurations and the mean of their repeats.

    Attributes:
        configs: The configurations.
        time_s: Mean time per execution (s).
        energy_j: Mean energy per execution of the group's GPUs, static included (J).
        repeats: Repeats averaged per configuration.
    """

    configs: PartitionConfigs
    time_s: NDArray[np.float64]
    energy_j: NDArray[np.float64]
    repeats: int

    def subset(self, mask: NDArray[np.bool_]) -> "PartitionSweep":
        return PartitionSweep(self.configs.subset(mask), self.time_s[mask], self.energy_j[mask],
                              self.repeats)


def _read(path: str | Path) -> pd.DataFrame:
    why = file_problem(path)
    if why is not None:
        raise SweepError(f"{path}: no such file" if why == "does not exist" else f"{path}: {why}")
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise SweepError(f"{path}: no such file") from None
    except pd.errors.ParserError as e:  # a row with more fields than the header
        raise SweepError(f"{path}: not a CSV table ({str(e).splitlines()[0].split(': ')[-1]})"
                         ) from None
    except (OSError, UnicodeDecodeError, pd.errors.EmptyDataError) as e:
        raise SweepError(f"{path}: not a CSV file ({type(e).__name__})") from None
    if not isinstance(df.index, pd.RangeIndex):  # pandas made the surplus first field an index
        raise SweepError(f"{path}: its rows have more fields than the header's {len(df.columns)} "
                         f"columns ({', '.join(map(str, df.columns))})")
    return df


def _shown(value: object) -> str:
    """A cell's value for a message: a numpy scalar as its Python value."""
    item = getattr(value, "item", None)
    return repr(item() if callable(item) else value)


#: Larger than any window index, SM count or block size, small enough for int64 (the range
#: checks below name the real limits).
_MAX_CONFIG_VALUE = 2**31


def _configs(df: pd.DataFrame, path: str, n_ops: int, max_sms: int, max_threads: int,
             op_names: Sequence[str] = ()) -> PartitionConfigs:
    missing = [c for c in CONFIG_COLUMNS if c not in df.columns]
    if missing:
        raise SweepError(f"{path}: missing column(s) {', '.join(missing)}; need "
                         f"{', '.join(CONFIG_COLUMNS)}")
    if df.empty:
        raise SweepError(f"{path}: no rows")
    cols = {}
    for c in CONFIG_COLUMNS:
        v = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(v) | (v % 1 != 0)
        if bad.any():
            row = int(np.flatnonzero(bad)[0]) + 2
            raise SweepError(f"{path}: row {row}: {c} must be an integer, got "
                             f"{_shown(df[c].iloc[row - 2])}")
        huge = np.abs(v) > _MAX_CONFIG_VALUE
        if huge.any():  # every valid value is small; a huge one would wrap in int64
            row = int(np.flatnonzero(huge)[0]) + 2
            raise SweepError(f"{path}: row {row}: {c} {_shown(df[c].iloc[row - 2])} is out of "
                             "range")
        cols[c] = v.astype(np.int64)
    s, e = cols["overlap_start"], cols["overlap_end"]
    k, b = cols["comm_sm_number"], cols["comm_block_size"]
    for i in range(len(df)):
        row = i + 2
        if (s[i] < 0) != (e[i] < 0) or (s[i] < 0 and (s[i], e[i]) != (-1, -1)):
            raise SweepError(f"{path}: row {row}: window ({s[i]}, {e[i]}) must be (-1, -1) "
                             "(sequential) or have both ends >= 0")
        if s[i] >= 0 and not s[i] <= e[i] < n_ops:
            named = (" (" + ", ".join(f"{j} {n}" for j, n in enumerate(op_names)) + ")"
                     if len(op_names) == n_ops else "")
            raise SweepError(f"{path}: row {row}: window ({s[i]}, {e[i]}) outside the "
                             f"partition's {n_ops} ops{named}: need 0 <= start <= end <= "
                             f"{n_ops - 1}")
        if not 1 <= k[i] <= max_sms:
            raise SweepError(f"{path}: row {row}: comm_sm_number {k[i]} outside 1..{max_sms} "
                             "(the collective library's limit)")
        if not 32 <= b[i] <= max_threads or b[i] % 32:
            raise SweepError(f"{path}: row {row}: comm_block_size {b[i]} must be a multiple of "
                             f"32 in 32..{max_threads}")
    return PartitionConfigs(s, e, k, b)


def load_configs(path: str | Path, n_ops: int, max_sms: int, max_threads: int = 1024,
                 op_names: Sequence[str] = ()) -> PartitionConfigs:
    """Configurations to predict: the four configuration columns (others are ignored). A window
    counts the partition's ``n_ops`` ops (``op_names``, if given, name them in a refusal)."""
    return _configs(_read(path), str(path), n_ops, max_sms, max_threads, op_names)


def load_sweep(path: str | Path, n_ops: int, max_sms: int, max_threads: int = 1024,
               op_names: Sequence[str] = ()) -> PartitionSweep:
    """A measured sweep; raises :class:`SweepError` with one line naming the first problem: a
    missing column, a non-positive time or energy, a duplicate configuration, a window outside
    the partition's ops (``op_names``, if given, name them) or a bad SM count / block size."""
    df = _read(path)
    p = str(path)
    configs = _configs(df, p, n_ops, max_sms, max_threads, op_names)
    repeats: dict[int, set[str]] = {}
    for c in df.columns:
        m = _REPEAT.match(str(c))
        if m:
            repeats.setdefault(int(m.group(1)), set()).add(m.group(2))
    full = sorted(r for r, kinds in repeats.items() if len(kinds) == 2)
    if not full:
        raise SweepError(f"{p}: missing measurement columns: need 'k:time (s)' and "
                         "'k:total energy (J)' for at least one repeat k")
    values = {}
    for kind, label in (("time (s)", "time"), ("total energy (J)", "energy")):
        cols = [f"{r}:{kind}" for r in full]
        v = df[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(v) | (v <= 0)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise SweepError(f"{p}: row {i + 2}: {cols[j]} must be a positive number, got "
                             f"{_shown(df[cols[j]].iloc[i])}")
        values[label] = v.mean(axis=1)
    key = np.stack([configs.start, configs.end, configs.sms, configs.threads], axis=1)
    _, first, counts = np.unique(key, axis=0, return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = key[first[np.flatnonzero(counts > 1)[0]]]
        raise SweepError(f"{p}: duplicate configuration window ({dup[0]}, {dup[1]}), "
                         f"{dup[2]} SMs, {dup[3]} threads")
    return PartitionSweep(configs, values["time"], values["energy"], len(full))
