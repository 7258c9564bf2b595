"""What every ``dynres`` command shares about output: ``--json [FILE|-]``, quiet, completion.

One meaning of ``--json`` across commands: ``--json`` or ``--json -`` prints the JSON on stdout
(and moves the human-readable output to stderr, so stdout stays parseable); ``--json FILE``
writes FILE and keeps the normal output on stdout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dynres.core.errors import ConfigError

STDOUT = "-"
"""The ``--json`` value meaning standard output (also what a bare ``--json`` gives)."""


def json_option(what: str) -> Callable[[Any], Any]:
    """The ``--json [FILE|-]`` option of a command; ``what`` says what the JSON holds."""
    return click.option(
        "--json",
        "json_dest",
        metavar="[FILE|-]",
        is_flag=False,
        flag_value=STDOUT,
        default=None,
        help=f"Write {what} as JSON to FILE, or to stdout with '-' or no value (the table then goes to stderr).",
    )


def seeds_option(help_text: str) -> Callable[[Any], Any]:
    """``--seeds N`` (count, >= 1): workload seeds per simulation; ``help_text`` says what is reported."""

    def check(ctx: click.Context, param: click.Parameter, value: int) -> int:
        if value < 1:
            raise click.BadParameter(f"{value} is not a seed count: give 1 or more", ctx=ctx, param=param)
        return value

    return click.option("--seeds", "n_seeds", type=int, default=1, show_default=True, callback=check, help=help_text)


def quiet_option() -> Callable[[Any], Any]:
    """``-q/--quiet``: no progress display (the one spelling every command uses)."""
    return click.option("-q", "--quiet", is_flag=True, help="No progress display (bars, start-up phases).")


def show_progress(quiet: bool, json_dest: str | None) -> bool:
    """Progress displays (bars, start-up phases) are for a person at a terminal: none with ``-q``,
    with ``--json -`` (stdout is data then) or when stdout or stderr is not a terminal."""
    if quiet or json_dest == STDOUT:
        return False
    from rich.console import Console

    return Console().is_terminal and Console(stderr=True).is_terminal


def decision_warnings(report: Any, label: str) -> list[str]:
    """One warning line each for a run's policy fallbacks and clamped answers (none when there were none).

    Both are in the JSON report too, decision by decision (``cycles[].decisions[]`` with
    ``fallback``, ``clamped`` and ``reason``); these lines say that they happened and where to look.
    """
    decisions = [d for c in report.cycles for d in c.decisions] + list(getattr(report, "startup_decisions", []))
    lines = []
    for flag, what in (
        ("fallback", "fell back to the safe decision (it raised, timed out or returned a wrong type or value)"),
        ("clamped", "gave an answer outside the safe range, which was clamped"),
    ):
        hits = [d for d in decisions if getattr(d, flag)]
        if hits:
            first = hits[0]
            lines.append(
                f"warning: {label}: policy {report.policy!r} {what} {len(hits)} time(s), first in cycle "
                f"{first.global_steps + 1} at {first.method}: {first.reason or first.raw}; each is in the "
                f"JSON report under cycles[].decisions[] ({flag}: true, reason)"
            )
    return lines


def human_console(json_dest: str | None, *, width: int | None = None) -> Any:
    """The rich console for tables and summaries: stderr when JSON goes to stdout, else stdout."""
    from rich.console import Console

    to_stderr = json_dest == STDOUT
    probe = Console(stderr=to_stderr)
    # Pipes and files get 160 columns (unless COLUMNS says otherwise), so redirected output does
    # not wrap at rich's default of 80.
    if width is None and not probe.is_terminal and not os.environ.get("COLUMNS"):
        width = 160
    # markup=False: run labels such as "seed[default]" are text, not rich style tags.
    return Console(stderr=to_stderr, width=width, highlight=False, markup=False)


def emit_json(json_dest: str, payload: Any, *, allow_nan: bool = False) -> None:
    """Print ``payload`` as JSON on stdout (``-``) or write it to the file ``json_dest``."""
    text = json.dumps(payload, indent=1, allow_nan=allow_nan) + "\n"
    if json_dest == STDOUT:
        click.echo(text, nl=False)
        return
    try:
        Path(json_dest).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"--json {json_dest}: cannot write the file ({exc.strerror}); choose a writable path or '-' for stdout"
        ) from None


# ---- Shell completion ---------------------------------------------------------------------------


def complete_presets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Preset names starting with ``incomplete`` (scenario files complete as paths)."""
    from click.shell_completion import CompletionItem

    from dynres.runtime.sim import presets

    items: list[Any] = [CompletionItem(n) for n in presets.preset_names() if n.startswith(incomplete)]
    if not items or param.name in ("scenario", "compare"):
        items.append(CompletionItem(incomplete, type="file"))
    return items


def complete_policies(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Installed policy names starting with ``incomplete``."""
    from click.shell_completion import CompletionItem

    from dynres.core import installed_policies

    return [CompletionItem(n) for n in installed_policies() if n.startswith(incomplete)]
