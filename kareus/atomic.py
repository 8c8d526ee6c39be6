"""Crash-safe file writes: a reader sees the whole new file or the old one, never a part.

The suite's one atomic writer: :func:`atomic_path` hands out a temporary file in the target's
folder and renames it into place once it is complete; :func:`atomic_write_text`,
:func:`atomic_write_json` and the figures of :mod:`kareus.suite.report` all go through it.
:func:`check_writable_dir` refuses an output folder before any work is done,
:func:`check_writable_file` an output file. Record files that
several runs merge their entries into (the benchmarks' ``results/*/summary.json``) are checked
up front by :func:`check_json_record` and merged by :func:`merge_json_record`.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path


#: Mode of a file written for the first time: readable by all, writable by its owner.
_NEW_FILE_MODE = 0o644


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder (created if missing) to write the new file
    to; on success it is renamed to ``path`` (atomic on POSIX file systems), on any failure
    removed. ``suffix`` keeps a file type for writers that infer the format from the name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp makes the file private (0600); give it the old file's mode, or a normal one
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else _NEW_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder, flushed to disk, then
    renamed into place."""
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_json(path: str | Path, obj: object) -> None:
    """Write ``obj`` as JSON (indent 2) to ``path`` atomically; an object JSON cannot encode
    raises before anything is written."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False))


def check_writable_dir(path: str | Path, option: str) -> Path:
    """Make sure results can be written under the folder ``path`` before any work is done:
    create it (and its parents) if missing, write a probe file there, and remove again what it
    created (the writers create their folders, so a run refused later leaves nothing behind).
    Raises :class:`~kareus.errors.InputError` (one line: the folder, the option that named it and
    why) when that fails, e.g. ``/proc/x``, a read-only place or an empty path. Returns ``path``
    with a leading ``~`` expanded (the shell leaves it in ``--out=~/x``); write there."""
    from kareus.errors import InputError

    if not str(path).strip():
        raise InputError(f"{option}: empty path; name a folder")
    path = Path(path).expanduser()
    probed = Path(os.path.abspath(path))  # '..' resolved: each folder made is one to remove
    created: list[Path] = []
    try:
        created = [p for p in (probed, *probed.parents) if not p.exists()]
        if probed.exists() and not probed.is_dir():
            raise NotADirectoryError(20, "it is a file, not a folder")
        probed.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=probed)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InputError(f"{option} {str(path)!r}: cannot write results there "
                         f"({e.strerror or e})") from None
    finally:
        for folder in created:  # deepest first; a failed mkdir left the deepest ones unmade
            try:
                folder.rmdir()
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENAMETOOLONG):
                    continue
                break
    return path


def check_writable_file(path: str | Path, option: str,
                        inputs: Mapping[str, str | Path | None] | None = None) -> Path:
    """Make sure a result file can be written at ``path`` before any work is done: refuse
    (:class:`~kareus.errors.InputError`, one line naming ``option``) an empty path, a folder, a
    file whose folder cannot be written (:func:`check_writable_dir`), or one of the command's
    other files, ``inputs`` (option -> path: what it reads or writes besides). Returns
    ``path`` with a leading ``~`` expanded; write there."""
    from kareus.errors import InputError

    if not str(path).strip():
        raise InputError(f"{option}: empty path; name a file")
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder; give a file's path")
    for other, read in (inputs or {}).items():
        if read is not None and _same_file(path, read):
            raise InputError(f"{option} {path} is also the {other} file, which writing it "
                             f"would replace: give another path")
    check_writable_dir(Path(os.path.abspath(path)).parent, f"{option}'s folder")
    return path


def _same_file(a: str | Path, b: str | Path) -> bool:
    """Whether paths ``a`` and ``b`` name one file (links and relative paths resolved)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare where they would be
        return Path(os.path.abspath(a)).resolve() == Path(os.path.abspath(b)).resolve()


def read_json_record(path: str | Path, option: str) -> dict:
    """The JSON object in the record file ``path``, a file that several runs merge their entries
    into (``results/fidelity/summary.json``); empty when there is no file yet. Raises
    :class:`~kareus.errors.InputError` naming ``option`` when the file cannot be read or holds no
    JSON object, so that a run can refuse it before its work rather than fail after."""
    from kareus.errors import InputError

    p = Path(path)
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{option} {path}: cannot merge into it ({type(e).__name__}: "
                         f"{str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{option} {path}: holds JSON but not an object of entries")
    return data


def check_json_record(path: str | Path | None, option: str) -> None:
    """Refuse (:class:`~kareus.errors.InputError`), before any work, a record file that could not
    be merged into at the end: it is no file that can be written (:func:`check_writable_file`),
    or the file holds no JSON object (:func:`read_json_record`). ``None``: nothing to check."""
    if path is not None:
        check_writable_file(path, option)
        read_json_record(path, option)


def merge_json_record(path: str | Path, entries: dict[str, object], *, option: str = "--write",
                      indent: int = 2, sort_keys: bool = True) -> None:
    """Replace ``entries``' top-level keys in the record file ``path`` (created if missing; its
    other entries kept), written atomically with a final newline; ``sort_keys`` orders the entries
    by name, else new ones follow the file's."""
    merged = {**read_json_record(path, option), **entries}
    if sort_keys:
        merged = dict(sorted(merged.items()))
    atomic_write_text(path, json.dumps(merged, indent=indent) + "\n")
