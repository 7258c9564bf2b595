"""``dynres scenario``: a scenario fitted from a run's own metrics, and predictions per policy.

``dynres scenario fit METRICS`` writes the commented scenario; ``dynres scenario compare METRICS
--policy A --policy B`` fits it, simulates the run as it was and with each policy, and prints the
predicted end-to-end times with the as-it-was prediction's error against the measured run.
METRICS is ``dynres run``'s ``metrics.jsonl`` (or its ``--out`` directory) or the JSONL verl's
file logger writes. See docs/fitting.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dynres.runtime.cli.output import STDOUT, complete_policies, emit_json, human_console, json_option, seeds_option

_config_option = click.option(
    "--config",
    "config_file",
    metavar="FILE",
    help="The run's dynres or verl config (batch, staleness, cluster split); default: config.json "
    "next to a dynres metrics.jsonl. Needed for verl metrics, which do not log the config.",
)
_costs_option = click.option(
    "--costs-from",
    "costs_from",
    metavar="RUN",
    help="Another dynres run (its --out directory or report.json) on the same engines: switch costs "
    "(sleep, wake_up, abort, offload, onload) METRICS lacks come from its engine timings.",
)
_set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a key of the fitted scenario (dotted, value is YAML), e.g. costs.sleep_s=0.5 for a "
    "cost the metrics lack. Repeatable.",
)


def _fit(
    metrics: str, config_file: str | None, sets: tuple[str, ...], costs_from: str | None
) -> tuple[Any, dict[str, Any]]:
    """Read, fit and validate (with the overrides) before anything else runs."""
    from dynres.core.config import parse_set_items
    from dynres.runtime.sim.fit import config_from_file, fit_scenario
    from dynres.runtime.sim.metrics_io import read_metrics, read_report

    overrides = parse_set_items(sets)
    config, source = config_from_file(config_file) if config_file else (None, "")
    other, other_src = read_report(costs_from, what="--costs-from") if costs_from else (None, "")
    run = read_metrics(metrics, what="METRICS")
    fit = fit_scenario(run, config=config, config_source=source, costs_from=other, costs_source=other_src)
    fit.load(overrides)  # a bad --set fails here, named
    if overrides:
        from dynres.core.config import apply_overrides

        fit.scenario = apply_overrides(fit.scenario, overrides)
        for key, value in overrides.items():
            fit.notes[key] = f"--set {key}={value}"
            fit.missing = [m for m in fit.missing if f"-> {key} =" not in m]
    return fit, overrides


@click.group(name="scenario", short_help="Fit a scenario to a run's metrics; predict other policies.")
def command() -> None:
    """Scenarios fitted from a run's own per-cycle metrics (dynres run or verl fully-async)."""


@command.command(name="fit", short_help="Fit a commented scenario YAML to a run's metrics.")
@click.argument("metrics", metavar="METRICS")
@click.option("--out", "out", metavar="FILE", help="Write the scenario YAML to FILE (default: stdout).")
@_config_option
@_costs_option
@_set_option
@json_option("the fitted scenario, the provenance of each key and the missing metrics")
def fit_command(
    metrics: str,
    out: str | None,
    config_file: str | None,
    costs_from: str | None,
    sets: tuple[str, ...],
    json_dest: str | None,
) -> None:
    """Fit a scenario to METRICS: dynres run's metrics.jsonl (or its --out directory) or verl's file-logger JSONL.

    Every key carries a comment saying where its number came from ([M] measured, [D] derived,
    [E] assumed) and how well it is determined; metrics the run lacks are listed with the default
    used. Simulate the result with `dynres simulate FILE`. Example:

        dynres scenario fit runs/tiny/metrics.jsonl --out tiny-fitted.yaml
    """
    from dynres.runtime.cli.paths import check_output_file

    if out:
        check_output_file(Path(out), "--out")
    if json_dest not in (None, STDOUT):
        check_output_file(Path(json_dest), "--json")
    fit, _ = _fit(metrics, config_file, sets, costs_from)

    text = fit.to_yaml()
    console = human_console(json_dest)
    if out:
        try:
            Path(out).write_text(text, encoding="utf-8")
        except OSError as exc:
            from dynres.core.errors import ConfigError

            raise ConfigError(f"--out {out}: cannot write the file ({exc.strerror}); choose a writable path") from None
        console.print(f"wrote {out} ({fit.cycles} cycles fitted, {len(fit.missing)} metric(s) missing)")
    elif json_dest != STDOUT:
        click.echo(text, nl=False)
    if json_dest:
        emit_json(
            json_dest,
            {
                "metrics": str(fit.source),
                "format": fit.format,
                "cycles": fit.cycles,
                "measured_end_to_end_s": fit.measured_end_to_end_s,
                "first_cycle_start_s": fit.first_cycle_start_s,
                "measured_policy": fit.measured_policy,
                "scenario": fit.scenario,
                "notes": fit.notes,
                "missing": fit.missing,
            },
        )


