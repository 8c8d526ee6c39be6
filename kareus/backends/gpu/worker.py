"""The GPU worker entry point, one process per GPU under torchrun:

    torchrun --standalone --nproc-per-node N -m kareus.backends.gpu.worker JOB.json OUT_DIR

Reads a :class:`~kareus.backends.gpu.serialize.Job`, runs it as this rank
(:func:`kareus.backends.gpu.runner.execute`) and writes ``OUT_DIR/rank<r>.json`` atomically.
Exit status: 0 success, 2 bad input (one line on stderr), 1 internal failure (traceback). Clocks
changed by the job are restored on every exit path (see :mod:`kareus.backends.gpu.clocks`).
"""

from __future__ import annotations

import json
import sys
import traceback

from kareus.errors import InputError


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kareus.backends.gpu.worker JOB.json OUT_DIR", file=sys.stderr)
        return 2
    from kareus.backends.gpu.nvml_guard import activate_if_requested
    from kareus.backends.gpu.runner import execute
    from kareus.backends.gpu.serialize import Job

    try:
        activate_if_requested()  # KAREUS_NVML_GUARD=1: every NVML setter raises in this rank
        with open(args[0]) as f:
            job = Job.from_dict(json.load(f))
        execute(job, args[1])
    except InputError as e:
        print(f"error: {e}".splitlines()[0], file=sys.stderr)
        return e.exit_status
    except Exception:  # noqa: BLE001 - report and fail this rank; torchrun stops the others
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
