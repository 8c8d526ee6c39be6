"""The device check: one prepared run on one lent GPU, in phases, each writing its record the
moment it ends (run by ``benchmarks/device_check.sh``; ``--fake`` is the CPU dry run).

    python -m benchmarks.device_check.phases --out OUTDIR [--only P,Q | --from P] [--fake]

Before anything else the NVML setter guard is activated and verified
(:mod:`~kareus.backends.gpu.nvml_guard`), and the card's settings are read
(:mod:`~kareus.backends.gpu.settings`); the summary compares them with the settings at the end
and fails loudly on any difference. Phases, one JSON file each under OUTDIR (written atomically):

========== ============================================================================
env        guard, versions (driver, CUDA, torch, NCCL, NVML), the card, energy counter
power      idle power, spin-wait power (static), bf16 GEMM and HBM copy ceilings
fault      SIGTERM and SIGKILL mid-measurement (:mod:`~benchmarks.device_check.fault`)
pytest     ``pytest -m gpu tests/test_gpu_cuda.py`` under the guard, no clock control
workload   gpt3-xl and llama3.2-3b, 2 layers, TP1 PP1 on the GPU backend: the iteration,
           each instruction, each op, beside the simulator at the observed clock
contention a communication-like kernel on k SMs beside a GEMM, attention, an elementwise op
summary    per-phase status, settings after and their difference, guard attempts
========== ============================================================================

plus ``log.txt``: 8 files at most. A phase whose record exists is skipped (rerun it with
``--only``); ``--from P`` starts at P. Exit status: 0 all ran phases ok and settings unchanged;
1 otherwise; 2 bad input (unknown phase, no GPU without ``--fake``).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kareus.atomic import atomic_write_json, atomic_write_text
from kareus.errors import InputError
from kareus.json_types import Json, JsonObject

if TYPE_CHECKING:
    from kareus.backends.gpu.backend import GPUBackend
    from kareus.backends.gpu.device import NvmlDevice
    from kareus.backends.gpu.nvml_api import NvmlLike
    from kareus.backends.gpu.nvml_guard import NvmlGuard
    from kareus.backends.gpu.settings import CardSettings
    from kareus.hardware.presets import GPUPreset

#: In run order: the fault check is short and guards what the later ones rely on, so it runs
#: before the long phases that a time limit cuts first.
PHASES = ("env", "power", "fault", "pytest", "workload", "contention")
MODELS = ("gpt3-xl", "llama3.2-3b")


@dataclass
class Settings:
    """How long and how big each phase is (s; shapes). The defaults fit 8 minutes on one H200;
    :meth:`dry` shrinks everything for the CPU dry run."""

    window_s: float = 2.0
    warmup_s: float = 0.5
    idle_s: float = 3.0
    gemm_n: int = 8192
    copy_bytes: int = 4 << 30
    pytest_limit_s: float = 150.0
    models: tuple[str, ...] = MODELS
    layers: int = 2
    mbs: int = 2
    seq: int = 2048
    microbatches: int = 2
    max_ops: int | None = None
    contention_ks: tuple[int, ...] = (0, 8, 16, 32, 64)
    contention_window_s: float = 1.0
    warmup_steps: int = 2
    min_steps: int = 2

    @classmethod
    def dry(cls) -> "Settings":
        return cls(window_s=0.2, warmup_s=0.05, idle_s=0.2, gemm_n=128, copy_bytes=1 << 20,
                   pytest_limit_s=120.0, models=("gpt3-xl",), layers=2, mbs=2, seq=32,
                   microbatches=1, max_ops=1, contention_window_s=0.1, warmup_steps=1,
                   min_steps=1)


@dataclass
class Card:
    """The GPU under test: its NVML bindings (real or fake), a device over them, and torch's
    device string."""

    nvml: NvmlLike
    dev: NvmlDevice
    device: str
    fake: bool

    def settings(self) -> CardSettings:
        """The card's settings now."""
        from kareus.backends.gpu.settings import snapshot

        return snapshot(self.nvml, self.dev.nvml_index)

    def memory_used_bytes(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.dev.handle).used)

    def pids(self) -> list[int]:
        try:
            return [int(p.pid) for p in
                    self.nvml.nvmlDeviceGetComputeRunningProcesses(self.dev.handle)]
        except Exception:  # noqa: BLE001 - not supported in some VMs: judge by memory only
            return []


