"""``dynres simulate``: run a scenario (or preset) on the simulator and compare runs.

Runs are labelled ``scenario[policy]``. ``--set`` and ``--seed`` apply to every run, ``--set-run N``
to run N only; ``--policy`` only to the main run, ``--compare-policy`` adds runs of the main
scenario with other policies, and ``--compare`` runs keep each scenario's own policy.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from dynres.core.errors import ConfigError, ScenarioError
from dynres.runtime.cli.output import (
    STDOUT,
    complete_policies,
    complete_presets,
    emit_json,
    human_console,
    json_option,
    quiet_option,
    seeds_option,
)


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _list_presets(json_dest: str | None) -> None:
    from rich.table import Table

    from dynres.runtime.sim import presets

    rows = [{"name": n, "description": presets.preset_description(n)} for n in presets.preset_names()]
    if json_dest:
        emit_json(json_dest, rows)
        if json_dest == STDOUT:
            return
    table = Table(title="dynres simulate presets", show_lines=False)
    table.add_column("preset", no_wrap=True)
    table.add_column("description")
    for r in rows:
        table.add_row(r["name"], r["description"])
    human_console(json_dest).print(table)


def _vs_first(results: list[Any]) -> list[float]:
    """Each run's relative difference in end-to-end time from run #1 (fraction; run #1: 0)."""
    from dynres.runtime.sim.runner import relative_difference

    first = results[0].end_to_end_s
    return [relative_difference(r.end_to_end_s, first) for r in results]


def _summary_tables(results: list[Any]) -> tuple[Any, Any]:
    """Two tables that each fit in 80 columns: end-to-end times, then utilizations and switching."""
    from rich import box
    from rich.table import Table

    vs = _vs_first(results)
    style: dict[str, Any] = {
        "box": box.SIMPLE_HEAD,
        "title_justify": "left",
        "show_edge": False,
        "padding": (0, 1, 0, 0),
    }
    times = Table(title="simulated end-to-end time", **style)
    times.add_column("#", justify="right", no_wrap=True)
    times.add_column("run: scenario[policy]", overflow="fold")
    for header in ("end-to-end\n(h)", "lower\nbound (h)", "x\nbound", "vs #1"):
        times.add_column(header, justify="right", no_wrap=True)
    util = Table(title="utilization and switching (means over steps)", **style)
    util.add_column("#", justify="right", no_wrap=True)
    for header in ("train\nutil", "rollout\nutil", "cluster\nutil", "hybrid\nswitches", "mq_size\n(samples)"):
        util.add_column(header, justify="right", no_wrap=True)
    for i, (r, d) in enumerate(zip(results, vs, strict=True), start=1):
        s = r.summary()
        times.add_row(
            str(i),
            r.label,
            _fmt(r.end_to_end_s / 3600, 3),
            _fmt(r.lower_bound_s / 3600, 3),
            _fmt(s["ratio_to_bound"]),
            "-" if i == 1 else f"{d * 100:+.1f}%",
        )
        util.add_row(
            str(i),
            _fmt(s["mean_train_utilization"]),
            _fmt(s["mean_rollout_utilization"]),
            _fmt(s["mean_resource_utilization"]),
            str(s["switches"]),
            _fmt(s["mean_mq_size"], 1),
        )
    return times, util


def _comparison_lines(results: list[Any]) -> list[str]:
    """One line per run after the first: how much longer or shorter it is than run #1 (same % as the table)."""
    lines = []
    for i, (r, d) in enumerate(zip(results, _vs_first(results), strict=True), start=1):
        if i == 1 or math.isnan(d):
            continue
        how = f"{abs(d) * 100:.1f}% {'longer' if d > 0 else 'shorter'} than" if d else "as long as"
        lines.append(f"#{i} {r.label}: {how} #1")
    return lines