@command.command(name="compare", short_help="Predict a run's end-to-end time under other policies.")
@click.argument("metrics", metavar="METRICS")
@click.option(
    "--policy",
    "policies",
    multiple=True,
    metavar="NAME_OR_PATH",
    shell_complete=complete_policies,
    help="A policy to predict the run with (name, module:Class or file.py:Class). Repeatable.",
)
@_config_option
@_costs_option
@_set_option
@seeds_option("Simulate each policy with N workload seeds and report the mean (the spread shows in --json).")
@json_option("the predictions and the as-it-was error")
def compare_command(
    metrics: str,
    policies: tuple[str, ...],
    config_file: str | None,
    costs_from: str | None,
    sets: tuple[str, ...],
    n_seeds: int,
    json_dest: str | None,
) -> None:
    """Fit METRICS, then simulate the run as it was (its own policy) and with each --policy.

    Prints the predicted end-to-end time per policy, how it compares with the as-it-was
    prediction, and the as-it-was prediction's error against the measured run. Example:

        dynres scenario compare runs/tiny --policy default --policy predictive
    """
    from dynres.runtime.cli.paths import check_output_file
    from dynres.runtime.sim.fit import check_policies, predict

    if json_dest not in (None, STDOUT):
        check_output_file(Path(json_dest), "--json")
    check_policies(policies)
    fit, overrides = _fit(metrics, config_file, sets, costs_from)
    cmp = predict(fit, policies, seeds=n_seeds, overrides=overrides)
    _print_comparison(cmp, human_console(json_dest))
    if json_dest:
        emit_json(json_dest, cmp.to_dict())


def _print_comparison(cmp: Any, console: Any) -> None:
    from rich import box
    from rich.table import Table

    fit = cmp.fit
    table = Table(
        title=f"predicted end-to-end, fitted from {fit.source} ({fit.format}, {fit.cycles} cycles)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
        show_edge=False,
    )
    table.add_column("policy")
    for h in ("predicted (s)", "vs as-it-was", "measured (s)", "error", "switches"):
        table.add_column(h, justify="right")
    base = cmp.as_it_was.mean_s
    for p in cmp.predictions:
        label = f"{p.policy} (as it was)" if p.as_it_was else p.policy
        d = (p.mean_s - base) / base if base > 0 else 0.0
        table.add_row(
            label,
            f"{p.mean_s:.2f}",
            "-" if p.as_it_was else f"{d * 100:+.1f}%",
            f"{fit.measured_end_to_end_s:.2f}" if p.as_it_was else "",
            f"{cmp.error * 100:+.1f}%" if p.as_it_was else "",
            str(p.switches),
        )
    console.print(table)
    console.print(
        f"as-it-was prediction {cmp.as_it_was.mean_s:.2f} s vs measured {fit.measured_end_to_end_s:.2f} s: "
        f"error {cmp.error * 100:+.1f}%; start-up the simulator does not model: {cmp.warmup_s:+.2f} s "
        "(in every prediction)"
    )
    if fit.missing:
        console.print(f"{len(fit.missing)} metric(s) missing, defaults used (see `dynres scenario fit`):")
        for m in fit.missing:
            console.print(f"  - {m}")


@command.command(name="sample", short_help="Write scenarios drawn from the simulator's workload space.")
@click.option("--seed", type=int, required=True, help="Seed of the draw: the same seed writes the same files.")
@click.option("--count", type=int, required=True, help="Scenarios to write (count, >= 1).")
@click.option("--out", "out", required=True, metavar="DIR", help="Folder to write sample-<seed>-<i>.yaml into.")
@click.option(
    "--steps",
    type=int,
    default=None,
    help="Sync cycles of each scenario (count, >= 1; default 20). The workloads stay those of the seed.",
)
def sample_command(seed: int, count: int, out: str, steps: int | None) -> None:
    """Write COUNT scenario files drawn with SEED into DIR (docs/simulator.md: the distribution).

    Each is physically coherent: model size, GPUs, tensor parallelism, decode and train speed, and
    switch and sync costs all follow from one draw of a model and a cluster, which the file's
    header names. Example:

        dynres scenario sample --seed 100 --count 60 --out draws/report
    """
    from dynres.runtime.cli.paths import check_output_dir
    from dynres.runtime.sim.sampling import STEPS, sample_scenarios, write_samples

    cycles = STEPS if steps is None else steps
    list(sample_scenarios(seed, 1, cycles))  # a bad --seed, --count or --steps fails before the folder is made
    if count < 1:
        raise click.BadParameter("must be >= 1", param_hint="--count")
    check_output_dir(Path(out), "--out")
    paths = write_samples(seed, count, Path(out), cycles)
    click.echo(f"wrote {len(paths)} scenarios to {out} ({paths[0].name} .. {paths[-1].name})")
