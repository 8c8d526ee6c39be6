"""The rich consoles the faces print through, and what they do when their reader goes away.

A reader that closes its end early (``reproduce.py ... | head -1``) breaks the pipe. Rich's own
console then exits 1 at once, without a word, whatever was left to do. The consoles made here go
quiet instead: the stream is pointed at the null device (:func:`point_at_null_device`) and the
command goes on to its end and its own exit status.
"""

from __future__ import annotations

import os
import sys
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def point_at_null_device(stream: IO | None) -> None:
    """Point ``stream``'s file descriptor at the null device, so that what is still written or
    buffered for a reader that has gone is dropped quietly (Python would report it at exit).
    A stream with no real file behind it (captured by a test) is left alone."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())  # type: ignore[union-attr]
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def make_console(stderr: bool = False) -> Console:
    """A rich console on standard output (or ``stderr``), 120 columns unless standard output is
    a terminal, that goes quiet when its reader closes the stream."""
    from rich.console import Console

    class _QuietOnBrokenPipe(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            point_at_null_device(self.file)

    return _QuietOnBrokenPipe(stderr=stderr, width=120 if not sys.stdout.isatty() else None)
