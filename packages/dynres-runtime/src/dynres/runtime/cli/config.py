"""``dynres config check FILE``: validate a dynres config, a ``dynres run`` file or a simulator scenario."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from dynres.runtime.cli.reference import SCHEMA_KINDS, reference_markdown, schema_model

RUN_KEYS = frozenset({"run", "ray", "engines", "model", "task"})
"""Top-level keys only a ``dynres run`` file has; a file with any of them is checked as one."""
SCENARIO_KEYS = frozenset({"cluster", "workload", "costs", "steps", "seed", "extends", "description", "name"})
"""Top-level keys only a simulator scenario has (a run file with the deprecated ``cluster:`` has ``run:``)."""


@click.group(name="config", short_help="Validate config, run and scenario files; print their JSON Schema.")
def command() -> None:
    """Validate configuration and scenario files; print their JSON Schema or reference."""


@command.command(name="schema", short_help="Print the JSON Schema (or a markdown reference) of a file kind.")
@click.argument("kind", type=click.Choice(SCHEMA_KINDS), default="config")
@click.option(
    "--markdown",
    is_flag=True,
    help="Print the markdown reference of every kind instead (what docs/config-reference.md holds).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Reject every key dynres does not model, as `config check --strict` does (default: a config or "
    "run file may hold verl's other keys, which `config check` ignores).",
)
def schema(kind: str, markdown: bool, strict: bool) -> None:
    """Print the JSON Schema of KIND: config (default), run or scenario, from the pydantic models.

    Every field carries its description and unit; editors that read JSON Schema can check YAML
    files against it. It accepts what `dynres config check` accepts: a config or run file may
    hold verl's keys dynres does not model (``--strict``: no key beyond dynres's); a scenario
    takes dynres's keys only.
    """
    import json

    if markdown:
        click.echo(reference_markdown(), nl=False)
        return
    click.echo(json.dumps(json_schema(kind, strict=strict), indent=1))


def json_schema(kind: str, *, strict: bool = False) -> dict[str, Any]:
    """The JSON Schema of file kind ``kind``; outside ``strict``, config and run objects admit other keys.

    The models forbid unknown keys, but ``config check`` and ``dynres run`` read a complete verl
    config by dropping verl's keys first; a schema that forbade them would reject files those
    commands take. Scenarios are never verl files, so theirs stays closed.
    """
    schema = schema_model(kind).model_json_schema()
    if strict or kind == "scenario":
        return schema

    def open_objects(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("additionalProperties") is False:
                node["additionalProperties"] = True
            for value in node.values():
                open_objects(value)
        elif isinstance(node, list):
            for value in node:
                open_objects(value)

    open_objects(schema)
    return schema


@command.command(name="check", short_help="Validate a config, run or scenario file and the policy it names.")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--strict", is_flag=True, help="Reject verl keys dynres does not model (default: ignore them, named in one line)."
)
def check(file: str, strict: bool) -> None:
    """Validate FILE (a dynres config, a `dynres run` file or a scenario) and its policy; print OK + a summary.

    A complete verl fully-async config is a dynres config: the keys dynres models are validated,
    verl's other keys are ignored and named in one line on stderr (``--strict`` rejects them).
    """
    from dynres.core.config import read_yaml

    data = read_yaml(file)
    keys = set(data) if isinstance(data, Mapping) else set()
    if keys & RUN_KEYS:
        _check_run(file, strict)
    elif keys & SCENARIO_KEYS:
        _check_scenario(file)
    else:
        _check_config(file, data, strict)


def _check_policy(async_training: Any) -> str:
    """Build the named policy with its params (so bad ones fail here); return 'name (path)'."""
    from dynres.core.loading import policy_from_config

    spec = async_training.dynamic_schedule_policy
    name = policy_from_config(async_training).name
    return name if name == spec else f"{name} ({spec})"


def _check_scenario(file: str) -> None:
    from dynres.runtime.sim.scenario import load_scenario

    scenario = load_scenario(file)
    scenario.dynres_config()  # the runtime config it implies must validate too
    policy = _check_policy(scenario.async_training)
    click.echo(f"OK: {file} is a valid simulator scenario")
    click.echo(f"  {scenario.summary()}")
    click.echo(f"  policy: {policy}")


def _check_run(file: str, strict: bool) -> None:
    from dynres.runtime.realrun.config import load_run_config

    cfg = load_run_config(file, strict=strict, on_ignored=lambda line: click.echo(line, err=True))
    policy = _check_policy(cfg.async_training)
    eng = cfg.engines
    click.echo(f"OK: {file} is a valid dynres run file")
    click.echo(
        f"  {cfg.run.steps} cycles; {cfg.num_standalone_replicas} standalone + {cfg.num_hybrid_replicas} hybrid "
        f"{eng.rollout} replicas, {eng.trainer} trainer, runtime {eng.runtime}"
    )
    click.echo(f"  policy: {policy}")


def _check_config(file: str, data: Any, strict: bool) -> None:
    from dynres.core.config import DynresConfig, drop_verl_only_keys, ignored_verl_keys_line, validate_model

    if not strict:
        data, removed = drop_verl_only_keys(data, DynresConfig)
        if removed:
            click.echo(ignored_verl_keys_line(removed, file), err=True)
    cfg = validate_model(DynresConfig, data, file)
    at = cfg.async_training
    policy = _check_policy(at)
    click.echo(f"OK: {file} is a valid dynres config")
    mode = "dynamic scheduling" if at.use_dynamic_resource_scheduling else "static (no hybrid replicas)"
    click.echo(
        f"  {cfg.trainer.n_gpus} trainer GPUs, {cfg.rollout.n_gpus} rollout GPUs, {mode}; "
        f"{cfg.num_standalone_replicas} standalone + {cfg.num_hybrid_replicas} hybrid replicas"
    )
    click.echo(
        f"  policy: {policy}; required_samples={cfg.required_samples}, "
        f"trigger_parameter_sync_step={at.trigger_parameter_sync_step}, "
        f"staleness_threshold={at.staleness_threshold}"
    )