@dataclass
class Run:
    """One run of the check: where records go, the card, the guard, the log."""

    out: Path
    card: Card
    cfg: Settings
    guard: NvmlGuard
    settings_before: CardSettings
    lines: list[str] = field(default_factory=list)

    def log(self, msg: str) -> None:
        self.lines.append(msg)
        print(msg, flush=True)
        atomic_write_text(self.out / "log.txt", "\n".join(self.lines) + "\n")


# ============================================================================== phases


def phase_env(run: Run) -> JsonObject:
    """Versions, the card, the guard and the energy counter's update period."""
    import torch

    from benchmarks.device_check.probes import counter_update_period

    nvml, dev = run.card.nvml, run.card.dev

    def text(fn: Callable[[], str | bytes | int]) -> str | int:
        try:
            v = fn()
            return v.decode() if isinstance(v, bytes) else v
        except Exception as e:  # noqa: BLE001
            return f"unavailable: {e}"

    cuda = run.card.device == "cuda"
    props = torch.cuda.get_device_properties(0) if cuda else None
    rec: JsonObject = {
        "host": platform.node(), "python": sys.version.split()[0], "fake_device": run.card.fake,
        "driver": text(nvml.nvmlSystemGetDriverVersion),
        "nvml": text(nvml.nvmlSystemGetNVMLVersion),
        "cuda_driver": text(nvml.nvmlSystemGetCudaDriverVersion),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "nccl": text(lambda: ".".join(map(str, torch.cuda.nccl.version()))) if cuda else None,
        "zeus": text(_zeus_version),
        "gpu_name": text(dev.name), "memory_bytes": text(dev.memory_bytes),
        "sms": props.multi_processor_count if props else None,
        "shared_memory_per_block_optin": getattr(props, "shared_memory_per_block_optin", None),
        "max_sm_clock_mhz": text(dev.max_sm_clock_mhz), "sm_clock_mhz": text(dev.sm_clock_mhz),
        "compile_kernel": hasattr(torch.cuda, "_compile_kernel"),
        "guard": run.guard.describe(), "settings_before": run.settings_before.to_dict(),
        # the energy counter covers the whole board: another process on the card (or a MIG
        # slice of it, settings_before's mig_mode) would be in every window measured here. NVML
        # lists host PIDs, so in a container this process may be among them under another PID.
        "processes_on_card": text(lambda: sorted(
            int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(dev.handle))),
        "own_pid": os.getpid(),
        "memory_used_bytes_at_start": text(run.card.memory_used_bytes),
    }
    try:  # the record keeps the versions above when the card's energy counter cannot be read
        counter = counter_update_period(dev, 1.0 if not run.card.fake else 0.2)
        rec["energy_counter"] = counter.to_dict()
        works = bool(counter.works)
    except Exception as e:  # noqa: BLE001
        rec["energy_counter"] = f"unavailable: {type(e).__name__}: {e}"
        works = False
    rec["ok"] = works and run.guard.active
    return rec


def _zeus_version() -> str:
    import importlib

    return str(importlib.import_module("zeus").__version__)


def phase_power(run: Run) -> JsonObject:
    """Idle and spin-wait power; GEMM and HBM ceilings with their power and clock."""
    from benchmarks.device_check import probes
    from kareus.backends.gpu.measure import MeasureConfig

    c, dev, device = run.cfg, run.card.dev, run.card.device
    mc = MeasureConfig(warmup_s=c.warmup_s, warmup_steps=1, window_s=c.window_s, min_steps=2)
    res = [probes.idle_power(dev, device, c.idle_s), probes.spin_power(dev, device, mc),
           probes.gemm_ceiling(dev, device, mc, n=c.gemm_n),
           probes.copy_bandwidth(dev, device, mc, nbytes=c.copy_bytes)]
    for r in res:
        run.log(f"  {r.name}: {r.power_w:.1f} W, SM clock {r.sm_clock_mhz or 0:.0f} MHz"
                + (f", {r.rate:.3e} {r.rate_unit}" if r.rate else ""))
    return {"probes": [r.to_dict() for r in res],
            "ok": all(r.time_s > 0 and r.energy_j > 0 for r in res)}


