"""``dynres run CONFIG``: a whole real run (cluster, engines, policy, prompts) from one YAML file.

:func:`execute` starts everything, runs ``run.steps`` sync cycles through
:func:`dynres.runtime.loop.driver.run_fully_async`, streams one JSONL record per cycle, and tears
everything down, also on Ctrl-C (in-flight work aborted, engines shut down, Ray stopped).

The pieces: :mod:`.config` (the run file), :mod:`.launch` (the run file with its overrides,
policy, output folder and plots, checked before anything starts), :mod:`.builders` (engine builders,
factories, model, prompts), :mod:`.on_ray` (the Ray path and its coordinator actor),
:mod:`.output` (JSONL, report, plots, summary lines). This module re-exports what the CLI, tests
and benchmarks import.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynres.core.errors import RunAbortedError
from dynres.core.tracking import TrackedRun, TrackingBackend
from dynres.runtime.loop.spec import mq_size_cap
from dynres.runtime.realrun.builders import (
    CYCLE_MEAN_PREFIX,
    build_replica,
    build_spec,
    build_trainer,
    engine_factories,
    prepare_model,
    prompt_groups,
)
from dynres.runtime.realrun.config import (
    EnginesSection,
    ModelSection,
    RunConfig,
    RunSection,
    TaskSection,
    load_run_config,
    load_run_policy,
)
from dynres.runtime.realrun.launch import LaunchPlan, plan_launch
from dynres.runtime.realrun.output import (
    BACKEND_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    PLOTS_DIR,
    REPORT_FILE,
    MetricsSink,
    operations_lines,
    reward_key,
    run_summary,
    write_backend,
    write_config,
    write_report,
)
from dynres.runtime.realrun.resume import keep_metrics, lost_cycle_record
from dynres.runtime.realrun.status import ENGINES, MODEL, RAY, PhaseCallback, run_status
from dynres.runtime.tracking import TrackerSet, resolve_backends

logger = logging.getLogger("dynres.runtime.realrun")


@dataclass
class RunOutcome:
    """What :func:`execute` returns."""

    report: Any
    """The RunReport; after Ctrl-C, what the run had when it stopped (its ``stopped_early`` says
    so), or None when it was interrupted before the run itself started."""
    out_dir: Path
    """Directory holding metrics.jsonl, report.json, backend.json and plots/."""
    backend: dict[str, Any] = field(default_factory=dict)
    """What backend.json holds: engines, placement, start-up time (seconds), loop lags (ms), lost replicas."""
    interrupted: bool = False
    """True when Ctrl-C stopped the run."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C ended a run of :func:`execute`: the KeyboardInterrupt, carrying what was written."""

    def __init__(self, outcome: RunOutcome) -> None:
        """Wrap the run's ``outcome`` (its ``report`` is the interrupted run's, or None)."""
        super().__init__()
        self.outcome = outcome


async def _run_local(
    cfg: RunConfig,
    model_path: str | None,
    sink: MetricsSink,
    backend: dict[str, Any],
    on_interrupt: Callable[[Any], None],
    watch: _Watch,
    spec_kwargs: Mapping[str, Any],
) -> Any:
    """Build every engine in this process and run the loop here (``engines.runtime: local``).

    A gone replica is recreated by its factory (after the old one's shutdown). On cancellation
    (Ctrl-C) hands the run's interrupted report to ``on_interrupt`` before re-raising.
    """
    from dynres.runtime.loop.driver import FullyAsyncRun

    s_f, h_f, t_f = engine_factories(cfg, model_path)
    dyn = cfg.dynres_config()
    t0 = time.perf_counter()
    builds = [
        *((s_f, f"standalone-{i}", "standalone") for i in range(dyn.num_standalone_replicas)),
        *((h_f, f"hybrid-{i}", "hybrid") for i in range(dyn.num_hybrid_replicas)),
    ]
    watch.phase(ENGINES, 0, len(builds) + 1)
    engines = []
    for n, (factory, rid, kind) in enumerate(builds, start=1):
        engines.append(await factory.build(replica_id=rid, kind=kind))
        watch.phase(ENGINES, n, len(builds) + 1)
    trainer = await t_f.build()
    watch.phase(ENGINES, len(builds) + 1, len(builds) + 1)
    standalone, hybrid = engines[: dyn.num_standalone_replicas], engines[dyn.num_standalone_replicas :]
    backend["engines_start_s"] = time.perf_counter() - t0
    engines.append(trainer)

    async def restart(old: Any) -> Any:
        try:
            await asyncio.wait_for(old.shutdown(), cfg.ray.shutdown_timeout_s)
        except Exception as exc:  # it is gone: what it held goes with it
            logger.warning("shutdown of the gone replica %r failed: %s", old, exc)
        new = await (s_f if old.kind.value == "standalone" else h_f).build(
            replica_id=old.replica_id, kind=old.kind.value
        )
        engines.append(new)
        return new

    try:
        spec = build_spec(
            standalone=standalone,
            hybrid=hybrid,
            train_engine=trainer,
            progress=sink,
            config=cfg.model_dump(),
            restart=restart,
            **spec_kwargs,
        )
        run = FullyAsyncRun(spec)
        poller = asyncio.ensure_future(watch.poll(run))
        try:
            return await run.run()
        except asyncio.CancelledError:
            on_interrupt(run.interrupted_report)
            raise
        finally:
            poller.cancel()
            if spec.ledger is not None:
                spec.ledger.close()
    finally:
        for engine in engines:
            try:
                await asyncio.wait_for(engine.shutdown(), cfg.ray.shutdown_timeout_s)
            except Exception as exc:
                logger.warning("shutdown of %r failed: %s", engine, exc)


