"""Rich progress bars for the faces: shown on a terminal, silent everywhere else.

:func:`terminal_progress` gives a :class:`kareus.progress.Progress` that draws one bar per task
on standard error while the work runs, and removes them when it ends, so that the command's own
output (tables, JSON) is untouched. With ``enabled`` false, or when standard output or standard
error is not a terminal, it gives :data:`kareus.progress.SILENT`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kareus.progress import SILENT, Progress, ProgressTask
from kareus.suite.console import make_console

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress, TaskID


class _RichTask:
    def __init__(self, bar: RichProgress, task_id: TaskID) -> None:
        self._bar, self._id = bar, task_id

    def advance(self, amount: int = 1) -> None:
        self._bar.advance(self._id, amount)

    def done(self) -> None:
        self._bar.remove_task(self._id)


class _RichProgress:
    def __init__(self, bar: RichProgress) -> None:
        self._bar = bar

    def start(self, description: str, total: int | None = None) -> ProgressTask:
        return _RichTask(self._bar, self._bar.add_task(description, total=total))


def on_terminal() -> bool:
    """Whether both standard output and standard error are terminals."""
    return sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def terminal_progress(enabled: bool = True) -> Iterator[Progress]:
    """A rich progress display for the duration of the block, or :data:`SILENT`."""
    if not (enabled and on_terminal()):
        yield SILENT
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress as RichProgress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with RichProgress(TextColumn("{task.description:<40}"), BarColumn(bar_width=30),
                      MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                      console=make_console(stderr=True), transient=True) as bar:
        yield _RichProgress(bar)
