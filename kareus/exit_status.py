"""The outside contract's exit statuses, applied to a click command: 0 success; 2 bad input (one
line naming the problem); 1 internal failure (one line; ``KAREUS_DEBUG=1`` re-raises for the
traceback; 1 also for a plugin's own fault, ``plugin error: ...``, and when every optimizer of a
run failed: ``error: every optimizer failed``, but 2 when each refused the job);
130 / 143 interrupted by SIGINT / SIGTERM; a command's own ``ctx.exit(n)``: n; 2 when standard
output is closed before the start (``>&-``). A reader that
closes the output early (``| head``): what goes through the suite's rich consoles
(:mod:`kareus.suite.console`: tables, and the progress bar on a terminal) is dropped and the
command finishes with its own status; a plain write stops the command, 1 with one line saying so. A
:class:`~kareus.errors.KareusError` chooses its status by class (``exit_status``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import click

from kareus.errors import AllOptimizersFailed, KareusError, PluginError
from kareus.suite.console import point_at_null_device


def run_command(command: click.Command, argv: list[str] | None, prog_name: str,
                interrupted: Callable[[BaseException | None], int] | None = None) -> int:
    """Run ``command`` with ``argv`` and map what happens to an exit status.

    ``interrupted(cause)`` handles Ctrl-C / a SIGTERM raised as KeyboardInterrupt and returns the
    status (default: print "aborted", 130). Started with standard output closed (``>&-``, where
    Python leaves ``sys.stdout`` None), the command is refused with status 2 before any work.
    """
    if sys.stdout is None:
        if sys.stderr is not None:
            click.echo("error: standard output is closed (as `>&-` does): the command would have "
                       "nowhere to print; send it to a file or /dev/null instead", err=True)
        return 2
    try:
        # click returns the status of a ``click.exceptions.Exit`` (``ctx.exit(n)``) when not
        # standalone; callbacks themselves return None
        status = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt) as e:
        cause = e if isinstance(e, KeyboardInterrupt) else e.__cause__
        if interrupted is not None:
            return interrupted(cause)
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:
        if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())):
            click.echo(e.format_message(), err=True)  # a group run bare: its whole help
            return 2
        message = f"error: {e.format_message()}".splitlines()[0]
        ctx = getattr(e, "ctx", None)
        if isinstance(e, click.NoSuchOption) and not e.possibilities and ctx is not None:
            message += f" (`{ctx.command_path} --help` lists its options)"
        click.echo(message, err=True)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except SystemExit as e:
        if e.code == 1 and _click_met_a_closed_output():
            point_at_null_device(sys.stdout)  # drop what is still buffered for it
            try:
                click.echo("error: the output's reader closed it before the command finished "
                           "(as `| head` does): the rest of its output is lost", err=True)
            except OSError:  # stderr went with it
                pass
            return 1
        raise
    except Exception as e:
        status = e.exit_status if isinstance(e, KareusError) else 1
        if status != 1 or isinstance(e, AllOptimizersFailed):
            click.echo(f"error: {e}".splitlines()[0], err=True)
            return status
        if isinstance(e, PluginError):  # the plugin's fault, not the suite's
            click.echo(f"plugin error: {e}".splitlines()[0], err=True)
            return 1
        if os.environ.get("KAREUS_DEBUG"):
            raise
        click.echo(f"internal error: {type(e).__name__}: {e}".splitlines()[0], err=True)
        return 1
    return status if type(status) is int else 0


def _click_met_a_closed_output() -> bool:
    """Whether click met a closed output (EPIPE) while it ran the command: it then wraps the
    standard streams in its flush-pacifying wrapper and exits 1 without a word."""
    import click.utils

    wrapper = (getattr(click.utils, "_PacifyFlushWrapper", None)
               or getattr(click.utils, "PacifyFlushWrapper", None))
    return wrapper is not None and isinstance(sys.stdout, wrapper)
