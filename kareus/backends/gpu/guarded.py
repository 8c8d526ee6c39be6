"""Run a Python module with every NVML setter blocked (:mod:`kareus.backends.gpu.nvml_guard`):

    python -m kareus.backends.gpu.guarded MODULE [ARGS...]      e.g. ... guarded pytest -m gpu

The guard is activated and verified before ``MODULE`` is imported, and ``KAREUS_NVML_GUARD=1`` is
exported so processes it starts (torchrun workers) guard themselves too. Exit status: the
module's; 2 for a usage error; 1 if the guard does not hold (nothing is run then).
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0].startswith("-"):
        print("usage: python -m kareus.backends.gpu.guarded MODULE [ARGS...]", file=sys.stderr)
        return 2
    from kareus.backends.gpu.nvml_guard import ENV_VAR, activate

    guard = activate()
    leaks = guard.verify()
    if leaks or not guard.active:
        print(f"error: NVML guard does not hold ({', '.join(leaks) or 'setters unguarded'})",
              file=sys.stderr)
        return 1
    os.environ[ENV_VAR] = "1"
    sys.argv = [args[0], *args[1:]]
    try:
        runpy.run_module(args[0], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
