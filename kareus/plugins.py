"""The optimizer plugin interface and its registry.

An optimizer is any class with a ``name`` and an ``optimize(problem)`` method returning plans.
Built-ins and third-party optimizers register the same way: an entry point in the group
``kareus.optimizers`` naming the class (see ``pyproject.toml`` and ``examples/``); the
entry point's name is the one runs, cells and tables use (give the class's ``name`` the same; two
packages registering one name for different classes are refused). To try a class before it is
packaged, name it in ``$KAREUS_OPTIMIZERS`` instead (:data:`ENV_OPTIMIZERS`): ``NAME=module:Class``
entries, comma-separated, each module importable (``PYTHONPATH``); they join the installed entry
points under the same rules. The harness
evaluates every returned plan on the problem's backend; optimizers may also call the backend
themselves (to profile, or to pick among candidates).

**Settings.** An optimizer with settings declares them as a class attribute ``Settings``: a
frozen dataclass (subclass :class:`OptimizerSettings`), one typed field with a default per
setting. The registry (:func:`load_optimizer`) builds it once from the run's option dict
(``Problem.options``, from the command line's ``--set NAME=VALUE``): it takes the keys the
dataclass declares and ignores the others (several optimizers of one run share the dict), converts
each value to its field's type, checks it (:meth:`OptimizerSettings.check`) and hands the
instance to the class: ``cls(settings)``. A bad value is :class:`~kareus.errors.InputError`, one
line naming the optimizer, the setting and what it must be; a ``Settings`` the registry cannot
build (not a dataclass, unresolvable annotations, a constructor that fails on its own) is the
plugin's fault, :class:`~kareus.errors.PluginError` (exit 1; in a run, that optimizer fails alone).
An optimizer without ``Settings`` is built as ``cls()`` and sees no settings. Settings that others
make irrelevant (:meth:`OptimizerSettings.unused`) stay out of a cell's key.

**Refusing a job.** An optimizer whose plans need what the job does not allow raises
:class:`~kareus.errors.JobRefused` (a nanobatched plan on a micro-batch that does not split
raises it when validated); the run records it as that optimizer's refusal and the others go on.
One that plans only nanobatched execution declares ``nanobatched_only = True``, so that a run of
only such optimizers on such a job is refused before any work (:func:`nanobatched_only`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Literal, Protocol, Union, runtime_checkable

from kareus.backends.base import Backend
from kareus.errors import InputError, PluginError
from kareus.graph import IterationGraph
from kareus.hardware.knobs import KnobSpace
from kareus.hardware.presets import GPUPreset
from kareus.plan import IterationPlan
from kareus.progress import SILENT, Progress
from workloads.parallel import Workload

if TYPE_CHECKING:
    import pandas as pd

ENTRY_POINT_GROUP = "kareus.optimizers"

#: Environment variable registering optimizers without installing a package: ``NAME=module:Class``
#: entries separated by commas, each module importable from ``sys.path`` (e.g. ``PYTHONPATH``).
ENV_OPTIMIZERS = "KAREUS_OPTIMIZERS"


@dataclass(frozen=True)
class Problem:
    """Everything an optimizer sees.

    Attributes:
        workload: The workload (model + parallelism).
        graph: Its iteration graph.
        backend: Where to measure (simulator or GPUs).
        gpu: The GPU preset.
        knobs: The knob space.
        seed: Seed for randomised optimizers.
        options: The run's settings as given (``name -> value``, from the command line). An
            optimizer reads its typed view of them, the ``settings`` the registry built
            (:func:`load_optimizer`), not this dict.
        progress: Where long work (solver steps, partition searches) reports its progress
            (:mod:`kareus.progress`); silent unless a face shows it.
    """

    workload: Workload
    graph: IterationGraph
    backend: Backend
    gpu: GPUPreset
    knobs: KnobSpace
    seed: int = 0
    options: dict[str, object] = field(default_factory=dict)
    progress: Progress = field(default=SILENT, repr=False, compare=False)


@runtime_checkable
class Optimizer(Protocol):
    """The plugin protocol. An optimizer with settings also has a class attribute ``Settings``
    (a dataclass) and a constructor taking its instance (see the module docstring)."""

    name: str

    def optimize(self, problem: Problem) -> Sequence[IterationPlan]:
        """Return the plans to evaluate (at least one)."""
        ...


# --- Typed settings ------------------------------------------------------------------------------


def coerce_setting(name: str, kind: object, value: object) -> object:
    """``value`` as a setting ``name`` of type ``kind`` holds it, or :class:`InputError` (one
    line). Command-line values arrive as strings: ``int``, ``float`` and ``bool`` fields parse
    them; a ``Literal[...]`` field takes one of its choices; ``X | None`` takes ``None`` (on
    the command line ``none``, in any case) or an ``X``. Numbers must be finite, and a bool is
    not a number. Other types pass unchanged (the dataclass's
    :meth:`~OptimizerSettings.check` judges them)."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        return _to_choice(name, typing.get_args(kind), value)
    if origin in (Union, types.UnionType):
        args = typing.get_args(kind)
        if type(None) in args and (value is None or (
                isinstance(value, str) and value.strip().lower() == "none")):
            return None  # an optional setting given as "none" (the documented default)
        rest = [a for a in args if a is not type(None)]
        return coerce_setting(name, rest[0], value) if len(rest) == 1 else value
    convert = _CONVERTERS.get(kind) if isinstance(kind, type) else None
    return value if convert is None else convert(name, value)


