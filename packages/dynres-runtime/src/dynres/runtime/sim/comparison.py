"""Simulating a :class:`~dynres.runtime.sim.plan.SimPlan` and comparing its runs with the first.

:func:`simulate_plan` runs each planned run in table order and reports its progress to a
:class:`PlanObserver` (a progress display; :class:`TrackingObserver` for the tracking backends of
``trainer.logger``); nothing here prints. What it
returns, a :class:`Comparison`, holds the results, each run's difference from run 1, the spread
over seeds and the ``--json`` payload; :func:`plot_comparison` writes the plots of its runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynres.core.tracking import TrackedRun
from dynres.runtime.loop.report import CycleReport
from dynres.runtime.sim.plan import PlannedRun, SimPlan
from dynres.runtime.sim.runner import SimResult, relative_difference, simulate
from dynres.runtime.tracking import TrackerSet


class PlanObserver:
    """Hears about the runs of a plan as they are simulated; each method does nothing unless overridden."""

    def run_started(self, run: PlannedRun) -> None:
        """``run`` is about to be simulated."""

    def cycle_done(self, run: PlannedRun, cycle: CycleReport) -> None:
        """``run`` finished one sync cycle (``cycle.end_s``: simulated seconds so far)."""

    def run_done(self, run: PlannedRun, result: SimResult) -> None:
        """``run`` ended with ``result``."""


class ObserverGroup(PlanObserver):
    """Several observers heard as one, in the order given."""

    def __init__(self, *observers: PlanObserver) -> None:
        """Pass every event to each of ``observers``."""
        self.observers = observers

    def run_started(self, run: PlannedRun) -> None:
        """Tell each observer."""
        for o in self.observers:
            o.run_started(run)

    def cycle_done(self, run: PlannedRun, cycle: CycleReport) -> None:
        """Tell each observer."""
        for o in self.observers:
            o.cycle_done(run, cycle)

    def run_done(self, run: PlannedRun, result: SimResult) -> None:
        """Tell each observer."""
        for o in self.observers:
            o.run_done(run, result)


class TrackingObserver(PlanObserver):
    """Tracks each run of a plan with the backends its ``trainer.logger`` names: one tracked run per label.

    The tracked run's name is the run's ``scenario[policy]`` label (``#N`` first when a label
    repeats, ``trainer.experiment_name`` and a ``-`` first when set), so TensorBoard and the
    others show the plan's policies side by side; step is the cycle, values are simulated
    seconds. Only the first pass is tracked: the repeats of ``--seeds`` are summed up in the
    results, not tracked. Call :meth:`close` when the plan ends, also after an error.
    """

    def __init__(self, plan: SimPlan, out_dir: Path, *, warn: Callable[[str], Any] | None = None) -> None:
        """Track ``plan``'s runs under ``out_dir``; problems of a backend go to ``warn``."""
        self.out_dir = out_dir
        self.warn = warn
        self.names = dict(zip((r.number for r in plan.runs), unique_labels([r.label for r in plan.runs]), strict=True))
        self.open: TrackerSet | None = None

    def run_started(self, run: PlannedRun) -> None:
        """Open the run's trackers (none when its trainer.logger is empty)."""
        self.close()
        if not run.tracking:
            return
        sc = run.scenario
        name = self.names[run.number]
        if sc.trainer.experiment_name:
            name = f"{sc.trainer.experiment_name}-{name}"
        tracked = TrackedRun(
            name=name,
            project=sc.trainer.project_name,
            out_dir=self.out_dir,
            config=sc.model_dump(mode="json"),
            total_steps=sc.steps,
            kind="simulate",
        )
        self.open = TrackerSet(run.tracking, tracked, warn=self.warn)

    def cycle_done(self, run: PlannedRun, cycle: CycleReport) -> None:
        """Log the cycle to the run's trackers."""
        if self.open is not None:
            self.open.log_record(cycle.to_record())

    def run_done(self, run: PlannedRun, result: SimResult) -> None:
        """Finish the run's trackers with its end-to-end time and lower bound."""
        if self.open is not None:
            self.open.summary = sim_summary(result)
        self.close()

    def close(self) -> None:
        """Finish the trackers still open (a plan stopped by an error)."""
        if self.open is not None:
            self.open.finish(self.open.summary)
            self.open = None


def sim_summary(result: SimResult) -> dict[str, float]:
    """A simulated run's numbers for the tracking backends' summary (simulated seconds, ratio, count)."""
    s = result.summary()
    return {
        "end_to_end_s": float(result.end_to_end_s),
        "lower_bound_s": float(result.lower_bound_s),
        "ratio_to_bound": float(s["ratio_to_bound"]),
        "switches": float(s["switches"]),
    }