def phase_pytest(run: Run) -> JsonObject:
    """The CUDA tests under the guard (clock control off), with a wall-clock limit."""
    env = {k: v for k, v in os.environ.items() if k != "KAREUS_ALLOW_CLOCK_CONTROL"}
    cmd = [sys.executable, "-m", "kareus.backends.gpu.guarded", "pytest", "-m", "gpu", "-q",
           "-p", "no:cacheprovider", "-rs", "tests/test_gpu_cuda.py"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=run.cfg.pytest_limit_s,
                              cwd=Path(__file__).resolve().parents[2])
        rc, out, summary = proc.returncode, proc.stdout + proc.stderr, proc.stdout
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        summary = out
    # pytest's summary line ends its stdout (stderr, after it in ``out``, may hold warnings)
    tail = summary.strip().splitlines()[-1] if summary.strip() else ""
    counts = {w: int(n) for n, w in
              (x.split()[:2] for x in tail.strip("= ").split(", ") if x[:1].isdigit())
              if n.isdigit()} if " in " in tail else {}
    run.log(f"  pytest exit {rc}: {tail}")
    return {"command": " ".join(cmd), "exit_status": rc, "summary": tail, "counts": counts,
            "wall_s": time.monotonic() - t0, "log_tail": out[-6000:], "ok": rc == 0}


def _backend(run: Run, preset: GPUPreset) -> GPUBackend:
    from kareus.backends.gpu import GPUBackend
    from kareus.backends.gpu.measure import MeasureConfig

    mc = MeasureConfig(warmup_s=run.cfg.warmup_s, warmup_steps=run.cfg.warmup_steps,
                       window_s=run.cfg.window_s, min_steps=run.cfg.min_steps)
    if run.card.fake:
        return GPUBackend(preset, device="cpu", dtype="float32", fake_device=True, measure=mc,
                          gpu_name="fake " + run.card.dev.name())
    return GPUBackend.create(preset, measure=mc, announce=False, accept_unlisted_gpu=True)


def _preset(run: Run) -> GPUPreset:
    from kareus.backends.gpu.environment import match_preset
    from kareus.hardware.presets import get_preset

    return get_preset(match_preset(run.card.dev.name(), run.card.dev.memory_bytes()) or "h200")


