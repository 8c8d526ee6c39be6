"""The suite's exceptions, under one root, :class:`KareusError`.

Each class says how a command ends when it escapes: its ``exit_status`` (2: the user's input
cannot work, one line naming the problem; 1: an internal failure). :mod:`kareus.exit_status` reads
it; nothing else maps errors to statuses.
"""


class KareusError(Exception):
    """Root of every error the suite raises on purpose."""

    #: Exit status of a command that this error ends (1: internal failure).
    exit_status: int = 1


class InputError(KareusError, ValueError):
    """Bad user input: unknown name, malformed file, impossible setting (exit status 2)."""

    exit_status = 2


class WorkloadError(InputError):
    """A model name, parallel configuration or shape that is invalid (user input error)."""


class ProfileError(InputError):
    """A measured profile (Zeus format CSV) that cannot be used."""


class PresetError(InputError):
    """An unknown GPU preset or an invalid preset parameter."""


class PlanError(InputError):
    """A plan that does not fit its iteration graph (unknown instruction, clock off the grid)."""


class JobRefused(PlanError):
    """An optimizer cannot plan this job as asked: its plans need what the job does not allow
    (nanobatched plans on a micro-batch that does not split into nanobatches), or a setting does
    not fit the job (a solver unit longer than its fastest instruction). The user's input, for
    that optimizer (exit status 2); a run records it as that optimizer's refusal (``refused``)
    and the others go on."""


class SolverTimeout(KareusError):
    """An exact solve stopped at its time limit before it proved its answer optimal."""


class SweepError(InputError):
    """A partition sweep or configuration list that cannot be used."""




class ClockPermissionError(InputError):
    """Clock or power-limit control was asked for without the permission to do it."""


class PluginError(KareusError, RuntimeError):
    """A plugin's own fault (exit status 1): an optimizer returned something the harness cannot
    evaluate, or declares ``Settings`` the registry cannot build (not a dataclass, annotations
    that do not resolve, a constructor that rejects its own fields). Not the user's input: a
    run records it as that optimizer's failure and the others go on."""


class AllOptimizersFailed(KareusError, RuntimeError):
    """Every optimizer of a run failed (exit status 1: nothing was wrong with the input, and
    nothing came out; each failure is printed and kept in the results)."""


class DeviceError(KareusError, RuntimeError):
    """NVML failed for a reason other than permissions (internal failure, exit status 1)."""
