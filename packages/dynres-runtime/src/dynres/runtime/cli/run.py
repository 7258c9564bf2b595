"""``dynres run CONFIG``: start a real fully-async run from one YAML file and follow it.

Progress goes to stderr (a rich progress bar on a terminal, one line per cycle always); the
summary goes to stdout (to stderr when ``--json -`` puts the RunReport on stdout). Files land in ``--out``:
``metrics.jsonl`` (one record per cycle, written as cycles finish), ``report.json``,
``backend.json`` and ``plots/``. Ctrl-C stops cleanly (in-flight requests aborted, engines shut
down, Ray stopped), also during the switch calibration, writes report.json with what the run had
(``stopped_early`` says where it stopped), says so in one line and exits with status 130; a bad
config or a backend failure prints one line and exits with status 2.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Any

import click

from dynres.runtime.cli.output import STDOUT, emit_json, json_option, quiet_option

EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it."""


@click.command(name="run", short_help="Run real fully-async training from one YAML file and report.")
@click.argument("config")
@click.option(
    "--out",
    "out_dir",
    default=None,
    help="Output directory (default: dynres-runs/<config name>).",
)
@click.option("--steps", type=int, default=None, help="Override run.steps (sync cycles).")
@click.option("--policy", default=None, help="Override async_training.dynamic_schedule_policy.")
@click.option("--address", default=None, help="Override ray.address (join an existing Ray cluster).")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override any key, dotted (repeatable), e.g. --set engines.runtime=local.",
)
@click.option(
    "--strict", is_flag=True, help="Reject verl keys dynres does not model (default: ignore them, named in one line)."
)
@json_option("the RunReport")
@quiet_option()
@click.option(
    "--plot",
    "plot_dir",
    metavar="DIR",
    type=click.Path(file_okay=False),
    default=None,
    help="Write PNG plots to DIR (default: OUT/plots; needs the [plot] extra).",
)
@click.option("--no-plot", is_flag=True, help="Do not write plots.")
@click.option("-v", "--verbose", count=True, help="More log output (-v: info, -vv: debug).")
def command(
    config: str,
    out_dir: str | None,
    steps: int | None,
    policy: str | None,
    address: str | None,
    sets: tuple[str, ...],
    strict: bool,
    json_dest: str | None,
    quiet: bool,
    plot_dir: str | None,
    no_plot: bool,
    verbose: int,
) -> None:
    """Run fully-async training from CONFIG (engines, cluster, model, policy, steps) and report.

    --steps, --policy and --address are shorthands for --set run.steps=, --set
    async_training.dynamic_schedule_policy= and --set ray.address=; giving a shorthand and
    --set for the same key is an error. Every input (config, policy, engine options, --out) is
    checked before anything starts.
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from rich.console import Console

    from dynres.runtime.realrun import plan_launch

    plan = plan_launch(
        config,
        sets=sets,
        steps=steps,
        policy=policy,
        address=address,
        strict=strict,
        out_dir=out_dir,
        plots=not no_plot,
        plot_dir=plot_dir,
        on_ignored=lambda line: click.echo(line, err=True),
    )
    if plot_dir is not None and no_plot:  # after the run file's own errors, which are reported first
        raise click.UsageError("give --plot DIR or --no-plot, not both")
    _check_outputs(plan.out_dir, plot_dir, json_dest)
    err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)
    for note in plan.notes:
        err.print(note)
    err.print(_header(plan))
    outcome = _execute_with_progress(plan, err, quiet=quiet)
    if json_dest:
        emit_json(json_dest, outcome.report.to_dict(), allow_nan=True)
        if json_dest == STDOUT:
            _summary(outcome.report, outcome, plan.out_dir, to_stderr=True)
            return
    _summary(outcome.report, outcome, plan.out_dir, to_stderr=False)


def _check_outputs(out: Path, plot_dir: str | None, json_dest: str | None) -> None:
    """Make the output folder (and the plot folder) now; fail before the run when one cannot be written."""
    from dynres.runtime.cli.paths import check_output_dir, check_output_file

    check_output_dir(out, "--out")
    if plot_dir is not None:
        check_output_dir(Path(plot_dir), "--plot")
    if json_dest not in (None, STDOUT):
        check_output_file(Path(json_dest), "--json")


def _header(plan: Any) -> str:
    """The line that says what is about to run and where its output goes."""
    cfg = plan.config
    return (
        f"dynres run: {cfg.run.steps} cycles, policy {cfg.async_training.dynamic_schedule_policy} "
        f"(dynamic scheduling {'on' if cfg.async_training.use_dynamic_resource_scheduling else 'off'}), "
        f"{cfg.num_standalone_replicas} standalone + {cfg.num_hybrid_replicas} hybrid {cfg.engines.rollout} "
        f"replicas, {cfg.engines.trainer} trainer, runtime {cfg.engines.runtime}; output in {plan.out_dir}"
    )


class _CycleLines:
    """One line per finished cycle on stderr, above a progress bar over cycles when there is one."""

    def __init__(self, err: Any, total: int, *, quiet: bool) -> None:
        """Lines go to console ``err``; the bar (not when ``quiet`` or off a terminal) counts ``total`` cycles."""
        self.err = err
        self.total = total
        self.progress, self.task = _progress(err, total, disabled=quiet)

    def on_cycle(self, cycle: Any, rec: dict[str, Any]) -> None:
        """Move the bar to finished ``cycle`` (its line comes from the ``console`` tracking backend)."""
        if self.progress is not None:
            self.progress.update(self.task, completed=cycle.step)

    def on_status(self, status: dict[str, Any]) -> None:
        """Show the run's live state, queue size and in-flight requests next to the bar."""
        if self.progress is not None:
            self.progress.update(
                self.task,
                status=f"{status.get('state', '?')} queue {status.get('queue', 0)} "
                f"in-flight {status.get('in_flight', 0)}",
            )