def phase_workload(run: Run) -> JsonObject:
    """Each model: the default plan's iteration, each instruction and each op at the card's
    clock, beside the simulator's h200 prediction at the clock observed."""
    from kareus.backends.base import Point
    from kareus.backends.gpu.calibrate import observed_clock, measure_ops, snap_to_grid
    from kareus.backends.gpu.results import PlanResult
    from kareus.backends.gpu.serialize import reduced_workload
    from kareus.backends.sim import SimulatorBackend
    from kareus.energy import measured_energy
    from kareus.plan import InstructionPlan, IterationPlan

    c = run.cfg
    preset = _preset(run)
    backend = _backend(run, preset)
    sim = SimulatorBackend(preset)
    models: dict[str, JsonObject] = {}
    oks: dict[str, bool] = {}
    path = run.out / "workload.json"
    for name in c.models:
        rec: JsonObject = {}
        try:
            w = reduced_workload(name, c.layers, tp=1, pp=1, dp=1, mbs=c.mbs, seq=c.seq,
                                 microbatches=c.microbatches)
            g = backend.bind(w)
            plan = IterationPlan.uniform(g, preset.clock_max_mhz, label="megatron")
            res = backend.evaluate_plan(g, plan)
            f = snap_to_grid(observed_clock(backend, preset.clock_max_mhz), preset)
            pred = sim.evaluate_plan(g, IterationPlan.uniform(g, f))
            rank0 = backend.last_run[0]
            measured, simulated = Point.from_result(res), Point.from_result(pred)
            rec["iteration"] = {"measured": measured.to_dict(), "simulated": simulated.to_dict(),
                                "clock_mhz": f, "losses": list(rank0.losses)
                                if isinstance(rank0, PlanResult) else None}
            instructions: list[JsonObject] = []
            rec["instructions"] = instructions
            for key in sorted(g.instruction_graphs):
                cost = backend.evaluate_instruction(g, key, InstructionPlan.make(
                    preset.clock_max_mhz))
                fi = snap_to_grid(observed_clock(backend, preset.clock_max_mhz), preset)
                sc = sim.evaluate_instruction(g, key, InstructionPlan.make(fi))
                instructions.append({
                    "stage": key[0], "direction": key[1], "clock_mhz": fi,
                    "time_measured": cost.time_s, "time_sim": sc.time_s,
                    "energy_measured": measured_energy(cost.dynamic_energy_j,
                                                       backend.static_power_w, cost.time_s),
                    "energy_sim": measured_energy(sc.dynamic_energy_j, preset.static_power_w,
                                                  sc.time_s)})
            ops = measure_ops(backend, w, preset.clock_max_mhz, limit=c.max_ops)
            rec["ops"] = [o.to_dict() for o in ops]
            run.log(f"  {name}: {measured.time_s * 1e3:.1f} ms / "
                    f"{measured.energy_j:.1f} J per iteration measured; simulator at "
                    f"{f:.0f} MHz {simulated.time_s * 1e3:.1f} ms / "
                    f"{simulated.energy_j:.1f} J; {len(ops)} ops")
            rec["ok"] = oks[name] = True
        except Exception as e:  # noqa: BLE001 - keep the other model's measurement
            error = f"{type(e).__name__}: {e}".splitlines()[0]
            rec.update(ok=False, error=error, traceback=traceback.format_exc()[-4000:])
            oks[name] = False
            run.log(f"  {name}: failed: {error}")
        models[name] = rec
        atomic_write_json(path, {"models": models, "partial": True, "ok": False})
    return {"preset": preset.name, "backend": backend.describe(), "models": models,
            "ok": all(oks.values())}


def phase_contention(run: Run) -> JsonObject:
    """A communication-like kernel on k SMs beside three ops, against the simulator's law."""
    from benchmarks.device_check.contention import CommLike, ContentionRow, measure_case, op_cases
    from kareus.backends.gpu.serialize import reduced_workload
    from kareus.backends.sim import SimulatorBackend

    c = run.cfg
    preset = _preset(run)
    w = reduced_workload(c.models[0], 1, tp=1, pp=1, dp=1, mbs=c.mbs, seq=c.seq,
                         microbatches=1)
    ks, comm_error = list(c.contention_ks), None
    try:
        comm: CommLike | None = CommLike(run.card.device,
                                         nbytes=(256 << 20) if not run.card.fake else (1 << 16))
    except Exception as e:  # noqa: BLE001  (NVRTC missing: the ops alone are still measured)
        comm, ks, comm_error = None, [0], f"{type(e).__name__}: {e}"
        run.log(f"  the communication-like kernel is unavailable ({comm_error}); ops alone only")
    sim = SimulatorBackend(preset)
    rows: list[ContentionRow] = []
    for case in op_cases(w, run.card.device):
        rows += measure_case(case, ks, run.card.dev, run.card.device, comm,
                             c.contention_window_s, sim, preset)
        for r in rows[-len(ks):]:
            run.log(f"  {r.op} k={r.comm_sms}: {r.time_per_call_s * 1e6:.0f} us "
                    f"(x{r.slowdown or 0:.3f}; simulator x{r.simulated.slowdown:.3f})"
                    f", SMs proven {r.sms_proven}")
    proven = [r.sms_proven for r in rows if r.comm_sms and r.sms_proven is not None]
    return {"workload": w.name, "preset": preset.name, "rows": [r.to_dict() for r in rows],
            "all_sms_proven": all(proven) if proven else None, "comm_kernel_error": comm_error,
            "ok": all(r.time_per_call_s > 0 for r in rows) and all(proven)
            and comm_error is None}


