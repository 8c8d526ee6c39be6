"""The shared-machine GPU check (run by ``benchmarks/gpu_check.sh``): measure the default
(Megatron-LM: maximum clock, no overlap) plan and a nanobatched plan of a small workload on one
GPU, next to the simulator's prediction for the same run, and write everything to a folder.

    python -m kareus.backends.gpu.check --out OUTDIR [--workload qwen3-1.7b --layers 2 ...]

Never changes clocks or power limits (clock control stays off): the simulator is therefore
evaluated "calibrated at the card's current clock" -- its plan clock is the mean SM clock NVML
reported during the measured window, snapped to the preset's grid -- and also at the preset's
maximum clock, for reference. The preset is the one matching the visible GPU, or ``--gpu``.

Exit status: 0 when every measurement is positive and finite, 1 otherwise (a failure on the GPU
leaves its traceback in gpu_check.json), 2 for bad input (no GPU, no NVML, a GPU no preset
describes and no ``--gpu``).
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import click

from kareus.backends.gpu.device import Device
from kareus.errors import InputError
from kareus.frontier import change_pct
from kareus.json_types import JsonObject


def _log(lines: list[str], msg: str) -> None:
    lines.append(msg)
    print(msg, flush=True)


def _readings(dev: Device, *methods: str) -> dict[str, float | None]:
    """Informational NVML readings, keyed by device method name; ``None`` where the driver
    refuses one (e.g. NOT_SUPPORTED in a VM), so a reading never stops the check."""
    out: dict[str, float | None] = {}
    for method in methods:
        try:
            out[method] = float(getattr(dev, method)())
        except Exception:  # noqa: BLE001 -- DeviceError or an NVML error type
            out[method] = None
    return out


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


@dataclass(frozen=True)
class CheckArgs:
    """The check's command-line options (seconds for ``warmup``, ``window``, ``cooldown``)."""

    out: str
    workload: str = "qwen3-1.7b"
    layers: int = 4
    mbs: int = 4
    seq: int = 2048
    microbatches: int = 4
    warmup: float = 3.0
    window: float = 5.0
    cooldown: float = 2.0
    gpu: str | None = None
    nanobatched: bool = True


@dataclass(frozen=True)
class PlanCheck:
    """One plan measured beside the simulator: the record's ``runs`` entry (``measured``: the
    iteration's time (s) and energies (J), mean power per GPU (W), the window; the simulated
    points at the observed and at the maximum clock; the simulator's errors, %)."""

    plan: str
    wall_s: float
    measured: JsonObject
    simulated_at_current_clock: JsonObject
    simulated_at_max_clock: JsonObject
    error_pct: dict[str, float]
    #: Whether the measured time and energy are positive and finite.
    positive: bool

    def to_dict(self) -> JsonObject:
        return {"plan": self.plan, "wall_s": self.wall_s, "measured": self.measured,
                "simulated_at_current_clock": self.simulated_at_current_clock,
                "simulated_at_max_clock": self.simulated_at_max_clock,
                "error_pct": self.error_pct}


@dataclass(frozen=True)
class CheckRecord:
    """The check's record (``gpu_check.json``): whether it passed, and what it measured."""

    ok: bool
    record: JsonObject
    runs: tuple[PlanCheck, ...]
    log: tuple[str, ...]


