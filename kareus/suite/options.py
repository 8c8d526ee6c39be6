"""Command-line options shared by the faces (``kareus`` and ``reproduce.py``): the job's whole
shape beyond its parallel degrees (each option's value is passed as a keyword to
:func:`workloads.make_workload`; ``None`` keeps the job's default), and the optimizers' settings
(``--set NAME=VALUE``, :func:`parse_settings`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

import click

from kareus.errors import InputError


#: The help of ``-w/--workload`` on every command that takes one.
WORKLOAD_HELP = ("Workload: a model name (see `kareus workloads`), or a Hugging Face config.json or "
                 "the folder holding one (needs the extra: pip install -e '.[hf]').")


def comma_list(value: str, option: str) -> list[str]:
    """The items of a comma-separated option value, stripped; :class:`InputError` (one line) for
    an empty value or an empty item (``a,,b``, a trailing comma)."""
    from kareus.errors import InputError

    items = [v.strip() for v in value.split(",")]
    if not any(items):
        raise InputError(f"{option} is empty; give a comma-separated list")
    if not all(items):
        raise InputError(f"{option} {value!r} has an empty item; give a comma-separated list")
    return items


def _stage_layers(ctx: click.Context, param: click.Parameter, value: str | None
                  ) -> tuple[int, ...] | None:
    """``--stage-layers 6,6,7,5`` -> ``(6, 6, 7, 5)``; the count and sum are checked against the
    job by :func:`workloads.parallel.validate`."""
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers "
                                 "(transformer blocks per stage, e.g. 6,6,7,5)") from None


def _flag_or_none(ctx: click.Context, param: click.Parameter, value: bool) -> bool | None:
    """A flag that overrides the job's default only when given."""
    return True if value else None


#: The job's parallel degrees and batch, shared by every command taking a workload and by
#: ``reproduce.py`` (each overrides the workload's default only when given).
PARALLEL_OPTIONS = [
    click.option("--tp", type=int, default=None, help="Tensor-parallel degree."),
    click.option("--cp", type=int, default=None, help="Context-parallel degree."),
    click.option("--pp", type=int, default=None, help="Pipeline stages."),
    click.option("--dp", type=int, default=None, help="Data-parallel replicas."),
    click.option("--mbs", type=int, default=None, help="Micro-batch size."),
    click.option("--seq", type=int, default=None, help="Sequence length (tokens)."),
    click.option("--microbatches", type=int, default=None, help="Microbatches per iteration."),
]

#: The job's whole shape beyond its parallel degrees, shared by every command taking a workload
#: and by ``reproduce.py``.
JOB_SHAPE_OPTIONS = [
    click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default=None,
                 help="What the backward recomputes [full: the paper's testbed]."),
    click.option("--precision", type=click.Choice(["bf16", "fp16", "tf32", "fp32"]),
                 default=None, help="Math and tensor precision [bf16]; tf32: fp32 tensors, "
                                    "TF32 tensor-core matmuls; fp32: no tensor cores."),
    click.option("--stage-layers", "layer_split", default=None, callback=_stage_layers,
                 metavar="N,N,...", help="Transformer blocks per pipeline stage (embedding on the "
                                         "first, head on the last) [chosen by the suite: fewer on "
                                         "the head's stage, balancing FLOPs (Llama 3.2 3B over 2: "
                                         "15,13, as the Kareus artifact ran); Megatron-LM's own "
                                         "default is even]."),
    click.option("--gpus-per-node", type=int, default=None,
                 help="GPUs per node [8]; groups spanning nodes use the network."),
    click.option("--distributed-optimizer", is_flag=True, callback=_flag_or_none,
                 help="Megatron-LM's distributed optimizer (reduce-scatter + all-gather)."),
    click.option("--overlap-grad-reduce", is_flag=True, callback=_flag_or_none,
                 help="Bucketed gradient reduction (DP x CP) overlapped with the backward."),
    click.option("--overlap-param-gather", is_flag=True, callback=_flag_or_none,
                 help="The distributed optimizer's parameter all-gather under the next "
                      "iteration's first forward (needs --distributed-optimizer and "
                      "--overlap-grad-reduce)."),
    click.option("--attention", type=click.Choice(["flash", "unfused"]), default=None,
                 help="Core attention: one flash kernel [flash], or Megatron-LM's unfused path "
                      "(which tf32 and fp32 always run: flash needs 16-bit tensors)."),
    click.option("--elementwise", type=click.Choice(["fused", "eager"]), default=None,
                 help="Elementwise work: fused kernels [fused, Megatron-LM], or PyTorch eager "
                      "as Hugging Face models write it (Merak)."),
    click.option("--cross-entropy", type=click.Choice(["fused", "unfused"]), default=None,
                 help="The loss: one fused kernel [fused: the paper's testbed], or Megatron-LM's "
                      "default vocabulary-parallel cross entropy in PyTorch ops."),
    click.option("--sequence-parallel", is_flag=True, callback=_flag_or_none,
                 help="Megatron-LM's sequence parallelism: norms and dropouts on 1/TP of the "
                      "tokens, each TP all-reduce a reduce-scatter plus an all-gather."),
    click.option("--overlap-tp-grad", is_flag=True, callback=_flag_or_none,
                 help="The backward's TP gradient collectives beside the GEMMs, as Megatron-LM's "
                      "asynchronous all-reduce and Transformer Engine run them [off: between "
                      "the kernels, which the shared measurements fit better]."),
    click.option("--scatter-gather-p2p", is_flag=True, callback=_flag_or_none,
                 help="Megatron-LM's scatter/gather of transfers between stages (its default "
                      "before Megatron Core): each TP rank sends 1/TP, the receiver all-gathers."),
    click.option("--make-vocab-size-divisible-by", type=int, default=None,
                 help="Pad the vocabulary to a multiple of N x TP, as Megatron-LM does [128]; "
                      "1 keeps it (Hugging Face code, Merak)."),
]


