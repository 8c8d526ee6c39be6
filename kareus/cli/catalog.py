"""``kareus workloads``, ``kareus gpus`` and ``kareus optimizers``: what exists."""

from __future__ import annotations

import click

from kareus.cli.common import emit, render
from kareus.hardware.presets import DEFAULT_GPU


@click.command()
@click.option("--show", "show", default=None, metavar="NAME|PATH",
              help="Show one workload's derived shape: a built-in name, or a Hugging Face "
                   "config.json or its folder.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def workloads(show: str | None, as_json: bool) -> None:
    """List the workloads and their default shape (the paper testbed's degrees; layers split
    by FLOPs), or --show one."""
    from workloads import MODELS, make_workload

    if show is not None:
        _show_workload(show, as_json)
        return

    rows = []
    for name, m in MODELS.items():
        w = make_workload(name)
        p = w.parallel
        rows.append({
            "name": name, "params_b": round(m.total_params() / 1e9, 2), "layers": m.layers,
            "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "ffn": m.ffn,
            "vocab": m.vocab, "mlp": m.mlp, "qk_norm": m.qk_norm, "seq": p.seq,
            "default": f"TP{p.tp} PP{p.pp} CP{p.cp} DP{p.dp} MBS{p.mbs} x{p.microbatches} "
                       f"({p.num_gpus} GPUs, layers {'+'.join(map(str, w.stage_layers()))})",
        })

    def text() -> str:
        return render(
            ["workload", "params", "L", "hidden", "heads/kv", "ffn", "vocab", "mlp",
             "default shape"],
            ([r["name"], f"{r['params_b']:.2f}B", r["layers"], r["hidden"],
              f"{r['heads']}/{r['kv_heads']}", r["ffn"], r["vocab"],
              r["mlp"] + ("+qkn" if r["qk_norm"] else ""), f"seq {r['seq']}, {r['default']}"]
             for r in rows), left=("workload", "mlp", "default shape"))

    emit(rows, as_json, text)


def _show_workload(name: str, as_json: bool) -> None:
    """``kareus workloads --show``: the model's fields, parameters and default parallel shape."""
    from dataclasses import asdict

    from workloads import MODELS, make_workload, workload_ref

    w = make_workload(name)
    m, p = w.model, w.parallel
    obj = {
        "name": w.name, "source": None if name in MODELS else workload_ref(name),
        "model": asdict(m), "params": m.total_params(),
        "default_parallel": p.job_fields(),
        "num_gpus": p.num_gpus, "stage_layers": list(w.stage_layers()),
    }

    def text() -> str:
        rows = [["source", obj["source"] or "built-in"]]
        rows += [[k, v] for k, v in obj["model"].items()
                 if not (k == "gelu" and m.mlp != "gelu")]  # which GELU: only a GELU MLP has one
        rows += [["params", f"{m.total_params() / 1e9:.3f}B ({m.total_params():,})"],
                 ["default shape",
                  f"TP{p.tp} PP{p.pp} CP{p.cp} DP{p.dp} MBS{p.mbs} x{p.microbatches}, "
                  f"seq {p.seq} ({p.num_gpus} GPUs, layers "
                  f"{'+'.join(map(str, w.stage_layers()))})"]]
        return render(["field", "value"], rows, title=f"workload {w.name}",
                      left=("field", "value"))

    emit(obj, as_json, text)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON with every source.")
def gpus(as_json: bool) -> None:
    """List the GPU presets; each number carries its source (datasheet/published/fitted/...)."""
    from dataclasses import fields

    from kareus.hardware.presets import PRESETS, unreadable_preset_files

    for path, error in unreadable_preset_files().items():
        click.echo(f"warning: skipped {path.name}: {error}", err=True)
    out = {}
    for name, p in PRESETS.items():
        out[name] = {
            f.name: {"value": getattr(p, f.name), "source": p.sources.get(f.name, "")}
            for f in fields(p) if f.name not in ("name", "sources")
        }

    def text() -> str:
        return render(
            ["gpu", "SMs", "peak bf16 TF", "clock MHz", "HBM TB/s", "limit W", "static W", "knee",
             "default"],
            ([name, p.sms, f"{p.peak_flops / 1e12:.0f}",
              f"{p.clock_min_mhz:.0f}-{p.clock_max_mhz:.0f}", f"{p.hbm_bw / 1e12:.2f}",
              f"{p.power_limit_w:.0f}", f"{p.static_power_w:.2f}", f"{p.knee_mhz:.0f}",
              "*" if name == DEFAULT_GPU else ""] for name, p in PRESETS.items()),
            left=("gpu",), caption="peak: dense bf16 tensor FLOP/s at the top clock (datasheets "
                                   "may quote a lower sustained clock). Sources of every number: "
                                   "`kareus gpus --json`.")

    emit(out, as_json, text)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def optimizers(as_json: bool) -> None:
    """List the registered optimizers (built-ins, installed plugins and those named in
    $KAREUS_OPTIMIZERS) and the settings each takes (--set NAME=VALUE), each built once with its
    default settings so that a plugin that cannot be imported or constructed says so here rather
    than in a run."""
    from kareus.plugins import load_error, optimizer_names, registered_optimizers, setting_names

    eps = registered_optimizers()
    rows: list[dict[str, object]] = []
    for n in optimizer_names():
        why = load_error(n)
        rows.append({"name": n, "target": eps[n].value, "loads": not why,
                     "settings": setting_names(n), **({"error": why} if why else {})})

    def line(r: dict[str, object]) -> str:
        settings = r["settings"]
        out = f"{r['name']:20s} {r['target']}"
        if isinstance(settings, list) and settings:
            out += "  --set " + ", ".join(str(k) for k in settings)
        return out + (f"  (cannot be loaded: {r['error']})" if not r["loads"] else "")

    emit(rows, as_json, lambda: "\n".join(line(r) for r in rows))