def phase_fault(run: Run) -> JsonObject:
    """SIGTERM and SIGKILL mid-measurement; settings compared around each."""
    import signal

    from benchmarks.device_check.fault import one_kill
    from kareus.backends.gpu.settings import difference

    import tempfile

    kills: list[JsonObject] = []
    oks: list[bool] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        before = run.card.settings()
        with tempfile.TemporaryDirectory(prefix=f"kareus-fault-{sig.name}-") as tmp:
            r = one_kill(sig, Path(tmp), run.card.device, run.card)
        changed = difference(before, run.card.settings())
        ok = r.ok and not changed
        kill = r.to_dict()
        kill["settings_changed"] = changed
        kill["ok"] = ok
        run.log(f"  {sig.name}: kept {r.windows_kept} windows, intact {r.record_intact},"
                f" memory freed after {r.memory_freed_after_s} s, ok {ok}")
        kills.append(kill)
        oks.append(ok)
    return {"kills": kills, "ok": all(oks)}


RUNNERS: dict[str, Callable[[Run], JsonObject]] = {
    "env": phase_env, "power": phase_power, "pytest": phase_pytest,
    "workload": phase_workload, "contention": phase_contention, "fault": phase_fault}


# ============================================================================== driver


def select(only: str | None, start: str | None) -> list[str]:
    """The phases to run, in order; :class:`InputError` names the valid ones."""
    if only and start:
        raise InputError("give --only or --from, not both")
    for name in ([p.strip() for p in only.split(",")] if only else []) + ([start] if start
                                                                             else []):
        if name not in PHASES:
            raise InputError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}")
    if only:
        wanted = {p.strip() for p in only.split(",")}
        return [p for p in PHASES if p in wanted]
    if start:
        return list(PHASES[PHASES.index(start):])
    return list(PHASES)


def open_card(fake: bool) -> Card:
    """The real GPU 0 (NVML bindings, CUDA), or a fake NVML card on the CPU."""
    from kareus.backends.gpu.device import NvmlDevice

    if fake:
        from kareus.backends.gpu.fake_nvml import FakeNvml

        nvml = FakeNvml()
        return Card(nvml, NvmlDevice(0, nvml=nvml), "cpu", True)
    import torch

    if not torch.cuda.is_available():
        raise InputError(f"the device check needs a CUDA GPU, but torch {torch.__version__} "
                         f"(CUDA {torch.version.cuda}) sees none; use --fake for the dry run")
    try:
        import pynvml
    except ImportError:
        raise InputError("the device check reads the card through NVML; pip install "
                         "nvidia-ml-py") from None
    return Card(pynvml, NvmlDevice(0, nvml=pynvml), "cuda", False)


