"""Errors raised for workloads that cannot exist or cannot run."""


class WorkloadError(ValueError):
    """A model name, parallel configuration or shape that is invalid (user input error)."""
