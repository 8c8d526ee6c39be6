"""What the commands share: the workload options, warnings, tables and JSON output."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import click

from kareus.suite.options import JOB_SHAPE_OPTIONS, PARALLEL_OPTIONS, WORKLOAD_HELP


#: A click command function being decorated.
F = TypeVar("F", bound=Callable[..., object])


STRICT_OPTION = click.option(
    "--strict", is_flag=True,
    help="Refuse (exit 2) a layout whose estimated memory exceeds the GPU's, instead of warning.")


def warn(messages: list[str]) -> None:
    """Print each of a job's warnings on stderr (one line each)."""
    for m in messages:
        click.echo(f"warning: {m}", err=True)


def _required_workload(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """``--workload``'s value; without one, a usage error that names the choices."""
    if value is None:
        from workloads import MODELS

        raise click.UsageError(f"Missing option '-w' / '--workload': a model name "
                               f"({', '.join(MODELS)}) or a Hugging Face config.json or the "
                               "folder holding one", ctx)
    return value


def required_optimizer(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """``--optimizer``'s value; without one, a usage error that names the registered ones."""
    if value is None:
        from kareus.plugins import optimizer_names

        raise click.UsageError("Missing option '-o' / '--optimizer': one of "
                               f"{', '.join(optimizer_names())}", ctx)
    return value


def workload_options(f: F) -> F:
    """``--workload``, the parallelism overrides, the job's shape and ``--strict``, shared by
    every command taking a workload (``strict`` is passed as its own argument, the overrides as
    keywords)."""
    options = [
        click.option("--workload", "-w", callback=_required_workload,
                     help=WORKLOAD_HELP + "  [required]"),
        *PARALLEL_OPTIONS,
        *JOB_SHAPE_OPTIONS,
        STRICT_OPTION,
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def build_workload(workload: str, **overrides: object):  # noqa: ANN201
    """Validated :class:`~workloads.Workload` from CLI values (raises WorkloadError)."""
    from workloads import make_workload

    return make_workload(workload, **overrides)


#: Frontier points ``kareus frontier`` prints without ``--all``.
FRONTIER_ROWS = 15


def render(columns: Sequence[str], rows: Iterable[Sequence[object]], *,
           title: str | None = None, caption: str | None = None,
           left: Iterable[str] = ()) -> str:
    """A table as text (:func:`kareus.suite.tables.render`, imported when first used)."""
    from kareus.suite.tables import render as _render

    return _render(columns, rows, title=title, caption=caption, left=left)


def emit(obj: object, as_json: bool, text: Callable[[], str]) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2, sort_keys=False))
    else:
        click.echo(text())