@dataclass
class Comparison:
    """The results of a plan's runs, and how each compares with run 1."""

    results: list[SimResult]
    """One result per planned run, in table order."""
    over_seeds: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per run label, its end-to-end time over consecutive seeds (empty with one seed per run):
    ``seeds``, ``end_to_end_s`` (one per seed), ``mean_s``, ``min_s``, ``max_s``, ``spread``
    ((max - min) / mean, fraction) and ``lower_bound_mean_s``."""

    @property
    def end_to_end_s(self) -> list[float]:
        """Each run's end-to-end time: the mean over its seeds when there are several, else its one run (seconds)."""
        return [self.over_seeds[r.label]["mean_s"] if self.over_seeds else r.end_to_end_s for r in self.results]

    @property
    def lower_bound_s(self) -> list[float]:
        """Each run's lower bound, averaged over its seeds like :attr:`end_to_end_s` (seconds)."""
        if not self.over_seeds:
            return [r.lower_bound_s for r in self.results]
        return [self.over_seeds[r.label]["lower_bound_mean_s"] for r in self.results]

    @property
    def vs_first(self) -> list[float]:
        """Each run's relative difference in :attr:`end_to_end_s` from run 1 (fraction; run 1: 0):
        of the means when there are several seeds, so one draw never decides a comparison."""
        times = self.end_to_end_s
        return [relative_difference(t, times[0]) for t in times]

    def to_dict(self) -> Any:
        """The ``--json`` payload: one run's object, or ``{"runs": [...], "vs_first": {label: fraction}}``
        (each run's first seed); with ``over_seeds`` added when there are several seeds per run
        (each with ``vs_first_mean``, the difference of the means from run 1's)."""
        payload = _payload(self.results)
        if self.over_seeds:
            vs = {r.label: d for r, d in zip(self.results, self.vs_first, strict=True)}
            payload["over_seeds"] = {
                label: {**row, "vs_first_mean": None if math.isnan(vs[label]) else vs[label]}
                for label, row in self.over_seeds.items()
            }
        return payload


def vs_first(results: list[SimResult]) -> list[float]:
    """Each run's relative difference in end-to-end time from run #1 (fraction; run #1: 0)."""
    first = results[0].end_to_end_s
    return [relative_difference(r.end_to_end_s, first) for r in results]


def simulate_plan(plan: SimPlan, observer: PlanObserver | None = None) -> Comparison:
    """Simulate every run of ``plan`` in order (then again over its seeds) and compare them."""
    watch = observer if observer is not None else PlanObserver()
    results = []
    for run in plan.runs:
        watch.run_started(run)

        def tick(cycle: CycleReport, run: PlannedRun = run) -> None:
            watch.cycle_done(run, cycle)

        result = simulate(run.scenario, policy=run.policy, progress=tick, host=run.host)
        results.append(result)
        watch.run_done(run, result)
    spread = _over_seeds(plan, results) if plan.seeds > 1 else {}
    return Comparison(results, spread)


def _over_seeds(plan: SimPlan, first: list[SimResult]) -> dict[str, dict[str, Any]]:
    """Each run again with seeds seed+1 .. seed+n-1: mean, min, max, spread of end-to-end."""
    n = plan.seeds
    out: dict[str, dict[str, Any]] = {}
    for run, r0 in zip(plan.runs, first, strict=True):
        sc = run.scenario
        # Keyed by the run's label: --compare-policy runs share a scenario name.
        seeds = [sc.seed + k for k in range(n)]
        # A fresh policy per run: policies keep state while they run.
        rs = [r0] + [
            simulate(sc.model_copy(update={"seed": s}), policy=run.fresh_policy(), host=run.host) for s in seeds[1:]
        ]
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


def _payload(results: list[SimResult]) -> Any:
    """One run's object, or ``{"runs": [...], "vs_first": {label: fraction}}``."""
    if len(results) == 1:
        return results[0].to_dict()
    runs = []
    for r, d in zip(results, vs_first(results), strict=True):
        run = r.to_dict()
        run["vs_first"] = None if math.isnan(d) else d
        runs.append(run)
    return {"runs": runs, "vs_first": {run["label"]: run["vs_first"] for run in runs[1:]}}


# ---- Plots -----------------------------------------------------------------------------------


def unique_labels(labels: list[str]) -> list[str]:
    """Run labels made unique: a label used twice gets its run number (``#3 x[p]``)."""
    return [f"#{i} {lab}" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels, start=1)]


def plot_labels(results: list[SimResult]) -> list[str]:
    """Run labels for legends (:func:`unique_labels`), so lines of equal labels stay apart."""
    return unique_labels([r.label for r in results])


def _plot_dirs(results: list[SimResult]) -> list[str]:
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


def plot_comparison(results: list[SimResult], out_dir: str | Path) -> list[Path]:
    """Write the plots of ``results`` to ``out_dir``: one run's there, several runs' each in a folder
    of its own plus the comparison plots; returns the files written."""
    from dynres.runtime.plots import write_comparison_plots, write_plots

    def one(r: SimResult, where: str | Path, label: str) -> list[Path]:
        return write_plots(
            r.report, where, title=label, mq_size_cap=r.mq_size_cap, hybrid_replicas=r.scenario.num_hybrid_replicas
        )

    if len(results) == 1:
        return one(results[0], out_dir, results[0].label)
    paths: list[Path] = []
    labels = plot_labels(results)
    for r, folder, label in zip(results, _plot_dirs(results), labels, strict=True):
        paths += one(r, Path(out_dir) / folder, label)
    paths += write_comparison_plots(
        dict(zip(labels, (r.report for r in results), strict=True)),
        out_dir,
        mq_size_caps={lab: r.mq_size_cap for lab, r in zip(labels, results, strict=True)},
    )
    return paths