def run_check(out: Path, phases: list[str], cfg: Settings, fake: bool) -> int:
    """Guard, snapshot, the phases (each record written when it ends), the summary."""
    from kareus.backends.gpu.nvml_guard import ENV_VAR, activate
    from kareus.backends.gpu.settings import difference

    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    try:
        card = open_card(fake)  # the bindings are imported, not yet used for anything
        guard = activate(card.nvml)
        leaks = guard.verify()
        if leaks or not guard.active:
            atomic_write_json(out / "summary.json", {"ok": False,
                                                     "error": "NVML guard does not hold",
                                                     "leaks": leaks})
            print(f"error: NVML guard does not hold: {leaks}", file=sys.stderr)
            return 1
        os.environ[ENV_VAR] = "1"  # processes we start guard themselves
        os.environ.pop("KAREUS_ALLOW_CLOCK_CONTROL", None)
        before = card.settings()
    except Exception as e:  # noqa: BLE001 - no card to check: say why in the record folder too
        error = f"{type(e).__name__}: {e}".splitlines()[0]
        atomic_write_json(out / "summary.json", {
            "ok": False, "error": f"the card could not be opened: {error}",
            "traceback": traceback.format_exc()[-4000:], "fake_device": fake,
            "wall_s": time.monotonic() - t_start})
        if isinstance(e, InputError):
            raise
        print(f"error: the card could not be opened: {error}", file=sys.stderr)
        return 1
    prev: dict[str, Json] = {}
    if (out / "summary.json").exists():
        try:
            prev = json.loads((out / "summary.json").read_text()).get("phases", {})
        except ValueError:
            prev = {}
    run = Run(out, card, cfg, guard, before)
    if (out / "log.txt").exists():
        run.lines = (out / "log.txt").read_text().splitlines()
    run.log(f"== device check on {card.dev.name()}{' (fake, CPU)' if fake else ''}: "
            f"{', '.join(phases)}; NVML guard on ({len(guard.blocked)} setters blocked)")
    status: dict[str, Json] = dict(prev)
    stopped: str | None = None

    def on_term(signum: int, frame: object) -> None:
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, on_term)  # the time limit: write the summary
    try:
        for name in phases:
            path = out / f"{name}.json"
            if path.exists() and len(phases) == len(PHASES):
                status[name] = prev.get(name, {"ok": None, "skipped": "record exists"})
                run.log(f"-- {name}: record exists, skipped")
                continue
            run.log(f"-- {name}")
            t0 = time.monotonic()
            try:
                rec = RUNNERS[name](run)
            except Exception as e:  # noqa: BLE001 - record the failure, go on to the next phase
                error = f"{type(e).__name__}: {e}".splitlines()[0]
                rec = {"ok": False, "error": error, "traceback": traceback.format_exc()[-4000:]}
                run.log(f"   failed: {error}")
            wall = time.monotonic() - t0
            rec["wall_s"] = wall
            atomic_write_json(path, rec)
            status[name] = {"ok": rec["ok"], "wall_s": wall}
            run.log(f"   {name}: ok={rec['ok']} in {wall:.1f} s")
    except _Stopped:
        stopped = name
        status[name] = {"ok": False, "error": "stopped by SIGTERM (the run's time limit)"}
        run.log(f"!! SIGTERM during {name}: stopped; writing the summary")
    finally:
        signal.signal(signal.SIGTERM, previous)
    after = card.settings()
    changed = difference(before, after)
    attempts = list(guard.attempts)
    ok = all(isinstance(s, Mapping) and s.get("ok") for p, s in status.items() if p in phases) \
        and not changed and not attempts
    atomic_write_json(out / "summary.json", {
        "ok": ok, "phases": status, "settings_before": before.to_dict(),
        "settings_after": after.to_dict(),
        "settings_changed": changed, "blocked_setter_attempts": attempts,
        "fake_device": fake, "stopped_in": stopped, "wall_s": time.monotonic() - t_start})
    if changed:
        run.log(f"!! CARD SETTINGS CHANGED: {changed}")
    if attempts:
        run.log(f"!! blocked NVML setter calls: {attempts}")
    run.log(f"== ok={ok} in {time.monotonic() - t_start:.1f} s")
    return 124 if stopped else 0 if ok else 1


class _Stopped(BaseException):
    """SIGTERM arrived (``device_check.sh``'s time limit): not an ``Exception``, so no phase's
    own handler swallows it, and the run stops and writes its summary."""


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Record folder.")
@click.option("--only", default=None, help="Comma-separated phases to (re)run.")
@click.option("--from", "start", default=None, help="Run this phase and the ones after it.")
@click.option("--fake", is_flag=True, help="Dry run on the CPU with a fake NVML card.")
@click.option("--models", default=None, help=f"Workload phase models [{','.join(MODELS)}].")
def main_command(out: str, only: str | None, start: str | None, fake: bool,
                 models: str | None) -> int:
    phases = select(only, start)
    cfg = Settings.dry() if fake else Settings()
    if models:
        cfg.models = tuple(m.strip() for m in models.split(",") if m.strip())
    return run_check(Path(out), phases, cfg, fake)


def main(argv: list[str] | None = None) -> int:
    """The command line: bad input exits 2 with one line, never a traceback."""
    try:
        return int(main_command.main(args=argv, prog_name="python -m "
                                     "benchmarks.device_check.phases", standalone_mode=False))
    except click.ClickException as e:
        print(f"error: {e.format_message()}".splitlines()[0], file=sys.stderr)
        return 2
    except InputError as e:
        print(f"error: {e}".splitlines()[0], file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
