"""Typed errors. :class:`InputError` and its subclasses are user mistakes (exit status 2)."""

from workloads.errors import WorkloadError


class InputError(ValueError):
    """Bad user input: unknown name, malformed file, impossible setting (exit status 2)."""


class ProfileError(InputError):
    """A measured profile (Zeus format CSV) that cannot be used."""


class PresetError(InputError):
    """An unknown GPU preset or an invalid preset parameter."""


class PlanError(InputError):
    """A plan that does not fit its iteration graph (unknown instruction, clock off the grid)."""


#: Every exception type that means "the user gave bad input".
USER_ERRORS: tuple[type[Exception], ...] = (InputError, WorkloadError)
