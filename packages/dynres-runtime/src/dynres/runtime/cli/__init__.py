"""The ``dynres`` command line: a click group with one module per command.

Every :class:`~dynres.core.errors.DynresError` raised by a command is printed as one line on
stderr (``dynres: error: ...``) and exits with status 2; usage errors exit 2 as click does.
A command module defines ``command`` (a click command or group) and is listed in
:data:`COMMAND_MODULES`.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import click

from dynres.core.errors import DynresError

COMMAND_MODULES: tuple[str, ...] = ("simulate", "run", "scenario", "policies", "config")
"""Modules of ``dynres.runtime.cli`` whose ``command`` is registered on :data:`main`, in order."""

EXIT_DYNRES_ERROR = 2
"""Exit status of a command that failed with a DynresError (same as a usage error)."""


class DynresCliError(click.ClickException):
    """A DynresError on its way out of the CLI: one line on stderr, exit status 2."""

    def __init__(self, message: str, exit_code: int = EXIT_DYNRES_ERROR) -> None:
        """One-line ``message``; ``exit_code`` 2, or the error's own (130 after Ctrl-C)."""
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click types it ClassVar but reads it from the instance

    def show(self, file: Any = None) -> None:
        """Print ``dynres: error: <message>`` as a single line on stderr."""
        click.echo(f"dynres: error: {self.format_message()}", err=True)

    def format_message(self) -> str:
        """The message with newlines folded so it stays one line."""
        return " ".join(str(self.message).split())


def _one_line_warning(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
) -> str:
    """A Python warning as the CLI prints it: ``dynres: warning: <message>``, one line, no source path.

    Python's default names the file and echoes the source line under it: two lines about dynres's
    internals, where a user needs what to change (a renamed param says its new name).
    """
    return f"dynres: warning: {' '.join(str(message).split())}\n"


class DynresGroup(click.Group):
    """A click group that turns DynresError from any subcommand into :class:`DynresCliError`."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; convert DynresError and usage errors into one clear line.

        Exit status 2, or the error's own ``exit_code`` (a run interrupted by Ctrl-C: 130).
        """
        shown = warnings.formatwarning
        warnings.formatwarning = _one_line_warning  # only while a command runs (tests invoke many)
        try:
            return super().invoke(ctx)
        except DynresError as exc:
            raise DynresCliError(str(exc), int(getattr(exc, "exit_code", EXIT_DYNRES_ERROR))) from None
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "dynres"
            raise DynresCliError(f"{exc.format_message()} (see '{where} --help')") from None
        finally:
            warnings.formatwarning = shown


@click.group(cls=DynresGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(None, "-V", "--version", package_name="dynres-runtime", prog_name="dynres")
def main() -> None:
    """dynres: dynamic resource scheduling for fully-async RL training of LLMs.

    Shell completion (commands, options, preset and policy names): add
    eval "$(_DYNRES_COMPLETE=bash_source dynres)" to ~/.bashrc (zsh_source for ~/.zshrc,
    fish_source for fish); see docs/installing.md.
    """


for _name in COMMAND_MODULES:
    main.add_command(importlib.import_module(f"{__name__}.{_name}").command)
