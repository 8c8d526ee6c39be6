"""Every table the suite prints, in one place: rich tables, for the terminal and as text.

``reproduce.py`` prints its comparison tables with :func:`frame_table`; the ``kareus`` commands
render theirs with :func:`render` (the same look, as plain text that ``click.echo`` can print and
tests can read). Markdown tables for files (``tables.md``, ``comparison.md``) are
:mod:`kareus.suite.report`'s.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable, Sequence
from io import StringIO
from typing import TYPE_CHECKING

from kareus.frontier import even_indices

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table

#: Width of text rendered for a pipe or a file (a terminal uses its own).
TEXT_WIDTH = 120


def signed(value: float, digits: int = 1) -> str:
    """``value`` with its sign and ``digits`` decimals, for a change or reduction (%); a value
    that rounds to zero prints ``+0.0``, never ``-0.0`` (a plan 14 µs slower than its reference
    is as fast to the digits shown)."""
    return f"{round(value, digits) + 0.0:+.{digits}f}"


def table(columns: Sequence[str], rows: Iterable[Sequence[object]], *, title: str | None = None,
          caption: str | None = None, left: Iterable[str] = ()) -> "Table":
    """A rich table: ``columns`` right-aligned except those in ``left``; ``None`` and NaN cells
    print empty."""
    from rich.table import Table

    left = set(left)
    t = Table(title=title, caption=caption)
    for c in columns:
        t.add_column(str(c), justify="left" if c in left else "right")
    for row in rows:
        t.add_row(*("" if v is None or (isinstance(v, float) and v != v) else str(v)
                    for v in row))
    return t


def frame_table(frame: "pd.DataFrame", title: str | None = None,
                left: Iterable[str] = ("optimizer", "status", "config")) -> "Table":
    """A pandas frame as a rich table (text columns named in ``left`` aligned left)."""
    return table([str(c) for c in frame.columns], frame.itertuples(index=False), title=title,
                 left=left)


def to_text(t: "Table") -> str:
    """``t`` rendered as plain text (no colour codes), as wide as the terminal or
    :data:`TEXT_WIDTH` characters. Its title goes on lines of its own above it, as wide as the
    text allows: centred over a narrow table, it would break a file's path mid-name."""
    from copy import copy

    from rich.console import Console

    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else TEXT_WIDTH
    buf = StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False)
    if t.title:
        console.print(str(t.title), markup=False, highlight=False)
        t = copy(t)
        t.title = None
    console.print(t)
    return buf.getvalue().rstrip("\n")


def sampled_rows(count: int, limit: int, keep: Iterable[int] = ()) -> list[int]:
    """At most ``limit`` (at least 2) of the indices ``0 .. count - 1``, evenly spread, both
    ends and every index in ``keep`` included (each kept index takes the place of the nearest
    spread one; the ends and ``keep`` alone may take the total past ``limit``), in order; all of
    them when ``count <= limit``."""
    chosen = set(even_indices(count, limit))
    if len(chosen) == count:
        return sorted(chosen)
    kept = {k for k in keep if 0 <= k < count}
    for k in sorted(kept - chosen):
        movable = chosen - kept - {0, count - 1}
        if movable:
            chosen.discard(min(movable, key=lambda i: (abs(i - k), i)))
        chosen.add(k)
    return sorted(chosen)


def render(columns: Sequence[str], rows: Iterable[Sequence[object]], *, title: str | None = None,
           caption: str | None = None, left: Iterable[str] = ()) -> str:
    """:func:`table` as text (:func:`to_text`)."""
    return to_text(table(columns, rows, title=title, caption=caption, left=left))
