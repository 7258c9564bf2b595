"""``dynres simulate``: run a scenario (or preset) on the simulator and compare runs.

``--set`` and ``--seed`` apply to every run (the main one and each ``--compare``); ``--policy``
only to the main scenario, so a comparison keeps each preset's own policy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from dynres.core.errors import ConfigError, ScenarioError


def _fmt_h(seconds: float) -> str:
    return f"{seconds / 3600:.3f} h"


def _fmt(v: float, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _list_presets() -> None:
    from rich.console import Console
    from rich.table import Table

    from dynres.runtime.sim import presets

    table = Table(title="dynres simulate presets", show_lines=False)
    table.add_column("preset", no_wrap=True)
    table.add_column("description")
    for name in presets.preset_names():
        table.add_row(name, presets.preset_description(name))
    Console(width=140).print(table)


def _summary_table(results: list[Any]) -> Any:
    from rich.console import JustifyMethod
    from rich.table import Table

    table = Table(title="simulated end-to-end time")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("run", "left"),
        ("policy", "left"),
        ("end-to-end", "right"),
        ("lower bound", "right"),
        ("ratio", "right"),
        ("vs first", "right"),
        ("train util", "right"),
        ("rollout util", "right"),
        ("cluster util", "right"),
        ("switches", "right"),
        ("mean mq_size", "right"),
    )
    for col, justify in columns:
        table.add_column(col, justify=justify)
    first = results[0].end_to_end_s
    for r in results:
        s = r.summary()
        delta = (r.end_to_end_s - first) / first * 100 if first > 0 else 0.0
        table.add_row(
            r.scenario.name,
            r.policy,
            _fmt_h(r.end_to_end_s),
            _fmt_h(r.lower_bound_s),
            _fmt(s["ratio_to_bound"]),
            "-" if r is results[0] else f"{delta:+.1f}%",
            _fmt(s["mean_train_utilization"]),
            _fmt(s["mean_rollout_utilization"]),
            _fmt(s["mean_resource_utilization"]),
            str(s["switches"]),
            _fmt(s["mean_mq_size"], 1),
        )
    return table


def _speedups(results: list[Any]) -> dict[str, float]:
    """How much shorter the first run is than each other run (fraction of the other's time)."""
    first = results[0]
    return {
        r.scenario.name: (r.end_to_end_s - first.end_to_end_s) / r.end_to_end_s
        for r in results[1:]
        if r.end_to_end_s > 0
    }


def _over_seeds(scenarios: list[Any], runs: list[Any], first: list[Any], n: int) -> dict[str, dict[str, Any]]:
    """Each scenario again with seeds seed+1 .. seed+n-1: mean, min, max, spread of end-to-end."""
    from dynres.runtime.sim.runner import build_policy, simulate

    out: dict[str, dict[str, Any]] = {}
    for sc, (_, pol), r0 in zip(scenarios, runs, first, strict=True):
        seeds = [sc.seed + k for k in range(n)]
        rs = [r0] + [simulate(sc.model_copy(update={"seed": s}), policy=build_policy(sc, pol)) for s in seeds[1:]]
        e2e = [r.end_to_end_s for r in rs]
        mean = sum(e2e) / n
        out[sc.name] = {
            "seeds": seeds,
            "end_to_end_s": e2e,
            "mean_s": mean,
            "min_s": min(e2e),
            "max_s": max(e2e),
            "spread": (max(e2e) - min(e2e)) / mean if mean > 0 else 0.0,
            "lower_bound_mean_s": sum(r.lower_bound_s for r in rs) / n,
        }
    return out


def _write_json(path: str, results: list[Any], spread: dict[str, dict[str, Any]] | None = None) -> None:
    if len(results) == 1:
        payload: Any = results[0].to_dict()
    else:
        payload = {
            "runs": [r.to_dict() for r in results],
            "first_run_shorter_by": _speedups(results),
        }
    if spread:
        payload["over_seeds"] = spread
    try:
        Path(path).write_text(json.dumps(payload, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write the file ({exc.strerror}); choose a writable path") from None


def _write_plots(out: str, results: list[Any]) -> list[Path]:
    from dynres.runtime.plots import write_comparison_plots, write_plots

    paths: list[Path] = []
    if len(results) == 1:
        return write_plots(results[0].report, out, title=results[0].scenario.name)
    used: set[str] = set()
    for r in results:
        name = r.scenario.name or "run"
        while name in used:
            name += "_"
        used.add(name)
        paths += write_plots(r.report, Path(out) / name, title=name)
    paths += write_comparison_plots({r.scenario.name: r.report for r in results}, out)
    return paths


@click.command(name="simulate")
@click.argument("scenario", required=False)
@click.option("--preset", metavar="NAME", help="Simulate a shipped preset (see --list-presets).")
@click.option(
    "--policy",
    metavar="NAME_OR_PATH",
    help="Policy of the main run: an installed name, module:Class or file.py:Class.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a scenario key, dotted (e.g. async_training.staleness_threshold=0.3); "
    "the value is YAML. Repeatable; applies to every run.",
)
@click.option(
    "--compare",
    multiple=True,
    metavar="PRESET_OR_FILE",
    help="Also simulate this preset or scenario file and compare. Repeatable.",
)
@click.option("--json", "json_path", metavar="FILE", help="Write the results as JSON to FILE.")
@click.option("--plot", "plot_dir", metavar="DIR", help="Write PNG plots to DIR.")
@click.option("--seed", type=int, help="Seed of every run (replaces the scenarios' seed).")
@click.option(
    "--seeds",
    "n_seeds",
    type=int,
    default=1,
    show_default=True,
    help="Run each scenario with N consecutive seeds (from --seed or its own) and print the mean "
    "and spread of the end-to-end time, so that one draw does not decide a comparison.",
)
@click.option("--list-presets", is_flag=True, help="List the shipped presets and exit.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def command(
    scenario: str | None,
    preset: str | None,
    policy: str | None,
    sets: tuple[str, ...],
    compare: tuple[str, ...],
    json_path: str | None,
    plot_dir: str | None,
    seed: int | None,
    n_seeds: int,
    list_presets: bool,
    quiet: bool,
) -> None:
    """Simulate SCENARIO (a YAML file or preset name) or --preset NAME on a virtual clock.

    Prints the end-to-end time, the analytic lower bound, mean utilizations, switches and mean
    queue size of each run. Example:

        dynres simulate --preset seed-dynamic-16-16 --compare seed-static-16-16
    """
    if list_presets:
        if scenario or preset or compare or policy or sets or json_path or plot_dir or seed is not None:
            raise click.UsageError("--list-presets lists the presets and exits; give it alone")
        _list_presets()
        return
    if bool(scenario) == bool(preset):
        raise click.UsageError("give exactly one of SCENARIO or --preset NAME (see --list-presets)")
    if seed is not None and seed < 0:
        raise click.BadParameter("must be >= 0", param_hint="--seed")
    if n_seeds < 1:
        raise click.BadParameter("must be >= 1", param_hint="--seeds")

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dynres.core.config import parse_set_items
    from dynres.runtime.cli.paths import check_output_dir, check_output_file
    from dynres.runtime.sim import presets
    from dynres.runtime.sim.runner import build_policy, simulate
    from dynres.runtime.sim.scenario import load_scenario

    overrides = parse_set_items(sets)
    for flag, key, value in (
        ("--seed", "seed", seed),
        ("--policy", "async_training.dynamic_schedule_policy", policy),
    ):
        if value is not None and key in overrides:
            raise ConfigError(f"{flag} and --set {key}=... both set {key}; give only one of them")
    if json_path:
        check_output_file(Path(json_path), "--json")
    if plot_dir:
        check_output_dir(Path(plot_dir), "--plot", create=False)
    main_source = preset if preset else scenario
    assert main_source is not None
    if preset and not presets.is_preset(preset):
        presets.preset_raw(preset)  # raises the unknown-preset error with a did-you-mean
    runs: list[tuple[str, str | None]] = [(main_source, policy)] + [(c, None) for c in compare]
    # Validate every scenario before simulating any, so a typo in the last --compare fails fast.
    scenarios = [load_scenario(src, overrides=overrides) for src, _ in runs]
    if seed is not None:
        scenarios = [s.model_copy(update={"seed": seed}) for s in scenarios]
    if policy and not scenarios[0].async_training.use_dynamic_resource_scheduling:
        chosen = build_policy(scenarios[0], policy).name
        if chosen != "static_fully_async":
            raise ScenarioError(
                f"--policy {policy}: scenario {scenarios[0].name!r} has "
                "async_training.use_dynamic_resource_scheduling: false, so it has no hybrid "
                f"replicas and {chosen!r} would run exactly like static_fully_async; add --set "
                "async_training.use_dynamic_resource_scheduling=true"
            )
    policies = [build_policy(sc, pol) for sc, (_, pol) in zip(scenarios, runs, strict=True)]

    err = Console(stderr=True)
    out = Console() if Console().is_terminal else Console(width=160)  # pipes/files: no wrapping
    results = []
    show = not quiet and err.is_terminal
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps, {task.fields[sim_h]} simulated"),
        TimeElapsedColumn(),
        console=err,
        disable=not show,
        transient=False,
    ) as progress:
        for sc, pol in zip(scenarios, policies, strict=True):
            task = progress.add_task(sc.name, total=sc.steps, sim_h="0.00 h")

            def tick(cycle: Any, task: Any = task) -> None:
                progress.update(task, advance=1, sim_h=f"{cycle.end_s / 3600:.2f} h")

            result = simulate(sc, policy=pol, progress=tick)
            results.append(result)
            if result.report.policy_fallbacks:
                err.print(
                    f"[yellow]warning:[/] {sc.name}: policy {result.policy!r} fell back to the safe "
                    f"decision {result.report.policy_fallbacks} time(s) (raised, timed out or "
                    "returned a wrong type); see the JSON report's decisions"
                )
    out.print(_summary_table(results))
    spread: dict[str, dict[str, Any]] = {}
    if n_seeds > 1:
        spread = _over_seeds(scenarios, runs, results, n_seeds)
        for name, row in spread.items():
            out.print(
                f"{name}: end-to-end over seeds {row['seeds'][0]}..{row['seeds'][-1]}: mean "
                f"{_fmt_h(row['mean_s'])}, min {_fmt_h(row['min_s'])}, max {_fmt_h(row['max_s'])} "
                f"(spread {row['spread'] * 100:.1f}%), lower bound mean {_fmt_h(row['lower_bound_mean_s'])}"
            )
    for name, frac in _speedups(results).items():
        word = "shorter" if frac >= 0 else "longer"
        out.print(f"{results[0].scenario.name} is {abs(frac) * 100:.1f}% {word} than {name}")
    if json_path:
        _write_json(json_path, results, spread)
        out.print(f"wrote {json_path}")
    if plot_dir:
        paths = _write_plots(plot_dir, results)
        out.print(f"wrote {len(paths)} plots to {plot_dir}")