def _over_seeds(scenarios: list[Any], runs: list[Any], first: list[Any], n: int) -> dict[str, dict[str, Any]]:
    """Each scenario again with seeds seed+1 .. seed+n-1: mean, min, max, spread of end-to-end."""
    from dynres.runtime.sim.runner import build_policy, simulate

    out: dict[str, dict[str, Any]] = {}
    for sc, (_, pol), r0 in zip(scenarios, runs, first, strict=True):
        # Keyed by the run's label: --compare-policy runs share a scenario name.
        seeds = [sc.seed + k for k in range(n)]
        rs = [r0] + [simulate(sc.model_copy(update={"seed": s}), policy=build_policy(sc, pol)) for s in seeds[1:]]
        e2e = [r.end_to_end_s for r in rs]
        mean = sum(e2e) / n
        out[r0.label] = {
            "seeds": seeds,
            "end_to_end_s": e2e,
            "mean_s": mean,
            "min_s": min(e2e),
            "max_s": max(e2e),
            "spread": (max(e2e) - min(e2e)) / mean if mean > 0 else 0.0,
            "lower_bound_mean_s": sum(r.lower_bound_s for r in rs) / n,
        }
    return out


def _payload(results: list[Any]) -> Any:
    """The JSON: one run's object, or ``{"runs": [...], "vs_first": {label: fraction}}``."""
    if len(results) == 1:
        return results[0].to_dict()
    vs = _vs_first(results)
    runs = []
    for r, d in zip(results, vs, strict=True):
        run = r.to_dict()
        run["vs_first"] = None if math.isnan(d) else d
        runs.append(run)
    return {"runs": runs, "vs_first": {run["label"]: run["vs_first"] for run in runs[1:]}}


def _plot_dirs(results: list[Any]) -> list[str]:
    """A folder name per run, ``scenario.policy``, made unique with ``-2``, ``-3`` ... (no brackets for shells)."""
    used: set[str] = set()
    names = []
    for r in results:
        base = f"{r.scenario.name or 'run'}.{r.policy}"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        names.append(name)
    return names


def _write_plots(out: str, results: list[Any]) -> list[Path]:
    from dynres.runtime.plots import write_comparison_plots, write_plots

    def one(r: Any, where: str | Path, label: str) -> list[Path]:
        return write_plots(
            r.report, where, title=label, queue_cap=r.queue_cap, hybrid_replicas=r.scenario.num_hybrid_replicas
        )

    if len(results) == 1:
        return one(results[0], out, results[0].label)
    paths: list[Path] = []
    labels = _labels(results)
    for r, folder, label in zip(results, _plot_dirs(results), labels, strict=True):
        paths += one(r, Path(out) / folder, label)
    paths += write_comparison_plots(
        dict(zip(labels, (r.report for r in results), strict=True)),
        out,
        queue_caps={lab: r.queue_cap for lab, r in zip(labels, results, strict=True)},
    )
    return paths


def _labels(results: list[Any]) -> list[str]:
    """Run labels for legends; a label used twice gets its run number (``#3 x[p]``) so lines stay apart."""
    plain = [r.label for r in results]
    return [f"#{i} {lab}" if plain.count(lab) > 1 else lab for i, lab in enumerate(plain, start=1)]


def _config_overrides(path: str, strict: bool) -> dict[str, Any]:
    """The scenario keys that config file ``path`` sets; verl-only keys dropped (and named) unless strict."""
    from dynres.core.config import DynresConfig, drop_verl_only_keys, ignored_verl_keys_line, read_yaml, validate_model
    from dynres.runtime.sim.scenario import config_overrides

    data = read_yaml(path)
    if not strict:
        data, removed = drop_verl_only_keys(data, DynresConfig)
        if removed:
            click.echo(ignored_verl_keys_line(removed, path), err=True)
    return config_overrides(validate_model(DynresConfig, data, path))


def _run_sets(items: tuple[tuple[str, str], ...], count: int) -> dict[int, dict[str, Any]]:
    """``--set-run N KEY=VALUE`` items as {run index (0-based): overrides}; bad run numbers fail here."""
    from dynres.core.config import parse_set_items

    by_run: dict[int, list[str]] = {}
    for run, item in items:
        if not run.isdigit() or not 1 <= int(run) <= count:
            raise ConfigError(
                f"--set-run {run} {item}: no run #{run}; runs are numbered 1..{count} in the order "
                "main run, --compare-policy runs, --compare runs (the table's # column)"
            )
        by_run.setdefault(int(run) - 1, []).append(item)
    return {i: parse_set_items(tuple(v)) for i, v in by_run.items()}