def run_check(args: CheckArgs) -> CheckRecord:
    """The check itself; returns its record (written to ``--out`` by :func:`check`)."""
    from kareus.backends.base import Point
    from kareus.backends.gpu import GPUBackend
    from kareus.backends.gpu.calibrate import snap_to_grid
    from kareus.atomic import atomic_write_json
    from kareus.backends.gpu.device import open_device
    from kareus.backends.gpu.environment import match_preset, probe_environment
    from kareus.backends.gpu.measure import MeasureConfig
    from kareus.backends.gpu.results import PlanResult
    from kareus.backends.gpu.serialize import reduced_workload
    from kareus.backends.sim import SimulatorBackend
    from kareus.hardware.presets import get_preset
    from kareus.plan import IterationPlan

    lines: list[str] = []
    env = probe_environment()
    if not env.gpu_names:  # let check_environment name what is missing
        from kareus.backends.gpu.environment import check_environment

        check_environment(env, get_preset("h200"))
    name = env.gpu_names[0]
    preset_name = args.gpu or match_preset(name, env.gpu_memory[0] if env.gpu_memory else None)
    if preset_name is None:
        raise InputError(f"GPU 0 is an {name}, which no preset describes; pass --gpu PRESET")
    preset = get_preset(preset_name)
    dev = open_device(0)
    before = _readings(dev, "sm_clock_mhz", "max_sm_clock_mhz", "power_limit_w", "power_w")
    _log(lines, f"GPU 0: {name} -> preset {preset.name}; idle SM clock "
                f"{_fmt(before['sm_clock_mhz'])} MHz (max {_fmt(before['max_sm_clock_mhz'])}), "
                f"power limit {_fmt(before['power_limit_w'])} W")
    measure = MeasureConfig(warmup_s=args.warmup, warmup_steps=2, window_s=args.window,
                            min_steps=3, cooldown_s=args.cooldown)
    backend = GPUBackend.create(preset, allow_clock_control=False, measure=measure,
                                announce=False, accept_unlisted_gpu=args.gpu is not None)
    _log(lines, backend.clock_note)
    w = reduced_workload(args.workload, args.layers, tp=1, pp=1, dp=1, mbs=args.mbs,
                         seq=args.seq, microbatches=args.microbatches)
    graph = backend.bind(w)
    _log(lines, f"workload {w.name}, {w.model.layers} layers, TP1 PP1, MBS {w.parallel.mbs}, "
                f"seq {w.parallel.seq}, {w.parallel.microbatches} microbatches, bf16, full "
                "recomputation")
    sim = SimulatorBackend(preset)
    runs: list[PlanCheck] = []
    for label, nano in (("megatron", False), ("nanobatched", True)):
        if nano and not args.nanobatched:
            continue
        plan = IterationPlan.uniform(graph, preset.clock_max_mhz, nanobatched=nano, label=label)
        t0 = time.monotonic()
        res = backend.evaluate_plan(graph, plan)
        wall = time.monotonic() - t0
        rank = backend.last_run[0]
        if not isinstance(rank, PlanResult):  # pragma: no cover - evaluate_plan runs plan jobs
            raise RuntimeError(f"a plan job answered with a {type(rank).__name__}")
        clock = rank.window.sm_clock_mhz or before["max_sm_clock_mhz"] or preset.clock_max_mhz
        f_sim = snap_to_grid(float(clock), preset)
        pred = sim.evaluate_plan(graph, IterationPlan.uniform(graph, f_sim, nanobatched=nano))
        pred_max = sim.evaluate_plan(graph, plan)
        m, p = res.energy, pred.energy
        point = Point.from_result(res)
        run = PlanCheck(
            plan=label, wall_s=wall,
            measured={**point.to_dict(),
                      "avg_power_w": m.total_j / m.time_s / res.num_gpus,
                      "steps": rank.window.steps, "window_s": rank.window.time_s,
                      "mean_sm_clock_mhz": clock, "losses": list(rank.losses)},
            simulated_at_current_clock={**Point.from_result(pred).to_dict(),
                                        "clock_mhz": f_sim,
                                        "avg_power_w": p.total_j / p.time_s / pred.num_gpus},
            simulated_at_max_clock={**Point.from_result(pred_max).to_dict(),
                                    "clock_mhz": preset.clock_max_mhz},
            error_pct={"time": float(change_pct(m.time_s, p.time_s)),
                       "energy": float(change_pct(m.total_j, p.total_j)),
                       "dynamic_energy": float(change_pct(m.dynamic_j, p.dynamic_j)),
                       "avg_power": float(change_pct(m.total_j / m.time_s,
                                                     p.total_j / p.time_s))},
            positive=all(math.isfinite(x) and x > 0 for x in (point.time_s, point.energy_j)))
        runs.append(run)
        # a kill keeps every finished plan: the record so far, replaced atomically
        atomic_write_json(Path(args.out) / "gpu_check.json",
                          {"ok": False, "partial": True, "gpu_name": name, "preset": preset.name,
                           "gpu_before": before, "runs": [r.to_dict() for r in runs],
                           "log": lines})
        _log(lines, f"[{label}] measured {m.time_s * 1e3:.1f} ms/iter, {m.total_j:.1f} J/iter "
                    f"({m.total_j / m.time_s:.0f} W avg, SM clock {clock:.0f} MHz, "
                    f"{rank.window.steps} iters in {rank.window.time_s:.1f} s); simulator at "
                    f"{f_sim:.0f} MHz: {p.time_s * 1e3:.1f} ms, {p.total_j:.1f} J -> error time "
                    f"{run.error_pct['time']:+.1f} %, energy {run.error_pct['energy']:+.1f} %")
    ok = all(r.positive for r in runs)
    after = _readings(dev, "sm_clock_mhz", "power_limit_w")
    record: JsonObject = {
        "ok": ok, "gpu_name": name, "preset": preset.name, "host": platform.node(),
        "backend": backend.describe(), "gpu_before": before, "gpu_after": after,
        "workload": {"name": w.name, "layers": w.model.layers, "mbs": w.parallel.mbs,
                     "seq": w.parallel.seq, "microbatches": w.parallel.microbatches},
        "static_power_w_assumed": backend.static_power_w, "runs": [r.to_dict() for r in runs],
        "log": lines}
    return CheckRecord(ok, record, tuple(runs), tuple(lines))


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--out", required=True, help="Folder for gpu_check.json and gpu_check.log.")
@click.option("--workload", default="qwen3-1.7b", show_default=True)
@click.option("--layers", type=int, default=4, show_default=True)
@click.option("--mbs", type=int, default=4, show_default=True)
@click.option("--seq", type=int, default=2048, show_default=True)
@click.option("--microbatches", type=int, default=4, show_default=True)
@click.option("--warmup", type=float, default=3.0, show_default=True, help="Warm-up seconds.")
@click.option("--window", type=float, default=5.0, show_default=True,
              help="Measurement window seconds.")
