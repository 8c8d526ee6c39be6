"""The fault test: a measuring process killed mid-measurement (SIGTERM, then SIGKILL) must leave
what it finished intact, no partial file, its GPU memory freed and the card's settings unchanged.

The child (``python -m benchmarks.device_check.fault OUT_DIR DEVICE``) holds a buffer on the GPU and
measures GEMM windows back to back, rewriting ``OUT_DIR/windows.json`` atomically after each; the
parent (:func:`run_fault_test`) kills it once two windows are on disk and checks the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kareus.atomic import atomic_write_json
from kareus.backends.gpu.device import Device
from kareus.json_types import JsonObject, record_dict

#: Name of the child's incremental record.
RECORD = "windows.json"


def child(out_dir: Path, device: str) -> None:  # pragma: no cover - runs in a subprocess
    """Measure GEMM windows forever, recording each finished one (killed by the parent)."""
    import torch

    from kareus.backends.gpu.measure import CounterMeter, MeasureConfig, measure_window

    dev: Device
    sync: Callable[[], None]
    if device == "cuda":
        from kareus.backends.gpu.device import open_device

        dev = open_device(0)
        hold = torch.empty(2 << 30, device="cuda", dtype=torch.uint8)  # 2 GiB to be freed
        n, dtype, sync = 8192, torch.bfloat16, torch.cuda.synchronize
    else:
        from kareus.backends.gpu.device import FakeDevice

        dev = FakeDevice(0)
        hold = torch.empty(1 << 20, dtype=torch.uint8)
        n, dtype, sync = 256, torch.float32, (lambda: None)
    a = torch.randn(n, n, device=device, dtype=dtype)
    windows: list[dict[str, float]] = []
    cfg = MeasureConfig(warmup_s=0.05, warmup_steps=1, window_s=0.3, min_steps=2)
    while True:
        res = measure_window(lambda: a @ a, CounterMeter([dev], sync=sync), cfg, sync=sync)
        windows.append({"time_s": res.time_s, "energy_j": res.energy_j, "steps": res.steps})
        atomic_write_json(out_dir / RECORD, {"windows": windows, "held_bytes": hold.numel()})


def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{RECORD}."))


class WatchedCard(Protocol):
    """What the fault test reads of the card: memory in use (bytes, all processes) and the
    processes NVML lists on it."""

    def memory_used_bytes(self) -> int: ...

    def pids(self) -> list[int]: ...


@dataclass(frozen=True)
class KillResult:
    """What one kill left: whether the child was measuring when killed, the windows on disk
    before and after, whether the record is intact and no temporary file stayed (a SIGKILL
    between write and rename may leave one), its exit status, the card's memory in use before
    and after (bytes), how long the memory took to be freed (s; ``None``: not within 15 s), the
    end of its stderr, and whether all of that is as it must be."""

    signal: str
    killed_while_measuring: bool
    windows_before_kill: int
    windows_kept: int
    record_intact: bool
    stray_temp_files: list[str]
    exit_status: int | None
    memory_used_before_bytes: int
    memory_used_after_bytes: int
    memory_freed_after_s: float | None
    stderr_tail: str
    ok: bool

    def to_dict(self) -> JsonObject:
        return record_dict(self)


def one_kill(sig: signal.Signals, folder: Path, device: str, card: WatchedCard,
             timeout_s: float = 60.0) -> KillResult:
    """Start a child, kill it with ``sig`` after two recorded windows, and check what it left."""
    folder.mkdir(parents=True, exist_ok=True)
    mem0 = card.memory_used_bytes()
    env = {**os.environ, "KAREUS_NVML_GUARD": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.device_check.fault", str(folder),
                             device], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    seen = 0
    while time.monotonic() - t0 < timeout_s and proc.poll() is None:
        try:
            seen = len(json.loads((folder / RECORD).read_text())["windows"])
        except (OSError, ValueError, KeyError):
            seen = 0
        if seen >= 2:
            break
        time.sleep(0.05)
    alive = proc.poll() is None
    if alive:
        proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    try:
        kept = json.loads((folder / RECORD).read_text())["windows"]
        intact = all(w["time_s"] > 0 and w["steps"] > 0 for w in kept)
    except (OSError, ValueError, KeyError) as e:
        kept, intact = [], False
        err = f"{err}\nrecord unreadable: {e}"
    stray = _temp_files(folder)
    for name in stray:  # a SIGKILL between write and rename leaves the temp name, never the file
        (folder / name).unlink()
    freed_after = None
    t1 = time.monotonic()
    while time.monotonic() - t1 < 15.0:
        if proc.pid not in card.pids() and card.memory_used_bytes() <= mem0 + (256 << 20):
            freed_after = time.monotonic() - t1
            break
        time.sleep(0.2)
    ok = alive and seen >= 2 and intact and len(kept) >= 2 and freed_after is not None and \
        (not stray or sig == signal.SIGKILL)
    return KillResult(signal=sig.name, killed_while_measuring=alive, windows_before_kill=seen,
                      windows_kept=len(kept), record_intact=intact, stray_temp_files=stray,
                      exit_status=proc.returncode, memory_used_before_bytes=mem0,
                      memory_used_after_bytes=card.memory_used_bytes(),
                      memory_freed_after_s=freed_after, stderr_tail=(err or "")[-1500:], ok=ok)


if __name__ == "__main__":  # pragma: no cover
    from kareus.backends.gpu.nvml_guard import activate_if_requested

    activate_if_requested()
    # SIGTERM ends the process through SystemExit, so an atomic write in progress cleans up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    child(Path(sys.argv[1]), sys.argv[2])
