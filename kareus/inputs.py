"""Reading the user's input files: what makes a path unreadable as one, and JSON that may be
hostile.

Every reader of a file a user names (a profile, a partition spec or sweep, a Hugging Face config,
a GPU preset, a calibration) asks :func:`file_problem` first, so that a folder, a missing file or
a device such as ``/dev/zero`` (which never ends) is refused in one line instead of read; and
parses JSON with :func:`loads_json`, which reports a document nested too deeply for the parser as
the :class:`json.JSONDecodeError` the readers already refuse.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def file_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` (as given: a ``~`` is the caller's to expand) cannot be read as an input file
    (``"does not exist"``, ``"is a folder, not a file"``, ``"is not a regular file"``, ``"cannot
    be read (...)"`` when the system refuses to look, e.g. a name too long); ``None`` when it
    can."""
    p = Path(path)
    try:
        if p.is_file():
            return None
        if p.is_dir():
            return "is a folder, not a file"
        return "is not a regular file" if p.exists() else "does not exist"
    except OSError as e:  # ENAMETOOLONG, ELOOP: is_file() raises them
        return f"cannot be read ({e.strerror or type(e).__name__})"


def loads_json(text: str) -> object:
    """``json.loads(text)``; a document nested deeper than the parser's recursion limit, or an
    integer longer than Python converts (4,300 digits), raises :class:`json.JSONDecodeError`
    instead of :class:`RecursionError` or a plain :class:`ValueError`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text[:1], 0) from None
    except ValueError as e:  # int("1" * 5000): "Exceeds the limit (4300 digits) ..."
        raise json.JSONDecodeError(str(e).split(";")[0], text[:1], 0) from None
