"""The ``kareus`` command line: list what exists, simulate an iteration, find a frontier, run the
baselines on a profile, calibrate a preset.

One module per command (or family of commands); this one gathers them into the ``kareus`` group:

- :mod:`~kareus.cli.catalog`: ``workloads``, ``gpus``, ``optimizers``;
- :mod:`~kareus.cli.simulation`: ``simulate``;
- :mod:`~kareus.cli.frontiers`: ``frontier``;
- :mod:`~kareus.cli.profiles`: ``perseus``, ``envpipe``;
- :mod:`~kareus.cli.calibration`: ``calibrate``, ``partition``;
- :mod:`kareus.reproduction`: ``reproduce`` (the same command as ``python reproduce.py``);
- :mod:`~kareus.cli.common`: what they share (the workload options, warnings, tables, JSON).

Exit status: 0 success; 2 bad input (one line naming the problem and the valid choices);
1 internal failure.
"""

from __future__ import annotations

import sys

import click

from kareus import reproduction
from kareus.cli import calibration, catalog, frontiers, profiles, simulation


class _Commands(click.Group):
    """The command group; an unknown command names the valid ones."""

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and not args[0].startswith("-") and not ctx.resilient_parsing \
                and self.get_command(ctx, args[0]) is None:
            raise click.UsageError(f"no command {args[0]!r}; choose one of: "
                                   f"{', '.join(self.list_commands(ctx))}", ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Energy-optimal large-model training: Kareus, baselines, simulator and harness."""


for _command in (catalog.workloads, catalog.gpus, catalog.optimizers, simulation.simulate,
                 frontiers.frontier, profiles.perseus, profiles.envpipe, calibration.calibrate,
                 calibration.partition):
    cli.add_command(_command)
# `kareus reproduce` is `python reproduce.py`: the same click command (kareus.reproduction).
cli.add_command(reproduction.command, "reproduce")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; user errors exit 2 with one line (kareus.exit_status)."""
    from kareus.exit_status import run_command

    return run_command(cli, argv, "kareus")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
