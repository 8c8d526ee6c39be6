"""Errors raised for workloads that cannot exist or cannot run: :class:`WorkloadError`, whose
home is :mod:`kareus.errors` (one error root for the suite)."""

from kareus.errors import WorkloadError

__all__ = ["WorkloadError"]
