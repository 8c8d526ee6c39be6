#!/usr/bin/env python
"""Reproduce the Kareus comparison: every registered optimizer on a workload, tables and figures.

    python reproduce.py --workload gpt3-xl
    python reproduce.py --suite paper

The same command as ``kareus reproduce``; both run :mod:`kareus.reproduction` (its docstring and
``--help`` describe the options and the results folder).
"""

import sys

from kareus.reproduction import main

if __name__ == "__main__":
    sys.exit(main())