@click.command(
    name="simulate",
    short_help="Simulate a scenario or preset on a virtual clock; compare policies and scenarios.",
)
@click.argument("scenario", required=False, shell_complete=complete_presets)
@click.option(
    "--preset", metavar="NAME", shell_complete=complete_presets, help="Simulate a shipped preset (see --list-presets)."
)
@click.option(
    "--policy",
    metavar="NAME_OR_PATH",
    shell_complete=complete_policies,
    help="Policy of the main run: an installed name, module:Class or file.py:Class.",
)
@click.option(
    "--compare-policy",
    "compare_policies",
    multiple=True,
    metavar="NAME_OR_PATH",
    shell_complete=complete_policies,
    help="Also run the main scenario with this policy and compare. Repeatable.",
)
@click.option(
    "--compare",
    multiple=True,
    metavar="PRESET_OR_FILE",
    shell_complete=complete_presets,
    help="Also simulate this preset or scenario file (with its own policy) and compare. Repeatable.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a scenario key in every run, dotted (e.g. async_training.staleness_threshold=0.3); "
    "the value is YAML. Repeatable.",
)
@click.option(
    "--set-run",
    "run_sets",
    multiple=True,
    nargs=2,
    metavar="N KEY=VALUE",
    help="Override a key in run N only (1 = main run, then --compare-policy, then --compare runs), e.g. "
    "--set-run 2 async_training.dynamic_schedule_policy_params.deactivate_ratio=0.5. Repeatable.",
)
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    help="A dynres or complete verl config: its async_training and actor_rollout_ref keys and its "
    "trainer/rollout GPU counts apply to every run, before --set. verl keys dynres does not model "
    "are ignored and named in one line.",
)
@click.option("--strict", is_flag=True, help="With --config: reject verl keys dynres does not model.")
@json_option("the results")
@click.option("--plot", "plot_dir", metavar="DIR", type=click.Path(file_okay=False), help="Write PNG plots to DIR.")
@click.option("--seed", type=int, help="Seed of every run (replaces the scenarios' seed).")
@seeds_option(
    "Run each scenario with N consecutive seeds (from --seed or its own) and print the mean "
    "and spread of the end-to-end time, so that one draw does not decide a comparison."
)
@click.option("--list-presets", is_flag=True, help="List the shipped presets and exit.")
@quiet_option()
def command(
    scenario: str | None,
    preset: str | None,
    policy: str | None,
    compare_policies: tuple[str, ...],
    compare: tuple[str, ...],
    sets: tuple[str, ...],
    run_sets: tuple[tuple[str, str], ...],
    config_file: str | None,
    strict: bool,
    json_dest: str | None,
    plot_dir: str | None,
    seed: int | None,
    n_seeds: int,
    list_presets: bool,
    quiet: bool,
) -> None:
    """Simulate SCENARIO (a YAML file or preset name) or --preset NAME on a virtual clock.

    Runs are labelled scenario[policy] and numbered: 1 is the main run, then one per
    --compare-policy (same scenario, another policy), then one per --compare (another scenario
    with its own policy). Prints end-to-end time, the analytic lower bound, how each run compares
    with run 1, mean utilizations, switches and mean queue size. Examples:

        dynres simulate --preset seed-dynamic-16-16 --compare-policy fixed_ratio

        dynres simulate --preset seed-dynamic-16-16 --compare seed-static-16-16
    """
    if list_presets:
        given = (scenario, preset, compare, compare_policies, policy, sets, run_sets, plot_dir, config_file)
        if any(given) or seed is not None:
            raise click.UsageError("--list-presets lists the presets and exits; give it alone")
        _list_presets(json_dest)
        return
    if bool(scenario) == bool(preset):
        raise click.UsageError("give exactly one of SCENARIO or --preset NAME (see --list-presets)")
    if seed is not None and seed < 0:
        raise click.BadParameter("must be >= 0", param_hint="--seed")

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from dynres.core.config import parse_set_items
    from dynres.runtime.cli.paths import check_output_dir, check_output_file
    from dynres.runtime.sim import presets
    from dynres.runtime.sim.runner import build_policy, run_label, simulate
    from dynres.runtime.sim.scenario import load_scenario

    overrides = parse_set_items(sets)
    if strict and not config_file:
        raise click.UsageError("--strict applies to --config FILE; give both or neither")
    base = _config_overrides(config_file, strict) if config_file else {}
    for flag, key, value in (
        ("--seed", "seed", seed),
        ("--policy", "async_training.dynamic_schedule_policy", policy),
    ):
        if value is not None and key in overrides:
            raise ConfigError(f"{flag} and --set {key}=... both set {key}; give only one of them")
    if json_dest not in (None, STDOUT):
        check_output_file(Path(json_dest), "--json")
    if plot_dir:
        check_output_dir(Path(plot_dir), "--plot", create=False)
    main_source = preset if preset else scenario
    assert main_source is not None
    if preset and not presets.is_preset(preset):
        presets.preset_raw(preset)  # raises the unknown-preset error with a did-you-mean
    runs: list[tuple[str, str | None]] = [
        (main_source, policy),
        *((main_source, p) for p in compare_policies),
        *((c, None) for c in compare),
    ]
    per_run = _run_sets(run_sets, len(runs))
    if plot_dir:
        from dynres.runtime.plots import require_matplotlib

        require_matplotlib()  # before any work: one line naming the [plot] extra
    # Validate every scenario and policy before simulating any, so a typo in the last run fails fast.
    scenarios = [
        load_scenario(src, overrides={**base, **overrides, **per_run.get(i, {})}) for i, (src, _) in enumerate(runs)
    ]
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
    out = human_console(json_dest)
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
        for i, (sc, pol) in enumerate(zip(scenarios, policies, strict=True), start=1):
            label = run_label(sc.name, pol.name)
            task = progress.add_task(f"#{i} {label}", total=sc.steps, sim_h="0.00 h")

            def tick(cycle: Any, task: Any = task) -> None:
                progress.update(task, advance=1, sim_h=f"{cycle.end_s / 3600:.2f} h")

            result = simulate(sc, policy=pol, progress=tick)
            results.append(result)
            if result.report.policy_fallbacks:
                err.print(
                    f"[yellow]warning:[/] #{i} {label}: policy {result.policy!r} fell back to the safe "
                    f"decision {result.report.policy_fallbacks} time(s) (raised, timed out or "
                    "returned a wrong type); see the JSON report's decisions"
                )
    times, util = _summary_tables(results)
    out.print(times)
    out.print()
    out.print(util)
    spread: dict[str, dict[str, Any]] = {}
    if n_seeds > 1:
        spread = _over_seeds(scenarios, runs, results, n_seeds)
        for label, row in spread.items():
            out.print(
                f"{label}: end-to-end over seeds {row['seeds'][0]}..{row['seeds'][-1]}: "
                f"mean {_fmt(row['mean_s'] / 3600, 3)} h, min {_fmt(row['min_s'] / 3600, 3)} h, "
                f"max {_fmt(row['max_s'] / 3600, 3)} h (spread {row['spread'] * 100:.1f}%), "
                f"lower bound mean {_fmt(row['lower_bound_mean_s'] / 3600, 3)} h"
            )
    for line in _comparison_lines(results):
        out.print(line)
    if json_dest:
        payload = _payload(results)
        if spread:
            payload["over_seeds"] = spread
        emit_json(json_dest, payload)
        if json_dest != STDOUT:
            out.print(f"wrote {json_dest}")
    if plot_dir:
        paths = _write_plots(plot_dir, results)
        out.print(f"wrote {len(paths)} plots to {plot_dir}")
