"""A guard that makes every NVML setter raise, for runs on a machine whose settings must not move.

On a shared or lent GPU the suite must never change clocks, power limits, persistence, compute,
ECC or MIG mode, and never reset the card. :func:`activate` enforces that for the whole process:

1. every public function of the NVML bindings (``pynvml``, i.e. nvidia-ml-py) whose name says
   it changes something (:data:`SETTER_RE`: ``nvmlDeviceSet*``, ``nvmlDeviceReset*``,
   ``nvmlDeviceClear*``, ``nvmlUnitSet*``, ``nvmlGpuInstanceDestroy`` ...) is replaced by one that
   raises :class:`SetterBlocked`, found by introspection, so setters added in later bindings are
   covered too;
2. the bindings' C-function lookup (``pynvml._nvmlGetFunctionPointer``) refuses the same names
   and its cache of such pointers is emptied, so no Python path reaches a setter in libnvidia-ml;
3. other modules already holding a setter (``from pynvml import nvmlDeviceSet...``) get the
   raising one in its place.

zeus calls ``pynvml.nvmlDeviceSet...`` through the module attribute at call time
(``zeus.device.gpu.nvidia``), so (1) covers zeus whether it is imported before or after. zeus's
daemon (``ZEUSD_SOCK_PATH`` or ``ZEUSD_HOST_PORT`` set) sets clocks over a socket or TCP
instead, past any NVML guard: the device scripts unset both.
:meth:`NvmlGuard.verify` proves the guard is on: it calls every blocked setter and expects the
refusal. Every attempt is recorded (:attr:`NvmlGuard.attempts`).

A process started with ``KAREUS_NVML_GUARD=1`` in its environment activates the guard with
:func:`activate_if_requested` (the GPU worker and ``python -m kareus.backends.gpu.guarded`` do).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from kareus.json_types import JsonObject

from kareus.errors import DeviceError

#: NVML function names that change the card's state (setters, resets, clears, updates,
#: activations, creation and destruction of GPU/compute instances, drain state, GPU removal,
#: counter freezes, register writes), power smoothing's and workload power profiles' included.
SETTER_RE = re.compile(
    r"^nvml(?:Device|Unit|System|GpuInstance|ComputeInstance|VgpuInstance|VgpuType|Gpm)?"
    r"(?:PowerSmoothing|WorkloadPowerProfile)?"
    r"(?:Set|Reset|Clear|Create|Destroy|Modify|Remove|Discover|Update|Freeze|ReadWrite|Activate)"
    r"[A-Z_]?\w*$")

#: Environment variable that asks a process to activate the guard at start.
ENV_VAR = "KAREUS_NVML_GUARD"


class SetterBlocked(DeviceError):
    """An NVML setter was called while the guard is active (the call never reached the card)."""


def _mark_guarded(fn: Callable[..., object]) -> None:
    """Tag ``fn`` as one of the guard's raising stand-ins (``__kareus_guard__``)."""
    setattr(fn, "__kareus_guard__", True)


def is_setter(name: str) -> bool:
    """Whether the NVML function ``name`` changes the card's state."""
    return bool(SETTER_RE.match(name))


