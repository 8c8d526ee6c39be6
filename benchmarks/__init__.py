"""Benchmarks and device checks, run as scripts (``python benchmarks/NAME.py``) or, for the
device check, as ``python -m benchmarks.device_check.phases``; a package so that no other
installed ``benchmarks`` shadows this one."""
