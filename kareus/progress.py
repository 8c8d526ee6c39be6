"""Progress of long work, reported by the work and shown (or not) by whoever runs it.

Solvers, searches, plan evaluations and sweeps report what they have done through a
:class:`Progress` they are handed; they never decide how it is shown. The faces hand over a rich
progress bar on a terminal (:func:`kareus.suite.progress.terminal_progress`) and :data:`SILENT`
otherwise (``--json``, output piped to a file, tests, worker processes).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class ProgressTask(Protocol):
    """One piece of work being counted."""

    def advance(self, amount: int = 1) -> None:
        """``amount`` more units done."""
        ...

    def done(self) -> None:
        """The work is finished (or abandoned); the task disappears."""
        ...


@runtime_checkable
class Progress(Protocol):
    """Where work reports its progress."""

    def start(self, description: str, total: int | None = None) -> ProgressTask:
        """Begin counting ``description``, of ``total`` units (``None``: unknown)."""
        ...


class _SilentTask:
    def advance(self, amount: int = 1) -> None:
        """Nothing to show."""

    def done(self) -> None:
        """Nothing to close."""


class Silent:
    """Progress that shows nothing."""

    def start(self, description: str, total: int | None = None) -> ProgressTask:
        return _SilentTask()


#: The progress of work nobody watches.
SILENT: Progress = Silent()