@dataclass
class _Watch:
    """The display's callbacks of one run: start-up phases, and the run's status every ``poll_s`` seconds."""

    on_phase: PhaseCallback | None
    on_status: Callable[[dict[str, Any]], None] | None
    poll_s: float

    def phase(self, phase: str, done: int = 0, total: int = 0) -> None:
        """Tell the display a start-up phase began or moved on."""
        if self.on_phase is not None:
            self.on_phase(phase, done, total)

    async def poll(self, run: Any) -> None:
        """Pass :func:`~dynres.runtime.realrun.status.run_status` of ``run`` on until cancelled."""
        if self.on_status is None:
            return
        while True:
            self.on_status(run_status(run))
            await asyncio.sleep(self.poll_s)


def execute(
    cfg: RunConfig,
    out_dir: str | Path,
    *,
    on_cycle: Callable[[Any, dict[str, Any]], None] | None = None,
    on_status: Callable[[dict[str, Any]], None] | None = None,
    poll_s: float = 0.5,
    plots: bool = True,
    plot_dir: str | Path | None = None,
    tracking: Sequence[TrackingBackend] | None = None,
    on_tracking_problem: Callable[[str], Any] | None = None,
    on_phase: PhaseCallback | None = None,
    resume: Mapping[str, Any] | None = None,
) -> RunOutcome:
    """Run ``cfg`` to the end (or Ctrl-C); write metrics.jsonl, ledger.jsonl, checkpoints/,
    report.json, backend.json, plots.

    ``resume``: a checkpoint of ``out_dir`` (:func:`~dynres.runtime.realrun.resume.resume_point`)
    to go on from, up to ``run.steps``; the cycles and samples done after it are dropped from
    metrics.jsonl and ledger.jsonl (they are done again) and the run's are appended.

    Plots go to ``plot_dir`` (default: ``out_dir/plots``) unless ``plots`` is False. Each cycle
    also goes to the ``tracking`` backends (default: those ``trainer.logger`` names), opened
    before anything starts and finished when the run ends, however it ends; a backend that
    fails mid-run is stopped and named through ``on_tracking_problem`` (default: a log warning).
    ``on_phase(phase, done, total)`` hears the start-up phases (:mod:`.status`) and ``on_status``
    the run's live status every ``poll_s`` seconds.
    Raises :class:`RunInterrupted` (a KeyboardInterrupt) after a clean teardown when interrupted,
    with report.json holding what the run had (no plots); DynresError on a bad config or a
    failing backend.
    """
    load_run_policy(cfg)  # a bad policy name or params fails here, before anything starts
    backends = resolve_backends(cfg.trainer.logger) if tracking is None else tuple(tracking)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, cfg)
    trackers = TrackerSet(backends, tracked_run(cfg, out), warn=on_tracking_problem)
    try:
        watch = _Watch(on_phase, on_status, poll_s)
        return _execute(cfg, out, trackers, on_cycle, watch, plots, plot_dir, resume)
    finally:
        trackers.finish(trackers.summary)


def tracked_run(cfg: RunConfig, out: Path) -> TrackedRun:
    """The run as tracking backends see it: ``trainer.experiment_name`` or the output folder's name."""
    return TrackedRun(
        name=cfg.trainer.experiment_name or out.resolve().name,
        project=cfg.trainer.project_name,
        out_dir=out,
        config=cfg.model_dump(mode="json"),
        total_steps=cfg.run.steps,
        kind="run",
    )


