"""``dynres policies``: what policies are installed (the ``dynres.policies`` entry points)."""

from __future__ import annotations

import json

import click


@click.group(name="policies")
def command() -> None:
    """Inspect the installed scheduling policies."""


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def list_policies(as_json: bool) -> None:
    """List installed policies: name, distribution, version and import path."""
    from rich.console import Console
    from rich.table import Table

    from dynres.core import installed_policies

    rows = [
        {"name": name, "distribution": e.distribution, "version": e.version, "value": e.value}
        for name, entries in installed_policies().items()
        for e in entries
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    names = [r["name"] for r in rows]
    table = Table(title="installed dynres policies")
    for col in ("name", "distribution", "version", "import path"):
        table.add_column(col)
    for r in rows:
        clash = " (duplicate!)" if names.count(r["name"]) > 1 else ""
        table.add_row(r["name"] + clash, r["distribution"], r["version"], r["value"])
    Console(width=120).print(table)
    if not rows:
        click.echo("no policies installed; install dynres-policies or a policy distribution")
