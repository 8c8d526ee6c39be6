"""Clock control with guaranteed restore: :class:`ClockController`.

Plans lock one SM clock per pipeline instruction (and optionally a board power limit). Changing
them is off unless the caller passes ``allow=True`` (``--allow-clock-control`` at the CLI); without
it every request is recorded and ignored, and the GPU runs at whatever clocks it runs at.

With control allowed, the controller

- checks the permission of every device *before* changing anything (:class:`ClockPermissionError`,
  an :class:`~kareus.errors.InputError`, with a one-line fix);
- restores, in reverse order of change (SM clock locks first, then power limits back to the values
  read on entry), on normal exit, on an exception, on SIGINT and SIGTERM (handlers restore, then
  hand the signal on: SIGINT raises ``KeyboardInterrupt`` as usual, SIGTERM terminates the
  process with the default action) and at interpreter exit (``atexit``), whichever comes first;
  restoring twice is harmless.

Units: MHz and W.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType, TracebackType
from typing import TypeAlias

from kareus.backends.gpu.device import Device
from kareus.errors import ClockPermissionError, DeviceError

#: A signal disposition as :func:`signal.getsignal` returns it (``None``: not set from Python).
_Handler: TypeAlias = "Callable[[int, FrameType | None], object] | int | signal.Handlers | None"

#: Signals whose arrival restores the clocks before the process acts on them.
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def snap_clock(mhz: float, supported: Sequence[int]) -> int:
    """The highest supported clock not above ``mhz`` (the lowest supported one if all are above)."""
    below = [c for c in supported if c <= mhz + 0.5]
    return max(below) if below else min(supported)


class ClockController:
    """Locks SM clocks and power limits on some GPUs and always puts them back.

    Args:
        devices: The GPUs this process controls (usually one: its own rank's).
        allow: Whether changing clocks and limits is permitted at all.
        handle_signals: Install SIGINT/SIGTERM handlers while active (only possible from the main
            thread; elsewhere the ``atexit`` hook and ``__exit__`` still restore).

    Use as a context manager::

        with ClockController([dev], allow=True) as clocks:
            clocks.lock(1200)   # before an instruction
            ...
    """

    def __init__(self, devices: Sequence[Device], allow: bool, *,
                 handle_signals: bool = True) -> None:
        self.devices = list(devices)
        self.allow = bool(allow)
        self.handle_signals = handle_signals
        self._locked: dict[int, int] = {}  # device position -> locked MHz
        self._orig_limits: dict[int, float] = {}  # device position -> W read on entry
        self._changed_limits: set[int] = set()
        self._supported: dict[int, list[int]] = {}
        self._prev_handlers: dict[int, _Handler] = {}
        self._entered = False
        self._lock = threading.RLock()
        self.requested: list[float] = []  # every clock asked for (MHz), allowed or not

    # ------------------------------------------------------------------ description
    @property
    def active(self) -> bool:
        """Whether clocks are actually being controlled."""
        return self.allow

    def describe(self) -> str:
        """One line saying how the GPU clocks were handled."""
        if self.allow:
            return "SM clocks locked per instruction as the plan says (restored afterwards)"
        return ("clock control off (no --allow-clock-control): plans ran at the GPU's current "
                "clocks; plan clocks were not applied")

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> "ClockController":
        if self.allow:
            for d in self.devices:
                ok, why = d.control_permission()
                if not ok:
                    raise ClockPermissionError(f"--allow-clock-control: GPU {d.index}: {why}")
            for i, d in enumerate(self.devices):
                self._orig_limits[i] = d.power_limit_w()
                self._supported[i] = d.supported_sm_clocks_mhz()
            atexit.register(self.restore)
            if self.handle_signals and threading.current_thread() is threading.main_thread():
                for sig in HANDLED_SIGNALS:
                    self._prev_handlers[sig] = signal.getsignal(sig)
                    signal.signal(sig, self._on_signal)
        self._entered = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.restore()
        finally:
            self._uninstall()
            if self.allow:
                atexit.unregister(self.restore)
            self._entered = False

    # ------------------------------------------------------------------ control
    def lock(self, mhz: float) -> int | None:
        """Lock every device's SM clock to the supported clock nearest below ``mhz``; returns the
        clock locked, or ``None`` when control is off (nothing changes then)."""
        self.requested.append(float(mhz))
        if not self.allow:
            return None
        if not self._entered:
            raise RuntimeError("ClockController.lock() outside its `with` block")
        with self._lock:
            target = None
            for i, d in enumerate(self.devices):
                target = snap_clock(mhz, self._supported[i])
                if self._locked.get(i) == target:
                    continue
                try:
                    d.lock_sm_clock(target)
                except (ClockPermissionError, DeviceError):  # refused, or not supported here:
                    self.restore()  # leave no device locked at another's clock
                    raise
                self._locked[i] = target
            return target

    def set_power_limit(self, watts: float) -> None:
        """Set every device's board power limit (W); restored to the entry value on exit.
        A no-op when control is off."""
        if not self.allow:
            return
        if not self._entered:
            raise RuntimeError("ClockController.set_power_limit() outside its `with` block")
        with self._lock:
            for i, d in enumerate(self.devices):
                try:
                    d.set_power_limit_w(watts)
                except ClockPermissionError:
                    self.restore()
                    raise
                self._changed_limits.add(i)

    def restore(self) -> None:
        """Reset locked SM clocks, then power limits to their entry values. Idempotent; tries
        every device even if one fails, then raises the first failure."""
        with self._lock:
            errors: list[Exception] = []
            for i in sorted(self._locked):
                try:
                    self.devices[i].reset_sm_clock()
                except (DeviceError, ClockPermissionError) as e:
                    errors.append(e)
            self._locked.clear()
            for i in sorted(self._changed_limits):
                try:
                    self.devices[i].set_power_limit_w(self._orig_limits[i])
                except (DeviceError, ClockPermissionError) as e:
                    errors.append(e)
            self._changed_limits.clear()
            if errors:
                raise errors[0]

    # ------------------------------------------------------------------ signals
    def _uninstall(self) -> None:
        for sig, prev in self._prev_handlers.items():
            try:
                signal.signal(sig, prev)
            except (ValueError, TypeError):  # pragma: no cover - not main thread / odd handler
                pass
        self._prev_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        try:
            self.restore()
        finally:
            self._uninstall()
            if callable(prev):
                prev(signum, frame)  # e.g. default_int_handler -> KeyboardInterrupt
            elif prev != signal.SIG_IGN:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)  # the default action: terminate