def _execute_with_progress(plan: Any, err: Any, *, quiet: bool) -> Any:
    """Run ``plan`` showing its cycles; after Ctrl-C say what was kept and exit with status 130."""
    from dynres.runtime.realrun import execute

    lines = _CycleLines(err, plan.config.run.steps, quiet=quiet)
    out = plan.out_dir
    try:
        with lines.progress if lines.progress is not None else contextlib.nullcontext():
            return execute(
                plan.config,
                out,
                on_cycle=lines.on_cycle,
                on_status=lines.on_status,
                plots=plan.plots,
                plot_dir=plan.plot_dir,
                tracking=plan.tracking,
                on_tracking_problem=lambda line: err.print(f"warning: {line}"),
            )
    except KeyboardInterrupt as exc:
        stopped = getattr(getattr(exc, "outcome", None), "report", None)
        kept = (
            f"report (what the run had) in {out / 'report.json'}, "
            if stopped is not None
            else "no report (the run had not started), "
        )
        what = stopped.stopped_early if stopped is not None and stopped.stopped_early else "interrupted"
        err.print(
            f"dynres: {what}; in-flight work aborted, engines shut down, Ray stopped; "
            f"{kept}finished cycles in {out / 'metrics.jsonl'}"
        )
        sys.exit(EXIT_INTERRUPTED)


def _summary(report: Any, outcome: Any, out: Path, *, to_stderr: bool) -> None:
    """The human-readable end of a run: time, sample counts, operations, where the files are."""
    from dynres.runtime.realrun import operations_lines

    def echo(line: str) -> None:
        click.echo(line, err=to_stderr)

    s = report.samples
    echo(f"finished {len(report.cycles)} cycles in {report.end_to_end_s:.1f} s (policy {report.policy})")
    echo(
        f"samples: generated {s.generated}, consumed {s.consumed}, dropped stale {s.dropped_stale}, "
        f"queued at end {s.queued_at_end}, partial at end {s.partial_at_end}, failed {s.failed}, "
        f"duplicates {s.duplicates}; requests aborted {s.aborted}, resumed {s.resumed}"
    )
    for line in operations_lines(report):
        echo(line)
    lags = outcome.backend.get("loop_lag")
    if lags:
        echo("event-loop max gap (ms): " + ", ".join(f"{k} {v:g}" for k, v in lags.items()))
    if report.quarantined:
        for rid, why in report.quarantined.items():
            echo(f"replica {rid} was taken out of the run: {why}")
    echo(f"metrics: {out / 'metrics.jsonl'}; report: {out / 'report.json'}")


def _progress(console: Any, total: int, *, disabled: bool) -> tuple[Any, Any]:
    """A rich progress bar over cycles, or (None, None) when disabled or not on a terminal."""
    if disabled or not console.is_terminal:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]cycles"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        transient=True,
    )
    task = progress.add_task("run", total=total, status="starting")
    return progress, task