def _to_choice(name: str, choices: tuple[object, ...], value: object) -> object:
    """One of a ``Literal``'s ``choices``: equal and of its type, or its string form."""
    for c in choices:
        if (value == c and type(value) is type(c)) or (isinstance(value, str)
                                                      and value == str(c)):
            return c
    raise InputError(f"setting {name!r} must be one of: {', '.join(map(str, choices))}; "
                     f"got {value!r}")


def _to_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    word = value.strip().lower() if isinstance(value, str) else None
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise InputError(f"setting {name!r} must be true or false, got {value!r}")


def _to_int(name: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise InputError(f"setting {name!r} must be an integer, got {value!r}")


def _to_float(name: str, value: object) -> float:
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise InputError(f"setting {name!r} must be a finite number, got {value!r}")
    return number


def _to_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InputError(f"setting {name!r} must be a string, got {value!r}")
    return value


#: A setting's plain type -> how a value (a command-line string, or a Python value) becomes one.
_CONVERTERS: dict[type, Callable[[str, object], object]] = {
    bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _field_types(cls: type) -> dict[str, object]:
    """The resolved annotation of each field of dataclass ``cls``; :class:`PluginError` when one
    cannot be resolved (a name its module does not define): the plugin's fault, and passing the
    command line's strings on unconverted would hide it."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception as e:  # NameError, AttributeError, TypeError, SyntaxError in a string
        raise PluginError(f"settings {cls.__qualname__}: cannot resolve the field types "
                          f"({type(e).__name__}: {e})".splitlines()[0]) from e
    return {f.name: hints.get(f.name, object) for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class OptimizerSettings:
    """Base of an optimizer's typed settings (a frozen dataclass; see the module docstring).

    Subclasses declare fields with types and defaults (units in their docstrings) and override
    :meth:`check` for what the types do not say (ranges). Building an instance converts and
    checks every field (:func:`coerce_setting`), however it is built, so a settings object that
    exists is valid."""

    def __post_init__(self) -> None:
        for name, kind in _field_types(type(self)).items():
            object.__setattr__(self, name, coerce_setting(name, kind, getattr(self, name)))
        self.check()

    def check(self) -> None:
        """Raise :class:`InputError` (one line naming the setting) for a value out of range."""

    def unused(self) -> frozenset[str]:
        """The settings the others make irrelevant (Kareus's ``budget`` under the exhaustive
        search): a cell's key leaves them out (:func:`settings_view`), so giving one recomputes
        nothing."""
        return frozenset()


def require(ok: bool, name: str, what: str, value: object) -> None:
    """:class:`InputError` ``setting NAME must be WHAT, got VALUE`` unless ``ok``: the one form of
    a settings check."""
    if not ok:
        raise InputError(f"setting {name!r} must be {what}, got {value!r}")


def settings_class(cls: object) -> type | None:
    """The settings dataclass optimizer class ``cls`` declares (its ``Settings``), or ``None``;
    :class:`PluginError` when ``Settings`` is not a dataclass."""
    declared = getattr(cls, "Settings", None)
    if declared is None:
        return None
    if not (isinstance(declared, type) and dataclasses.is_dataclass(declared)):
        where = (f"{cls.__module__}:{cls.__qualname__}" if isinstance(cls, type) else repr(cls))
        label = getattr(cls, "name", None)
        raise PluginError(f"plugin {label!r} ({where}): Settings must be a dataclass, got "
                          f"{declared!r}" if isinstance(label, str) else
                          f"plugin {where}: Settings must be a dataclass, got {declared!r}")
    return declared


def make_settings(settings_cls: type, options: Mapping[str, object], owner: str) -> object:
    """An instance of ``settings_cls`` from ``options``: the keys it declares (the others are
    another optimizer's, and ignored), each converted to its field's type (:func:`coerce_setting`;
    an :class:`OptimizerSettings` does it itself), defaults for the rest. A bad value is
    :class:`InputError` ``OWNER: setting ...`` (one line); a field without a default must be
    given. Anything else the class raises (a :class:`TypeError` from a constructor that does not
    take its own fields, a plain :class:`ValueError`) is the plugin's fault:
    :class:`PluginError` ``OWNER: ...``, so the run fails that optimizer alone."""
    try:
        kinds = _field_types(settings_cls)
    except PluginError as e:
        raise PluginError(f"{owner}: {e}") from e.__cause__
    own = isinstance(settings_cls, type) and issubclass(settings_cls, OptimizerSettings)
    given: dict[str, object] = {}
    try:
        for f in dataclasses.fields(settings_cls):
            if f.name in options:
                v = options[f.name]
                given[f.name] = v if own else coerce_setting(f.name, kinds[f.name], v)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InputError(f"setting {f.name!r} is required (--set {f.name}=VALUE)")
        return settings_cls(**given)
    except InputError as e:  # the user's value (coerce_setting, require, a check)
        raise InputError(f"{owner}: {e}".splitlines()[0]) from None
    except PluginError as e:
        raise PluginError(f"{owner}: {e}".splitlines()[0]) from e
    except Exception as e:  # the settings class's own fault
        raise PluginError(f"{owner}: settings {getattr(settings_cls, '__qualname__', settings_cls)}"
                          f" failed: {type(e).__name__}: {e}".splitlines()[0]) from e


def optimizer_settings(name: str) -> type | None:
    """The settings dataclass of registered optimizer ``name`` (``None``: it has none)."""
    return settings_class(_optimizer_class(name))


def settings_view(name: str, options: Mapping[str, object]) -> dict[str, object]:
    """The keys of ``options`` that registered optimizer ``name`` declares and whose value, as
    its settings hold it (converted and checked: :class:`InputError` for a bad one), is not the
    field's default and that the others do not make irrelevant (:meth:`OptimizerSettings.unused`);
    ``{}`` when none is. What a run records of ``name``'s settings (a cell's key): ``--set
    eta=0.5``, Zeus's default, makes the same key as no ``--set``, and cells made without
    settings keep theirs."""
    declared = optimizer_settings(name) if options else None
    if declared is None:
        return {}
    settings = make_settings(declared, options, name)
    unused = settings.unused() if isinstance(settings, OptimizerSettings) else frozenset()
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(declared)
            if f.name in options and f.name not in unused
            and not _is_default(f, getattr(settings, f.name))}


def _is_default(f: dataclasses.Field, value: object) -> bool:
    """Whether ``value`` equals field ``f``'s default (``1.0`` is ``1``; a bool is no number; a
    field without a default has none: never)."""
    if f.default is not dataclasses.MISSING:
        default = f.default
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        return False
    return isinstance(value, bool) == isinstance(default, bool) and bool(value == default)


def own_settings(name: str, options: Mapping[str, object]) -> dict[str, object]:
    """:func:`settings_view` of ``name``, except that a plugin that cannot be loaded (an import
    that fails, a :class:`PluginError`) gives ``{}``: it fails alone when its cell runs
    (:func:`kareus.suite.harness.load_and_run` records the error) and the other optimizers run.
    The user's bad value is still :class:`InputError`."""
    try:
        return settings_view(name, options)
    except InputError:
        raise
    except Exception:  # a broken or uninstalled plugin: its cell reports it
        return {}


def ignored_settings(name: str, options: Mapping[str, object]) -> list[str]:
    """The keys of ``options`` that optimizer ``name`` declares but its other settings make
    irrelevant (:meth:`OptimizerSettings.unused`: ``budget`` under Kareus's exhaustive search),
    sorted; a command warns about them. ``[]`` for a plugin that cannot be loaded (see
    :func:`own_settings`); a bad value is :class:`InputError`."""
    try:
        declared = optimizer_settings(name) if options else None
        if declared is None:
            return []
        settings = make_settings(declared, options, name)
    except InputError:
        raise
    except Exception:  # a broken or uninstalled plugin: its cell reports it
        return []
    unused = settings.unused() if isinstance(settings, OptimizerSettings) else frozenset()
    return sorted(k for k in options if k in unused)


@runtime_checkable
class ProfileRunner(Protocol):
    """An optimizer that can also run on a measured Zeus-format profile (``kareus perseus``,
    ``kareus envpipe``): the CLI loads it through the registry and calls ``on_profile``."""

    name: str

    def on_profile(self, profile: pd.DataFrame, source: str, stages: int, microbatches: int,
                   static_power_w: float, *, unit_time_s: float,
                   **options: object) -> list[dict]:
        """Check the arguments against ``profile`` (read from ``source``; raise
        :class:`InputError`), run on it, and return point records (``time_s``, ``energy_j``).
        ``options`` may carry ``progress`` (:class:`kareus.progress.Progress`) for long runs."""
        ...


class OptimizerEntry(Protocol):
    """A registered optimizer as :func:`registered_optimizers` lists it: the part of an
    :class:`importlib.metadata.EntryPoint` the suite reads."""

    @property
    def name(self) -> str:
        """The name it is registered under (``perseus``)."""
        ...

    @property
    def value(self) -> str:
        """Where its class lives, ``module:Class`` (``baselines.perseus:Perseus``)."""
        ...

    @property
    def module(self) -> str:
        """The module of :attr:`value` (``baselines.perseus``)."""
        ...

    def load(self) -> Callable[..., object]:
        """Import and return the class (called with no argument, or with its settings, to build
        the optimizer)."""
        ...


#: What an optimizer's name may be: it names the optimizer's result files (``cells/NAME.json``).
PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def environment_entry_points(spec: str | None = None) -> list[EntryPoint]:
    """The optimizers ``$KAREUS_OPTIMIZERS`` (or ``spec``) names, as entry points of
    :data:`ENTRY_POINT_GROUP` (not loaded). Raises :class:`InputError` for an entry that is not
    ``NAME=module:Class``."""
    spec = os.environ.get(ENV_OPTIMIZERS, "") if spec is None else spec
    eps = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, value = (s.strip() for s in item.partition("="))
        module, _, attr = value.partition(":")
        if not (name and module.strip() and attr.strip()):
            raise InputError(f"${ENV_OPTIMIZERS} entry {item!r} is not NAME=module:Class "
                             "(e.g. uniform-clock=uniform_clock:UniformClock)")
        eps.append(EntryPoint(name, value, ENTRY_POINT_GROUP))
    return eps


def _scan_entry_points() -> tuple[dict[str, OptimizerEntry], dict[str, tuple[str, ...]]]:
    """Every registered optimizer by name (sorted; a name registered twice: its first), and
    the targets of each name registered for different classes. Raises :class:`InputError` for a
    name that is not a :data:`PLAIN_NAME`, or where nothing is registered."""
    found: dict[str, OptimizerEntry] = {}
    clashes: dict[str, tuple[str, ...]] = {}
    for ep in [*entry_points(group=ENTRY_POINT_GROUP), *environment_entry_points()]:
        if not PLAIN_NAME.fullmatch(ep.name):
            raise InputError(f"optimizer name {ep.name!r} (registered by {ep.value}) is not a "
                             "plain name (letters, digits, '.', '_' and '-', not starting with "
                             "'.'): result files are named after it; rename it")
        if ep.name in found and found[ep.name].value != ep.value:
            targets = clashes.get(ep.name, (found[ep.name].value,))
            clashes[ep.name] = tuple(dict.fromkeys((*targets, ep.value)))
        found.setdefault(ep.name, ep)
    if not found:
        raise InputError("no optimizers are registered; install the suite with "
                         "`pip install -e .` so its entry points exist")
    return dict(sorted(found.items(), key=lambda kv: kv[0])), clashes


def registered_optimizers() -> dict[str, OptimizerEntry]:
    """Entry points registered under :data:`ENTRY_POINT_GROUP` by installed packages, and those
    ``$KAREUS_OPTIMIZERS`` names (:func:`environment_entry_points`), by name (sorted); not
    loaded. A name two register for different classes is listed once, and using it is refused
    (:func:`name_clash`: which one ran would depend on the install order), so that the others
    still run and ``kareus optimizers`` shows the clash. Raises :class:`InputError` for a name
    that is not a :data:`PLAIN_NAME`."""
    return _scan_entry_points()[0]


def name_clash(name: str) -> str:
    """Why the optimizer name ``name`` cannot be used because two register it for different
    classes, in one line; "" where it is registered once (or not at all)."""
    targets = _scan_entry_points()[1].get(name)
    if not targets:
        return ""
    return (f"optimizer name {name!r} is registered twice, by {' and '.join(targets)}; "
            "rename or uninstall one")


#: The order built-ins run and appear in tables; third-party ones follow alphabetically.
BUILTIN_ORDER = ("megatron", "perseus", "nanobatch", "nanobatch-perseus", "envpipe",
                 "zeus-power-limit", "kareus")


def optimizer_names() -> list[str]:
    """Registered names, built-ins first in their canonical order."""
    names = list(registered_optimizers())
    return [n for n in BUILTIN_ORDER if n in names] + sorted(set(names) - set(BUILTIN_ORDER))


def _optimizer_class(name: str) -> Callable[..., object]:
    """The class registered as ``name``: :class:`InputError` for an unknown name,
    :class:`PluginError` for one whose module cannot be imported (its own fault)."""
    eps = registered_optimizers()
    if name not in eps:
        several = ("; one optimizer here (`reproduce.py --optimizers A,B` runs several)"
                   if "," in name else "")
        raise InputError(f"unknown optimizer {name!r}; registered: "
                         f"{', '.join(optimizer_names())}{several}")
    clash = name_clash(name)
    if clash:
        raise InputError(clash)
    try:
        obj = eps[name].load()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever the plugin's import raises
        raise PluginError(f"plugin {name!r} ({eps[name].value}) cannot be loaded: "
                          f"{type(e).__name__}: {e}".splitlines()[0]) from e
    if not callable(obj):
        raise PluginError(f"plugin {name!r} ({eps[name].value}) is not an optimizer: its entry "
                          f"point names a value of type {type(obj).__name__}, not a class")
    return obj


def _where(cls: object) -> str:
    """Where a registered optimizer class is defined (``module:qualname``), for messages."""
    return (f"{getattr(cls, '__module__', '?')}:"
            f"{getattr(cls, '__qualname__', type(cls).__name__)}")


def load_error(name: str) -> str:
    """Why the registered optimizer ``name`` cannot be used ("" when it can), in one line: its
    module's import error, a ``Settings`` that is not a dataclass or whose defaults it refuses,
    a constructor that raises, or a class without ``name`` and ``optimize`` (it is built as
    :func:`load_optimizer` builds it, with default settings). A setting without a default is
    the user's to give, not a fault; the constructor of such a plugin is not run here, only its
    class checked."""
    clash = name_clash(name)
    if clash:
        return clash
    try:
        load_optimizer(name)
    except PluginError as e:
        return str(e)
    except InputError as e:
        if "is required" not in str(e):
            return f"plugin {name!r}: its default settings are refused: {e}"
        # a setting the user must give: the constructor cannot run without it, but the class
        # can still be checked for the optimizer's two members
        cls = _optimizer_class(name)
        missing = [m for m in ("name", "optimize") if not hasattr(cls, m)]
        if missing:
            return (f"plugin {name!r} ({_where(cls)}) is not an optimizer: "
                    f"it has no `{'` and no `'.join(missing)}`")
    return ""


def setting_names(name: str) -> list[str]:
    """The ``--set`` names registered optimizer ``name`` declares (its ``Settings`` fields, in
    order); ``[]`` for one without settings or one that cannot be loaded."""
    try:
        declared = optimizer_settings(name)
    except (Exception, SystemExit):  # noqa: BLE001 - a broken plugin; load_error says why
        return []
    return [f.name for f in dataclasses.fields(declared)] if declared is not None else []


def nanobatched_only(name: str) -> bool:
    """Whether the optimizer ``name`` plans only nanobatched execution (a class attribute
    ``nanobatched_only = True``), so that a job whose micro-batch does not split into nanobatches
    can be refused before any work; ``False`` for a plugin that cannot be loaded (it fails alone
    when its cell runs)."""
    try:
        return bool(getattr(_optimizer_class(name), "nanobatched_only", False))
    except InputError:
        raise
    except (Exception, SystemExit):  # noqa: BLE001 - a broken plugin
        return False


def load_optimizer(name: str, options: Mapping[str, object] | None = None) -> Optimizer:
    """Instantiate a registered optimizer, with its typed settings built from ``options`` when it
    declares ``Settings`` (see the module docstring); unknown names raise :class:`InputError`
    listing the registered ones, a bad setting :class:`InputError` naming it; a plugin that is
    not an optimizer, whose ``Settings`` cannot be built or whose constructor raises,
    :class:`PluginError`."""
    cls = _optimizer_class(name)
    declared = settings_class(cls)
    settings = None if declared is None else make_settings(declared, options or {}, name)
    try:
        opt = cls() if settings is None else cls(settings)
    except (Exception, SystemExit) as e:  # the plugin's own constructor
        raise PluginError(f"plugin {name!r} ({_where(cls)}) cannot be "
                          f"constructed: {type(e).__name__}: {e}".splitlines()[0]) from e
    if not isinstance(opt, Optimizer):
        missing = [m for m in ("name", "optimize(problem)")
                   if not hasattr(opt, m.split("(")[0])]
        raise PluginError(f"plugin {name!r} ({_where(cls)}) is not an "
                          f"optimizer: it has no `{'` and no `'.join(missing)}`")
    return opt
