"""``dynres policies``: what policies are installed (the ``dynres.policies`` entry points)."""

from __future__ import annotations

import json
from typing import Any

import click


@click.group(name="policies")
def command() -> None:
    """Inspect the installed scheduling policies."""


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def list_policies(as_json: bool) -> None:
    """List installed policies: name, distribution, version, import path, and whether it loads."""
    from rich.console import Console
    from rich.table import Table

    from dynres.core import installed_policies

    rows: list[dict[str, Any]] = [
        {"name": name, "distribution": e.distribution, "version": e.version, "value": e.value, "error": _load_error(e)}
        for name, entries in installed_policies().items()
        for e in entries
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    names = [r["name"] for r in rows]
    table = Table(title="installed dynres policies")
    for col in ("name", "distribution", "version", "import path", "status"):
        table.add_column(col)
    for r in rows:
        clash = " (duplicate!)" if names.count(r["name"]) > 1 else ""
        status = "ok" if r["error"] is None else f"BROKEN: {r['error']}"
        table.add_row(r["name"] + clash, r["distribution"], r["version"], r["value"], status)
    Console(width=120).print(table)
    if not rows:
        click.echo("no policies installed; install dynres-policies or a policy distribution")


def _load_error(entry: Any) -> str | None:
    """None when the entry point imports and validates as a policy, else why not (one line)."""
    from dynres.core.errors import DynresError

    try:
        entry.load()
    except DynresError as exc:
        return " ".join(str(exc).split())
    return None
