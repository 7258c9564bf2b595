"""``dynres policies``: what policies are installed (``list``) and what one of them takes (``show``)."""

from __future__ import annotations

import inspect
from typing import Any

import click

from dynres.runtime.cli.output import STDOUT, complete_policies, emit_json, human_console, json_option


@click.group(name="policies", short_help="List installed policies; show one policy's docs and params.")
def command() -> None:
    """Inspect the installed scheduling policies."""


@command.command(name="list", short_help="List installed policies: name, distribution, version, import path, status.")
@json_option("the list")
def list_policies(json_dest: str | None) -> None:
    """List installed policies: name, distribution, version, import path, and whether it loads."""
    from rich.table import Table

    from dynres.core import installed_policies

    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "distribution": e.distribution,
            "version": e.version,
            "import_path": e.value,
            "error": _load_error(e),
        }
        for name, entries in installed_policies().items()
        for e in entries
    ]
    if json_dest:
        emit_json(json_dest, rows)
        if json_dest == STDOUT:
            return
    names = [r["name"] for r in rows]
    table = Table(title="installed dynres policies")
    for col in ("name", "distribution", "version", "import path", "status"):
        table.add_column(col, overflow="fold")
    for r in rows:
        clash = " (duplicate!)" if names.count(r["name"]) > 1 else ""
        status = "ok" if r["error"] is None else f"BROKEN: {r['error']}"
        table.add_row(r["name"] + clash, r["distribution"], r["version"], r["import_path"], status)
    console = human_console(json_dest)
    console.print(table)
    if not rows:
        console.print("no policies installed; install dynres-policies or a policy distribution")


def _load_error(entry: Any) -> str | None:
    """None when the entry point imports and validates as a policy, else why not (one line)."""
    from dynres.core.errors import DynresError

    try:
        entry.load()
    except DynresError as exc:
        return " ".join(str(exc).split())
    return None


def policy_description(spec: str) -> dict[str, Any]:
    """What ``policies show`` prints: name, import path, distribution, docs and one row per param."""
    from dynres.core import installed_policies
    from dynres.core.loading import resolve_policy_class

    cls = resolve_policy_class(spec)
    entries = installed_policies().get(spec, ())
    params = []
    for key, field in cls.Params.model_fields.items():
        constraints = [_constraint(m) for m in field.metadata]
        default = field.get_default(call_default_factory=True)
        params.append(
            {
                "name": key,
                "type": _type_name(field.annotation),
                "default": default,
                "constraints": constraints,
                "description": field.description or "",
            }
        )
    return {
        "name": cls.name,
        "import_path": f"{cls.__module__}:{cls.__qualname__}",
        "distribution": entries[0].distribution if entries else None,
        "version": entries[0].version if entries else None,
        "doc": inspect.cleandoc(cls.__doc__ or ""),
        "params": params,
    }


_BOUNDS = (
    ("ge", ">="),
    ("gt", ">"),
    ("le", "<="),
    ("lt", "<"),
    ("min_length", "length >="),
    ("max_length", "length <="),
)


def _constraint(meta: Any) -> str:
    """A pydantic/annotated-types bound as text: ``>= 0.0``."""
    for attr, sign in _BOUNDS:
        if getattr(meta, attr, None) is not None:
            return f"{sign} {getattr(meta, attr)}"
    return str(meta)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


@command.command(name="show", short_help="Show one policy: docs, import path and its params (type, default, units).")
@click.argument("name", shell_complete=complete_policies)
@json_option("the description")
def show(name: str, json_dest: str | None) -> None:
    """Show policy NAME (an installed name, module:Class or file.py:Class): docs and params.

    Params are what `async_training.dynamic_schedule_policy_params` (or `--set-run N
    async_training.dynamic_schedule_policy_params.KEY=VALUE` in `dynres simulate`) sets.
    """
    from rich.table import Table

    info = policy_description(name)
    if json_dest:
        emit_json(json_dest, info)
        if json_dest == STDOUT:
            return
    out = human_console(json_dest)
    where = f"{info['distribution']} {info['version']}" if info["distribution"] else "not installed as an entry point"
    out.print(f"{info['name']}  ({info['import_path']}; {where})")
    if info["doc"]:
        out.print()
        out.print(info["doc"])
    out.print()
    if not info["params"]:
        out.print("params: none")
        return
    table = Table(title="params (async_training.dynamic_schedule_policy_params)", title_justify="left")
    for col in ("param", "type", "default", "range", "meaning and unit"):
        table.add_column(col, overflow="fold")
    for p in info["params"]:
        table.add_row(p["name"], p["type"], repr(p["default"]), ", ".join(p["constraints"]), p["description"])
    out.print(table)