def _execute(
    cfg: RunConfig,
    out: Path,
    trackers: TrackerSet,
    on_cycle: Callable[[Any, dict[str, Any]], None] | None,
    watch: _Watch,
    plots: bool,
    plot_dir: str | Path | None,
    resume: Mapping[str, Any] | None = None,
) -> RunOutcome:
    """:func:`execute` once the output folder and the trackers are open."""
    watch.phase(MODEL)
    model_path = prepare_model(cfg, out)
    backend: dict[str, Any] = {
        "runtime": cfg.engines.runtime,
        "rollout": cfg.engines.rollout,
        "trainer": cfg.engines.trainer,
        "model_path": model_path,
    }
    if resume is not None:
        dropped = keep_metrics(out / METRICS_FILE, int(resume["global_steps"]))
        backend["resume"] = {"checkpoint": resume.get("path"), "cycle": resume["global_steps"], "redone": dropped}
    sink = MetricsSink(out / METRICS_FILE, on_cycle, trackers, append=resume is not None)
    if resume is not None:
        lost = lost_cycle_record(out / METRICS_FILE, dict(resume))
        if lost is not None:
            sink.write_record(lost)
        backend["resume"]["recovered_record"] = lost is not None
    spec_kwargs = {"out_dir": str(out.resolve()), "resume": resume}
    outcome = RunOutcome(None, out, backend)
    t0 = time.perf_counter()

    def on_interrupt(report: Any) -> None:
        outcome.report = report

    try:
        report = _run_engines(cfg, out, model_path, sink, backend, on_interrupt, watch, spec_kwargs)
        outcome.report = report
        trackers.summary = run_summary(report)
    except KeyboardInterrupt as exc:
        outcome.interrupted = True
        if outcome.report is not None:
            write_report(out, outcome.report, plot_dir=None)
        raise RunInterrupted(outcome) from exc
    except RunAbortedError as exc:
        # The report holds the cycles done and a checkpoint that loses no sample: keep it.
        if exc.report is not None:
            write_report(out, exc.report, plot_dir=None)
            exc.args = (f"{exc}; report and checkpoint written to {out / REPORT_FILE}",)
        raise
    finally:
        backend["wall_s"] = round(time.perf_counter() - t0, 3)
        backend["interrupted"] = outcome.interrupted
        sink.close()
        write_backend(out, backend)
    dcfg = cfg.dynres_config()
    write_report(
        out,
        outcome.report,
        plot_dir=(Path(plot_dir) if plot_dir else out / PLOTS_DIR) if plots else None,
        mq_size_cap=mq_size_cap(dcfg),
        hybrid_replicas=dcfg.num_hybrid_replicas,
    )
    return outcome


def _run_engines(
    cfg: RunConfig,
    out: Path,
    model_path: str | None,
    sink: MetricsSink,
    backend: dict[str, Any],
    on_interrupt: Callable[[Any], None],
    watch: _Watch,
    spec_kwargs: dict[str, Any],
) -> Any:
    """Run the cycles on the configured runtime (in this process or on Ray) and return the report."""
    if cfg.engines.runtime == "local":
        return asyncio.run(_run_local(cfg, model_path, sink, backend, on_interrupt, watch, spec_kwargs))
    from dynres.runtime.backends.ray.cluster import RayCluster
    from dynres.runtime.realrun.on_ray import run_on_ray

    watch.phase(RAY)
    cluster_conn = RayCluster(cfg.ray)
    cluster_conn.connect()  # blocking by nature: done before the event loop starts
    try:
        return asyncio.run(
            run_on_ray(
                cfg,
                model_path,
                sink,
                backend,
                watch.on_status,
                watch.poll_s,
                on_interrupt,
                watch.on_phase,
                spec_kwargs=spec_kwargs,
                on_engines=lambda b: write_backend(out, b),
            )
        )
    finally:
        cluster_conn.disconnect()


__all__ = [
    "BACKEND_FILE",
    "CONFIG_FILE",
    "CYCLE_MEAN_PREFIX",
    "METRICS_FILE",
    "REPORT_FILE",
    "EnginesSection",
    "LaunchPlan",
    "ModelSection",
    "RunConfig",
    "RunInterrupted",
    "RunOutcome",
    "RunSection",
    "TaskSection",
    "build_replica",
    "build_spec",
    "build_trainer",
    "execute",
    "load_run_config",
    "load_run_policy",
    "operations_lines",
    "plan_launch",
    "prepare_model",
    "prompt_groups",
    "reward_key",
    "run_summary",
    "tracked_run",
]