#: A click command function being decorated.
F = TypeVar("F", bound=Callable[..., object])


def job_shape_options(f: F) -> F:
    """Apply :data:`PARALLEL_OPTIONS` and :data:`JOB_SHAPE_OPTIONS` (passed as keywords)."""
    for opt in reversed([*PARALLEL_OPTIONS, *JOB_SHAPE_OPTIONS]):
        f = opt(f)
    return f




#: ``--set NAME=VALUE``: an optimizer setting (repeatable), shared by ``kareus frontier`` and
#: ``reproduce.py``.
SET_OPTION = click.option(
    "--set", "settings", multiple=True, metavar="NAME=VALUE",
    help="An optimizer setting, repeatable (e.g. --set search=nsga2 --set budget=40); each "
         "optimizer takes the ones it declares (its Settings, docs/architecture.md).")


def declared_settings(optimizers: Sequence[str]
                      ) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Which of ``optimizers`` declare each setting (``{NAME: [optimizer, ...]}``), and those
    that cannot be loaded (a plugin whose import fails or whose ``Settings`` is not a
    dataclass), which declare nothing, each with why (``{optimizer: reason}``, one line). An
    unknown name raises :class:`InputError`."""
    from kareus.plugins import optimizer_settings

    declared: dict[str, list[str]] = {}
    broken: dict[str, str] = {}
    for opt in optimizers:
        try:
            cls = optimizer_settings(opt)
        except InputError:  # an unknown name: the user's
            raise
        except Exception as e:  # a broken plugin: its cell reports it (load_and_run)
            broken[opt] = " ".join(str(e).split()) or type(e).__name__
            continue
        for f in dataclasses.fields(cls) if cls is not None else ():
            declared.setdefault(f.name, []).append(opt)
    return declared, broken


def parse_settings(pairs: Sequence[str], optimizers: Sequence[str]) -> dict[str, str]:
    """``--set NAME=VALUE`` pairs as ``{NAME: VALUE}`` (values stay strings: each optimizer's
    settings convert and check them, :func:`kareus.plugins.load_optimizer`). :class:`InputError`
    (one line) for a pair without ``=``, a name given twice, or a name that none of
    ``optimizers`` declares (listing those they do). A plugin that cannot be loaded (an import
    that fails, a ``Settings`` that is not a dataclass) declares nothing here: it fails alone
    when its cell runs, and the other optimizers run."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        name = name.strip()
        if not eq or not name:
            raise InputError(f"--set {pair!r}: give NAME=VALUE")
        if name in out:
            raise InputError(f"--set {name}: given twice")
        out[name] = value.strip()
    if out:
        declared, broken = declared_settings(optimizers)
        for name in out:
            if name not in declared:
                known = ", ".join(sorted(declared)) or "none"
                unread = "".join(f" ({opt} could not be loaded: {why})"
                                 for opt, why in broken.items())
                raise InputError(f"--set {name}: no optimizer of this run ({', '.join(optimizers)}) "
                                 f"has that setting; theirs: {known}{unread}")
    return out