@click.option("--cooldown", type=float, default=2.0, show_default=True,
              help="Idle seconds before warm-up.")
@click.option("--gpu", default=None,
              help="Preset (default: the one matching GPU 0); also runs a GPU no preset "
                   "describes (e.g. an H200 NVL) with this preset.")
@click.option("--no-nanobatched", "nanobatched", is_flag=True, flag_value=False, default=True,
              help="Measure the default plan only.")
def check(out: str, workload: str, layers: int, mbs: int, seq: int, microbatches: int,
          warmup: float, window: float, cooldown: float, gpu: str | None,
          nanobatched: bool) -> int:
    """Run the check, write its record to ``--out`` and return the exit status."""
    args = CheckArgs(out=out, workload=workload, layers=layers, mbs=mbs, seq=seq,
                     microbatches=microbatches, warmup=warmup, window=window, cooldown=cooldown,
                     gpu=gpu, nanobatched=nanobatched)
    from kareus.atomic import atomic_write_json, atomic_write_text

    out_dir = Path(args.out)
    try:
        result = run_check(args)
    except InputError as e:
        msg = f"error: {e}".splitlines()[0]
        print(msg, file=sys.stderr)
        atomic_write_json(out_dir / "gpu_check.json", {"ok": False, "error": msg})
        return e.exit_status
    except Exception as e:  # a failure on the GPU itself: keep the traceback, leave a record
        traceback.print_exc()
        msg = f"failed: {type(e).__name__}: {e}".splitlines()[0]
        atomic_write_json(out_dir / "gpu_check.json", {"ok": False, "error": msg,
                                                       "traceback": traceback.format_exc()})
        return 1
    atomic_write_json(out_dir / "gpu_check.json", result.record)
    atomic_write_text(out_dir / "gpu_check.log", "\n".join(result.log) + "\n")
    print(json.dumps({"ok": result.ok, "runs": [
        {"plan": r.plan, "error_pct": r.error_pct} for r in result.runs]}, indent=1))
    return 0 if result.ok else 1


def main(argv: list[str] | None = None) -> int:
    """The command line; a usage error exits 2 with click's message."""
    try:
        return check.main(args=argv, prog_name="python -m kareus.backends.gpu.check",
                          standalone_mode=False)
    except click.ClickException as e:
        e.show()
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
