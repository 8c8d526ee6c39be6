"""Clock control of the GPU backend against a fake NVML device: order of set and restore,
permission errors, restore on exceptions, SIGINT and SIGTERM (in a subprocess)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from kareus.backends.gpu.clocks import ClockController, snap_clock
from kareus.backends.gpu.device import ClockPermissionError, DeviceError, FakeDevice
from kareus.errors import InputError


def test_lock_and_restore_order():
    dev = FakeDevice(power_w=250.0)
    with ClockController([dev], allow=True, handle_signals=False) as c:
        c.set_power_limit(500)
        assert c.lock(1200) == 1200
        assert c.lock(1200) == 1200  # unchanged: no second NVML call
        assert c.lock(1207) == 1200  # snapped down to a supported clock
        assert c.lock(1500) == 1500
        assert dev.sm_clock_mhz() == 1500 and dev.power_limit_w() == 500
    # clocks are reset before the power limit goes back to its entry value
    assert dev.calls == ["power_limit 500", "lock 1200", "lock 1500", "reset_clock",
                         "power_limit 700"]
    assert dev.locked is None and dev.power_limit_w() == 700


def test_restore_is_idempotent_and_covers_every_device():
    devs = [FakeDevice(0), FakeDevice(1)]
    c = ClockController(devs, allow=True, handle_signals=False)
    with c:
        c.lock(990)
        c.restore()
        c.restore()
    for d in devs:
        assert d.calls == ["lock 990", "reset_clock"]


def test_without_allow_nothing_changes_and_it_says_so():
    dev = FakeDevice(permitted=False)  # would refuse, but is never asked
    with ClockController([dev], allow=False) as c:
        assert c.lock(1200) is None
        c.set_power_limit(300)
        assert not c.active
        assert "current clocks" in c.describe()
    assert dev.calls == [] and c.requested == [1200.0]


def test_permission_checked_before_any_change():
    dev = FakeDevice(permitted=False)
    with pytest.raises(ClockPermissionError) as e:
        with ClockController([dev], allow=True, handle_signals=False):
            pass
    assert isinstance(e.value, InputError)
    msg = str(e.value)
    assert "--allow-clock-control" in msg and "CAP_SYS_ADMIN" in msg and "\n" not in msg
    assert dev.calls == []


def test_refusal_midway_restores_what_was_changed():
    class Flaky(FakeDevice):  # NVML refuses low clocks only
        def lock_sm_clock(self, mhz: int) -> None:
            if mhz < 1000:
                self._record(f"refused lock {mhz}")
                raise ClockPermissionError("no permission")
            super().lock_sm_clock(mhz)

    dev = Flaky()
    with pytest.raises(ClockPermissionError):
        with ClockController([dev], allow=True, handle_signals=False) as c:
            c.lock(1410)
            c.lock(900)
    assert dev.calls == ["lock 1410", "refused lock 900", "reset_clock"]
    assert dev.locked is None


def test_a_device_that_cannot_lock_leaves_no_other_locked():
    """NVML's NOT_SUPPORTED (a DeviceError) on the second GPU: the first is restored at once, so
    a caller that goes on after the error does not run the GPUs at different clocks."""
    class Unsupported(FakeDevice):
        def lock_sm_clock(self, mhz: int) -> None:
            raise DeviceError("NVML error 3: Not Supported")

    first, second = FakeDevice(), Unsupported()
    with ClockController([first, second], allow=True, handle_signals=False) as c:
        with pytest.raises(DeviceError):
            c.lock(1410)
        assert first.locked is None and first.calls[-1] == "reset_clock"


def test_cap_sys_admin_is_read_from_the_effective_capabilities(tmp_path):
    """A container's root may lack CAP_SYS_ADMIN (bit 21 of CapEff); NVML's setters need it."""
    from kareus.backends.gpu.device import has_cap_sys_admin

    status = tmp_path / "status"
    status.write_text("Name:\tpython\nCapEff:\t00000000a80425fb\n")  # docker's default set
    assert not has_cap_sys_admin(str(status))
    status.write_text("Name:\tpython\nCapEff:\t000001ffffffffff\n")  # everything
    assert has_cap_sys_admin(str(status))
    assert has_cap_sys_admin(str(tmp_path / "absent"))  # not Linux: root decides


def test_restore_after_exception():
    dev = FakeDevice()
    with pytest.raises(RuntimeError, match="boom"):
        with ClockController([dev], allow=True, handle_signals=False) as c:
            c.lock(1095)
            raise RuntimeError("boom")
    assert dev.calls == ["lock 1095", "reset_clock"]


@pytest.fixture()
def sigint_handler():
    """Sets SIGINT's handler for a test and puts the process's own back after it (a process
    started in the background, as by ``cmd &`` in a script, inherits SIGINT ignored)."""
    own = signal.getsignal(signal.SIGINT)
    yield lambda handler: signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGINT, own)


def test_sigint_restores_then_raises_keyboard_interrupt(sigint_handler):
    sigint_handler(signal.default_int_handler)  # Python's own in a foreground process
    dev = FakeDevice()
    with pytest.raises(KeyboardInterrupt):
        with ClockController([dev], allow=True) as c:
            c.lock(1305)
            signal.raise_signal(signal.SIGINT)
    assert dev.calls == ["lock 1305", "reset_clock"]
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler


def test_sigint_ignored_before_restores_and_stays_ignored(sigint_handler):
    sigint_handler(signal.SIG_IGN)
    dev = FakeDevice()
    with ClockController([dev], allow=True) as c:
        c.lock(1305)
        signal.raise_signal(signal.SIGINT)
        assert dev.calls == ["lock 1305", "reset_clock"]  # restored on the signal, not at exit
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_lock_outside_with_block_is_an_error():
    with pytest.raises(RuntimeError):
        ClockController([FakeDevice()], allow=True).lock(1000)


def test_fake_device_rejects_unsupported_clock():
    with pytest.raises(DeviceError):
        FakeDevice().lock_sm_clock(1001)
    assert snap_clock(1001, [1005, 990, 975]) == 990
    assert snap_clock(100, [1005, 990]) == 990


def test_sigterm_restores_clocks_and_exits(tmp_path):
    log = tmp_path / "nvml.log"
    script = textwrap.dedent(f"""
        import time
        from kareus.backends.gpu.clocks import ClockController
        from kareus.backends.gpu.device import FakeDevice
        dev = FakeDevice(log_path={str(log)!r})
        with ClockController([dev], allow=True) as c:
            c.set_power_limit(450)
            c.lock(1155)
            print("locked", flush=True)
            time.sleep(60)
        print("not reached", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:  # pragma: no cover - only on failure
            proc.kill()
    assert rc == -signal.SIGTERM  # terminated by the signal, after the handler ran
    assert "not reached" not in proc.stdout.read()
    assert log.read_text().splitlines() == ["power_limit 450", "lock 1155", "reset_clock",
                                            "power_limit 700"]