@dataclass
class NvmlGuard:
    """The guard over one NVML bindings module (``pynvml``, or a fake with the same names).

    Attributes:
        module: The bindings module guarded (``None``: no NVML bindings are importable, so no
            setter is reachable from Python).
        blocked: Names of the public setters replaced.
        attempts: Every blocked call, as ``"name(args)"``, in order.
    """

    module: object | None
    blocked: list[str] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)
    _originals: dict[str, Callable[..., object]] = field(default_factory=dict, repr=False)
    _pointer_lookup: Callable[..., object] | None = field(default=None, repr=False)
    _rebound: list[tuple[ModuleType, str, object]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def setters(self) -> list[str]:
        """Every setter the bindings module has now (guarded or not)."""
        mod = self.module
        return [] if mod is None else sorted(
            n for n in dir(mod) if is_setter(n) and callable(getattr(mod, n, None)))

    @property
    def active(self) -> bool:
        """Whether every setter of the module raises (vacuously, without NVML bindings)."""
        mod = self.module
        if mod is None:
            return True
        names = self.setters()
        return bool(names) and all(getattr(getattr(mod, n), "__kareus_guard__", False)
                                   for n in names)

    def _refuse(self, name: str) -> Callable[..., None]:
        def refused(*args: object, **kwargs: object) -> None:
            with self._lock:
                self.attempts.append(f"{name}({', '.join(map(repr, args[1:] if args else ()))})")
            raise SetterBlocked(f"{name} refused: NVML setters are blocked for this run "
                                "(kareus.backends.gpu.nvml_guard); the card's settings stay "
                                "as they are")
        refused.__name__ = name
        _mark_guarded(refused)
        return refused

    def _activate(self) -> None:
        mod = self.module
        assert mod is not None
        for name in sorted(dir(mod)):
            fn = getattr(mod, name, None)
            if not callable(fn) or not is_setter(name) or getattr(fn, "__kareus_guard__", False):
                continue
            self._originals[name] = fn
            setattr(mod, name, self._refuse(name))
            self.blocked.append(name)
        lookup = getattr(mod, "_nvmlGetFunctionPointer", None)
        if callable(lookup) and not getattr(lookup, "__kareus_guard__", False):
            self._pointer_lookup = lookup

            def guarded_lookup(name: str, *a: object, **k: object) -> object:
                if is_setter(str(name)):
                    self._refuse(str(name))()
                return lookup(name, *a, **k)

            _mark_guarded(guarded_lookup)
            setattr(mod, "_nvmlGetFunctionPointer", guarded_lookup)
            cache = getattr(mod, "_nvmlGetFunctionPointer_cache", None)
            if isinstance(cache, dict):
                for key in [k for k in cache if is_setter(str(k))]:
                    del cache[key]
        originals = {id(f): n for n, f in self._originals.items()}
        for other in list(sys.modules.values()):
            if other is mod or other is None:
                continue
            try:
                items = list(vars(other).items())
            except TypeError:
                continue
            for attr, val in items:
                orig = originals.get(id(val))
                if orig is not None and val is self._originals[orig]:
                    setattr(other, attr, getattr(mod, orig))
                    self._rebound.append((other, attr, val))

    def verify(self) -> list[str]:
        """Call every blocked setter (and the C lookup with a setter name); returns the names
        that did *not* raise :class:`SetterBlocked` (empty: the guard holds). The calls are
        recorded in :attr:`attempts` like any other and then dropped from it."""
        if self.module is None:
            return []
        n = len(self.attempts)
        leaks = []
        probes = [(name, getattr(self.module, name)) for name in self.setters()]
        lookup = getattr(self.module, "_nvmlGetFunctionPointer", None)
        if self._pointer_lookup is not None and lookup is not None:
            probes.append(("_nvmlGetFunctionPointer('nvmlDeviceSetGpuLockedClocks')",
                           lambda: lookup("nvmlDeviceSetGpuLockedClocks")))
        for name, fn in probes:
            try:
                fn()
            except SetterBlocked:
                continue
            except Exception:  # noqa: BLE001 - anything else means the real function ran
                leaks.append(name)
                continue
            leaks.append(name)
        with self._lock:
            del self.attempts[n:]
        return leaks

    def deactivate(self) -> None:
        """Put the original functions back (tests; a measurement run never does)."""
        mod = self.module
        if mod is None:
            return
        for name, fn in self._originals.items():
            setattr(mod, name, fn)
        if self._pointer_lookup is not None:
            setattr(mod, "_nvmlGetFunctionPointer", self._pointer_lookup)
        for other, attr, val in self._rebound:
            setattr(other, attr, val)
        self._originals.clear()
        self._rebound.clear()
        self._pointer_lookup = None
        self.blocked.clear()

    def describe(self) -> JsonObject:
        """What the guard covers, for a run's record."""
        return {"active": self.active,
                "bindings": None if self.module is None else getattr(self.module, "__name__", "?"),
                "blocked": list(self.blocked), "c_lookup_guarded": self._pointer_lookup is not None,
                "rebound_elsewhere": [f"{getattr(m, '__name__', '?')}.{a}"
                                      for m, a, _ in self._rebound],
                "attempts": list(self.attempts)}


def activate(module: object | None = None) -> NvmlGuard:
    """Guard ``module`` (default: ``pynvml`` if importable) and return the guard. Guarding a
    module that is already guarded adds nothing new (its setters are already the raising ones)."""
    if module is None:
        try:
            module = importlib.import_module("pynvml")
        except ImportError:
            return NvmlGuard(None)
    guard = NvmlGuard(module)
    guard._activate()
    return guard


def activate_if_requested() -> NvmlGuard | None:
    """:func:`activate` when ``KAREUS_NVML_GUARD=1``; raises :class:`DeviceError` if the guard
    does not hold (a process asked to be guarded must never run unguarded)."""
    if os.environ.get(ENV_VAR) != "1":
        return None
    guard = activate()
    leaks = guard.verify()
    if leaks:
        raise DeviceError(f"NVML guard failed: {', '.join(leaks)} did not raise")
    return guard
