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


def time_unit(seconds: list[float]) -> tuple[str, float, int]:
    """The unit the tables give times in, by the longest time: (name, seconds per unit, decimals).

    Seconds below 10 minutes, minutes below 10 hours, else hours, so a short fitted run never
    prints ``0.000``.
    """
    longest = max((t for t in seconds if not math.isnan(t)), default=0.0)
    if longest < 600:
        return "s", 1.0, 1
    if longest < 36_000:
        return "min", 60.0, 1
    return "h", 3600.0, 3


def _summary_tables(comparison: Any) -> tuple[Any, Any]:
    """Two tables that each fit in 80 columns: end-to-end times (means over seeds when there are
    several), then utilizations and switching (each run's first seed)."""
    from rich import box
    from rich.table import Table

    results = comparison.results
    e2e, bound = comparison.end_to_end_s, comparison.lower_bound_s
    unit, per, digits = time_unit(e2e + bound)
    first_row: dict[str, Any] = next(iter(comparison.over_seeds.values()), {})
    seeds: list[int] = first_row.get("seeds", [])
    style: dict[str, Any] = {
        "box": box.SIMPLE_HEAD,
        "title_justify": "left",
        "show_edge": False,
        "padding": (0, 1, 0, 0),
    }
    over = f", mean of seeds {seeds[0]}..{seeds[-1]}" if len(seeds) > 1 else ""
    times = Table(title=f"simulated end-to-end time{over}", **style)
    times.add_column("#", justify="right", no_wrap=True)
    times.add_column("run: scenario[policy]", overflow="fold")
    for header in (f"end-to-end\n({unit})", f"lower\nbound\n({unit})", "x\nbound", "vs #1"):
        times.add_column(header, justify="right", no_wrap=True)
    util = Table(title=f"utilization and switching (step means{f', seed {seeds[0]}' if over else ''})", **style)
    util.add_column("#", justify="right", no_wrap=True)
    for header in ("train\nutil", "rollout\nutil", "cluster\nutil", "hybrid\nswitches", "mq_size\n(samples)"):
        util.add_column(header, justify="right", no_wrap=True)
    rows = zip(results, e2e, bound, comparison.vs_first, strict=True)
    for i, (r, t, b, d) in enumerate(rows, start=1):
        s = r.summary()
        times.add_row(
            str(i),
            r.label,
            _fmt(t / per, digits),
            _fmt(b / per, digits),
            _fmt(t / b if b > 0 else None),
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


def _comparison_lines(comparison: Any) -> list[str]:
    """One line per run after the first: how much longer or shorter it is than run #1 (same % as the table)."""
    lines = []
    for i, (r, d) in enumerate(zip(comparison.results, comparison.vs_first, strict=True), start=1):
        if i == 1 or math.isnan(d):
            continue
        how = f"{abs(d) * 100:.1f}% {'longer' if d > 0 else 'shorter'} than" if d else "as long as"
        lines.append(f"#{i} {r.label}: {how} #1" + (" (means)" if comparison.over_seeds else ""))
    return lines


def _seed_lines(comparison: Any) -> list[str]:
    """Per run, its end-to-end time's minimum, maximum and spread over seeds (none with one seed per run)."""
    rows = comparison.over_seeds
    unit, per, digits = time_unit([t for row in rows.values() for t in row["end_to_end_s"]])
    numbers = {r.label: i for i, r in reversed(list(enumerate(comparison.results, start=1)))}
    return [
        f"#{numbers[label]} over seeds {row['seeds'][0]}..{row['seeds'][-1]}: {_fmt(row['min_s'] / per, digits)} "
        f"to {_fmt(row['max_s'] / per, digits)} {unit} (spread {row['spread'] * 100:.1f}%)"
        for label, row in rows.items()
    ]


SHOW_AFTER_S = 2.0
"""Progress bars appear once a simulation has run this long (wall seconds): a plan that finishes
sooner prints its tables without a flash of bars."""


def _progress_observer(err: Any, progress: Any, *, enabled: bool) -> Any:
    """A PlanObserver that moves one rich progress bar per run (drawn once the plan has run
    :data:`SHOW_AFTER_S`) and warns on stderr about policy fallbacks and clamped answers."""
    import time

    from dynres.runtime.cli.output import decision_warnings
    from dynres.runtime.sim.comparison import PlanObserver

    class Bars(PlanObserver):
        def __init__(self) -> None:
            self.tasks: dict[int, Any] = {}
            self.t0 = time.perf_counter()  # the CLI's own wall clock, for when to draw; never the simulation's
            self.started = False

        def run_started(self, run: Any) -> None:
            self.tasks[run.number] = progress.add_task(
                f"#{run.number} {run.label}", total=run.scenario.steps, sim_h="0.00 h"
            )

        def cycle_done(self, run: Any, cycle: Any) -> None:
            progress.update(self.tasks[run.number], advance=1, sim_h=f"{cycle.end_s / 3600:.2f} h")
            if enabled and not self.started and time.perf_counter() - self.t0 >= SHOW_AFTER_S:
                self.started = True
                progress.start()

        def run_done(self, run: Any, result: Any) -> None:
            for line in decision_warnings(result.report, f"#{run.number} {run.label}"):
                err.print(line, markup=False, highlight=False, soft_wrap=True)

    return Bars()


def _simulate_with_progress(plan: Any, *, quiet: bool, json_dest: str | None, tracking_dir: Path | None) -> Any:
    """Simulate ``plan`` with a progress bar per run on stderr (for a person at a terminal: not with
    -q or --json -, and only once the plan runs longer than :data:`SHOW_AFTER_S`), tracking each
    run with the backends its trainer.logger names."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from dynres.runtime.cli.output import show_progress
    from dynres.runtime.sim.comparison import ObserverGroup, TrackingObserver, simulate_plan

    err = Console(stderr=True)
    tracking = TrackingObserver(
        plan, tracking_dir or Path("."), warn=lambda line: err.print(f"warning: {line}", markup=False, soft_wrap=True)
    )
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps, {task.fields[sim_h]} simulated, ETA"),
        TimeRemainingColumn(),
        console=err,
        transient=False,
    )
    bars = _progress_observer(err, progress, enabled=show_progress(quiet, json_dest))
    try:
        return simulate_plan(plan, ObserverGroup(tracking, bars))
    finally:
        tracking.close()
        if bars.started:
            progress.stop()


def _check_outputs(json_dest: str | None, plot_dir: str | None) -> None:
    """Fail before any work when the JSON file or the plot folder cannot be written."""
    from dynres.runtime.cli.paths import check_output_dir, check_output_file

    if json_dest not in (None, STDOUT):
        check_output_file(Path(json_dest), "--json")
    if plot_dir:
        from dynres.runtime.plots import require_matplotlib

        check_output_dir(Path(plot_dir), "--plot", create=False)
        require_matplotlib()  # before any work: one line naming the [plot] extra


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
@click.option(
    "--host",
    type=click.Choice(["dynres", "verl"]),
    default="dynres",
    show_default=True,
    help="Who drives the runs: the dynres runtime, or verl's own trainer order and "
    "DynamicResourceController (needs dynres-verl; policies then take verl's names: "
    "dynres:<name>, or verl's own default, fixed_ratio, static_fully_async).",
)
@click.option(
    "--out",
    "out_dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    help="Folder for the files of the tracking backends trainer.logger names, e.g. --set "
    "'trainer.logger=[tensorboard]' (default: a fresh dynres-runs/<scenario>).",
)
@click.option(
    "--explain",
    is_flag=True,
    help="After the tables, split each run's gap to its lower bound into causes (switch, sync, "
    "hybrid_trainer, tail, lost_work, imbalance; docs/simulator.md); with --seeds, the first seed's run.",
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
    host: str,
    out_dir: str | None,
    list_presets: bool,
    explain: bool,
    quiet: bool,
) -> None:
    """Simulate SCENARIO (a YAML file or preset name) or --preset NAME on a virtual clock.

    Runs are labelled scenario[policy] and numbered: 1 is the main run, then one per
    --compare-policy (same scenario, another policy), then one per --compare (another scenario
    with its own policy). Prints end-to-end time, the analytic lower bound, how each run compares
    with run 1, mean utilizations, switches and mean queue size. Examples:

        dynres simulate --preset seed-dynamic-16-16 --compare-policy fixed_ratio

        dynres simulate --preset seed-dynamic-16-16 --compare seed-static-16-16

        dynres simulate --preset seed-dynamic-16-16 --host verl --policy dynres:predictive
    """
    if list_presets:
        given = (scenario, preset, compare, compare_policies, policy, sets, run_sets, plot_dir, config_file, out_dir)
        if any(given) or seed is not None:
            raise click.UsageError("--list-presets lists the presets and exits; give it alone")
        _list_presets(json_dest)
        return
    if bool(scenario) == bool(preset):
        raise click.UsageError("give exactly one of SCENARIO or --preset NAME (see --list-presets)")
    if seed is not None and seed < 0:
        raise click.BadParameter("must be >= 0", param_hint="--seed")
    if strict and not config_file:
        raise click.UsageError("--strict applies to --config FILE; give both or neither")
    _check_outputs(json_dest, plot_dir)

    from dynres.runtime.sim.plan import plan_simulations

    source = preset or scenario
    assert source is not None
    plan = plan_simulations(
        source,
        is_preset=bool(preset),
        policy=policy,
        compare_policies=compare_policies,
        compare=compare,
        sets=sets,
        run_sets=run_sets,
        config_file=config_file,
        strict=strict,
        seed=seed,
        seeds=n_seeds,
        on_ignored=lambda line: click.echo(line, err=True),
        host=host,
    )
    out = _tracking_folder(plan, out_dir, Path(source).stem)
    comparison = _simulate_with_progress(plan, quiet=quiet, json_dest=json_dest, tracking_dir=out)
    _print_comparison(comparison, json_dest, plot_dir, explain=explain)
    if out is not None:
        human_console(json_dest).print(f"tracked runs ({_backend_names(plan)}) in {out}")


def _tracking_folder(plan: Any, out_dir: str | None, stem: str) -> Path | None:
    """The folder of the tracking backends' files, made now (None when no backend writes files)."""
    from dynres.runtime.cli.paths import check_output_dir
    from dynres.runtime.outdirs import OUT_ROOT, default_out_dir, ignore_in_git

    if not plan.writes_tracking_files:
        return None
    out = Path(out_dir) if out_dir else default_out_dir(stem)
    check_output_dir(out, "--out")
    if not out_dir:
        ignore_in_git(OUT_ROOT)
    return out


def _backend_names(plan: Any) -> str:
    """The file-writing backends of the plan's runs, each once, in order."""
    names = [b.name for run in plan.runs for b in run.tracking if b.writes_files]
    return ", ".join(dict.fromkeys(names))


def _explain_tables(comparison: Any) -> list[Any]:
    """One table per run: its gap to the bound split into causes (sim.gap), in the summary's unit."""
    from rich import box
    from rich.table import Table

    from dynres.runtime.sim.gap import explain_rows

    results = comparison.results
    unit, per, digits = time_unit(comparison.end_to_end_s + comparison.lower_bound_s)
    tables = []
    for i, r in enumerate(results, start=1):
        gap = r.end_to_end_s - r.lower_bound_s
        seed = f", seed {r.scenario.seed}" if comparison.over_seeds else ""
        title = f"#{i} where the time goes{seed}: gap {_fmt(gap / per, digits)} {unit}, {_fmt(r.ratio_to_bound)}x bound"
        table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", show_edge=False, padding=(0, 1, 0, 0))
        table.add_column("cause", no_wrap=True)
        table.add_column("what", overflow="fold")
        table.add_column(f"{unit}", justify="right", no_wrap=True)
        table.add_column("% gap", justify="right", no_wrap=True)
        for name, note, seconds, share in explain_rows(r):
            table.add_row(name, note, _fmt(seconds / per, digits), _fmt(share * 100, 1))
        tables.append(table)
    return tables


def _print_comparison(comparison: Any, json_dest: str | None, plot_dir: str | None, *, explain: bool = False) -> None:
    """The tables and summary lines, the gap causes (``--explain``), then the JSON (``--json``)
    and the plots (``--plot``)."""
    from dynres.runtime.sim.comparison import plot_comparison

    out = human_console(json_dest)
    times, util = _summary_tables(comparison)
    out.print(times)
    out.print()
    out.print(util)
    for line in _seed_lines(comparison) + _comparison_lines(comparison):
        out.print(line)
    for table in _explain_tables(comparison) if explain else ():
        out.print()
        out.print(table)
    if json_dest:
        emit_json(json_dest, comparison.to_dict())
        if json_dest != STDOUT:
            out.print(f"wrote {json_dest}")
    if plot_dir:
        paths = plot_comparison(comparison.results, plot_dir)
        out.print(f"wrote {len(paths)} plots to {plot_dir}")
