"""``dynres run CONFIG``: start a real fully-async run from one YAML file and follow it.

Progress goes to stderr: on a terminal (and not with ``-q`` or ``--json -``) the start-up phases,
then a bar over cycles; the ``console`` tracking backend (``trainer.logger``, on by default)
prints one line per cycle. The summary goes to stdout (to stderr when ``--json -`` puts the
RunReport on stdout). Files land in ``--out`` (default: a fresh ``dynres-runs/<config name>``):
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

from dynres.runtime.cli.output import STDOUT, emit_json, json_option, quiet_option, show_progress

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
@click.option(
    "--resume",
    "resume",
    metavar="DIR",
    type=click.Path(file_okay=False),
    default=None,
    help="Go on from the latest checkpoint in run folder DIR up to run.steps, writing into DIR.",
)
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
    resume: str | None,
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
        resume=resume,
    )
    if plot_dir is not None and no_plot:  # after the run file's own errors, which are reported first
        raise click.UsageError("give --plot DIR or --no-plot, not both")
    _check_outputs(plan.out_dir, plot_dir, json_dest)
    if plan.default_out:
        from dynres.runtime.outdirs import OUT_ROOT, ignore_in_git

        ignore_in_git(OUT_ROOT)
    err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)
    for note in plan.notes:
        err.print(note)
    err.print(_header(plan))
    outcome = _execute_with_progress(plan, err, show=show_progress(quiet, json_dest))
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


PHASE_TEXT = {
    "ray": "starting Ray",
    "model": "preparing the model",
    "engines": "starting engines",
    "calibration": "switch calibration",
}
"""What the start-up line says in each phase (keys: dynres.runtime.realrun.status phases)."""
HYBRID_TEXT = {"STANDALONE_ONLY": "off", "HYBRID_ACTIVE": "on"}
"""How the bar names the controller's state (the transitional states by their own name)."""


class _RunDisplay:
    """On a terminal: the start-up phases, then a bar over cycles with its ETA, the latest reward,
    the queue size and the hybrid state. Nothing at all without a terminal, with -q or --json -."""

    def __init__(self, err: Any, total: int, *, enabled: bool) -> None:
        """Draw on console ``err`` when ``enabled``; the bar counts ``total`` cycles."""
        self.total = total
        self.reward = ""
        self.phase = ""
        self.progress = _progress(err) if enabled else None
        self.startup: Any = None
        self.cycles: Any = None

    def on_phase(self, phase: str, done: int, total: int) -> None:
        """Show start-up ``phase`` (``done`` of ``total`` for the engines): one line per phase, the last shown."""
        if self.progress is None or self.cycles is not None:
            return
        if phase != self.phase:
            if self.startup is not None:
                self.progress.update(self.startup, visible=False)
            self.startup = self.progress.add_task(PHASE_TEXT.get(phase, phase), total=total or None, status="")
            self.phase = phase
        self.progress.update(self.startup, completed=done, total=total or None)

    def on_status(self, status: dict[str, Any]) -> None:
        """The run's live status: the calibration phase, then the cycle bar's state, queue and reward."""
        if self.progress is None:
            return
        if status.get("phase") == "calibration":
            self.on_phase("calibration", 0, 0)
            return
        self._cycles_started()
        state = str(status.get("state", "?"))
        hybrid = HYBRID_TEXT.get(state, state.lower())
        self.progress.update(self.cycles, status=f"{self.reward}queue {status.get('queue', 0)}  hybrid {hybrid}")

    def on_cycle(self, cycle: Any, rec: dict[str, Any]) -> None:
        """Move the bar to finished ``cycle`` and keep its reward (its line comes from the console backend)."""
        if self.progress is None:
            return
        from dynres.core.metrics import reward_key

        self._cycles_started()
        rk = reward_key(rec)
        self.reward = f"reward {rec[rk]:.3f}  " if rk else ""
        self.progress.update(self.cycles, completed=cycle.step)

    def _cycles_started(self) -> None:
        """Swap the start-up line for the cycle bar (once)."""
        assert self.progress is not None
        if self.cycles is None:
            if self.startup is not None:
                self.progress.update(self.startup, visible=False)
            self.cycles = self.progress.add_task("cycles", total=self.total, status="")


def _execute_with_progress(plan: Any, err: Any, *, show: bool) -> Any:
    """Run ``plan`` showing its start-up and cycles; after Ctrl-C say what was kept and exit with status 130."""
    from dynres.runtime.realrun import execute

    display = _RunDisplay(err, plan.config.run.steps, enabled=show)
    out = plan.out_dir
    try:
        with display.progress if display.progress is not None else contextlib.nullcontext():
            return execute(
                plan.config,
                out,
                on_cycle=display.on_cycle,
                on_status=display.on_status,
                on_phase=display.on_phase,
                plots=plan.plots,
                plot_dir=plan.plot_dir,
                tracking=plan.tracking,
                on_tracking_problem=lambda line: err.print(f"warning: {line}", markup=False),
                resume=plan.resume,
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
    from dynres.runtime.cli.output import decision_warnings

    for warning in decision_warnings(report, f"run {out.name}"):
        echo(warning)
    from dynres.runtime.realrun.output import restarts_line
    from dynres.runtime.realrun.resume import ledger_summary

    for said in (restarts_line(report), ledger_summary(out)):
        if said:
            echo(said)
    if report.quarantined:
        for rid, why in report.quarantined.items():
            echo(f"replica {rid} was taken out of the run: {why}")
    echo(f"metrics: {out / 'metrics.jsonl'}; report: {out / 'report.json'}")


def _progress(console: Any) -> Any:
    """The rich progress display of a run: a spinner line per start-up phase, then the cycle bar with its ETA."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        _count_and_eta_column(),
        TextColumn("{task.fields[status]}"),
        console=console,
        transient=True,
    )


def _count_and_eta_column() -> Any:
    """``n/m`` for a counted task, plus ``ETA h:mm:ss`` on the cycle bar once rich can estimate it."""
    import datetime

    from rich.progress import ProgressColumn
    from rich.text import Text

    class CountAndEta(ProgressColumn):
        def render(self, task: Any) -> Text:
            if task.total is None:
                return Text("")
            text = f"{int(task.completed)}/{int(task.total)}"
            left = task.time_remaining
            if task.description == "cycles" and left is not None:
                text += f"  ETA {datetime.timedelta(seconds=round(left))}"
            return Text(text, style="progress.remaining")

    return CountAndEta()
