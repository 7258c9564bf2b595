"""Simulating a :class:`~dynres.runtime.sim.plan.SimPlan` and comparing its runs with the first.

:func:`simulate_plan` runs each planned run in table order and reports its progress to a
:class:`PlanObserver` (a progress display, a tracking backend); nothing here prints. What it
returns, a :class:`Comparison`, holds the results, each run's difference from run 1, the spread
over seeds and the ``--json`` payload; :func:`plot_comparison` writes the plots of its runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynres.runtime.loop.report import CycleReport
from dynres.runtime.sim.plan import PlannedRun, SimPlan
from dynres.runtime.sim.runner import SimResult, relative_difference, simulate


class PlanObserver:
    """Hears about the runs of a plan as they are simulated; each method does nothing unless overridden."""

    def run_started(self, run: PlannedRun) -> None:
        """``run`` is about to be simulated."""

    def cycle_done(self, run: PlannedRun, cycle: CycleReport) -> None:
        """``run`` finished one sync cycle (``cycle.end_s``: simulated seconds so far)."""

    def run_done(self, run: PlannedRun, result: SimResult) -> None:
        """``run`` ended with ``result``."""


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
    def vs_first(self) -> list[float]:
        """Each run's relative difference in end-to-end time from run 1 (fraction; run 1: 0)."""
        return vs_first(self.results)

    def to_dict(self) -> Any:
        """The ``--json`` payload: one run's object, or ``{"runs": [...], "vs_first": {label: fraction}}``;
        with ``over_seeds`` added when there are several seeds per run."""
        payload = _payload(self.results)
        if self.over_seeds:
            payload["over_seeds"] = self.over_seeds
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


def plot_labels(results: list[SimResult]) -> list[str]:
    """Run labels for legends; a label used twice gets its run number (``#3 x[p]``) so lines stay apart."""
    plain = [r.label for r in results]
    return [f"#{i} {lab}" if plain.count(lab) > 1 else lab for i, lab in enumerate(plain, start=1)]


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
            r.report, where, title=label, queue_cap=r.queue_cap, hybrid_replicas=r.scenario.num_hybrid_replicas
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
        queue_caps={lab: r.queue_cap for lab, r in zip(labels, results, strict=True)},
    )
    return paths
