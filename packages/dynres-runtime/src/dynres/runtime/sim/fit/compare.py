"""``dynres scenario compare``: a fitted run simulated as it was and with other policies.

The as-it-was prediction comes first and its error against the measured run is the first thing
to read: a simulator that cannot reproduce the run it was fitted to says little about another
policy. Every prediction adds the start-up the simulator does not model (engine warm-up before
the first cycle), so the predicted times are end-to-end like the measured one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynres.core.errors import ConfigError
from dynres.runtime.sim.fit.fitter import FitResult
from dynres.runtime.sim.scenario import Scenario, load_scenario


@dataclass
class Prediction:
    """One policy simulated on a fitted scenario, over one or more seeds."""

    policy: str
    """The policy's name."""
    as_it_was: bool
    """True for the policy the measured run used."""
    predicted_s: list[float]
    """Predicted end-to-end time per seed: unmodelled warm-up + simulated run (seconds)."""
    seeds: list[int]
    """The workload seeds simulated, parallel to predicted_s."""
    switches: int
    """Hybrid activations + deactivations of the first seed's run (count)."""

    @property
    def mean_s(self) -> float:
        """Mean predicted end-to-end time over the seeds (seconds)."""
        return sum(self.predicted_s) / len(self.predicted_s)


@dataclass
class Comparison:
    """``dynres scenario compare``: predictions per policy and the as-it-was error."""

    fit: FitResult
    """The fitted scenario the predictions ran on."""
    warmup_s: float
    """Measured time before the first cycle minus the simulated one, added to every prediction
    (seconds; engine warm-up the simulator does not model)."""
    predictions: list[Prediction]
    """As-it-was first, then each named policy in order."""

    @property
    def as_it_was(self) -> Prediction:
        """The prediction of the run as it was measured."""
        return next(p for p in self.predictions if p.as_it_was)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured of the as-it-was prediction (fraction)."""
        m = self.fit.measured_end_to_end_s
        return (self.as_it_was.mean_s - m) / m if m > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` payload: measured, warm-up, one entry per policy, the as-it-was error."""
        base = self.as_it_was.mean_s
        return {
            "metrics": str(self.fit.source),
            "format": self.fit.format,
            "cycles": self.fit.cycles,
            "measured_policy": self.fit.measured_policy,
            "measured_end_to_end_s": self.fit.measured_end_to_end_s,
            "warmup_s": self.warmup_s,
            "as_it_was_error": self.error,
            "predictions": [
                {
                    "policy": p.policy,
                    "as_it_was": p.as_it_was,
                    "predicted_end_to_end_s": p.mean_s,
                    "per_seed_s": p.predicted_s,
                    "seeds": p.seeds,
                    "vs_as_it_was": (p.mean_s - base) / base if base > 0 else None,
                    "switches": p.switches,
                }
                for p in self.predictions
            ],
            "missing": list(self.fit.missing),
        }


def check_policies(policies: Sequence[str]) -> None:
    """Resolve every policy name now (PolicyError naming it and the installed ones) before any work."""
    from dynres.core.config import AsyncTrainingConfig
    from dynres.core.loading import policy_from_config

    for name in policies:
        policy_from_config(AsyncTrainingConfig(), name)


def predict(
    fit: FitResult,
    policies: Sequence[str],
    *,
    seeds: int = 1,
    overrides: Mapping[str, Any] | None = None,
) -> Comparison:
    """Simulate the fitted run as it was and with each of ``policies``; ``seeds`` draws each.

    A policy other than static_fully_async on a scenario without dynamic scheduling gets
    ``use_dynamic_resource_scheduling: true`` (the trainer's GPUs host hybrid replicas), since it
    would otherwise run exactly like the static one.
    """
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds}: must be >= 1; give the number of workload draws per policy")
    sc = fit.load(overrides)
    names = [fit.measured_policy] + [p for p in policies if p != fit.measured_policy]
    results: list[Prediction] = []
    first_sim: list[float] = []
    for i, name in enumerate(names):
        run_sc = sc
        if i and not sc.async_training.use_dynamic_resource_scheduling and name != "static_fully_async":
            run_sc = load_scenario(sc, overrides={"async_training.use_dynamic_resource_scheduling": True})
        prediction, starts = _simulate_policy(run_sc, name, seeds, as_it_was=i == 0)
        results.append(prediction)
        first_sim += starts
    # Can be negative for verl, whose logged cycle times exclude the start-up the simulator runs.
    warmup = fit.first_cycle_start_s - (sum(first_sim) / len(first_sim) if first_sim else 0.0)
    for p in results:
        p.predicted_s = [t + warmup for t in p.predicted_s]
    return Comparison(fit=fit, warmup_s=warmup, predictions=results)


def _simulate_policy(sc: Scenario, name: str, seeds: int, *, as_it_was: bool) -> tuple[Prediction, list[float]]:
    """``seeds`` simulated runs of ``sc`` under policy ``name`` (seeds sc.seed, sc.seed + 1, ...),
    without warm-up yet; and, for the as-it-was run, each run's simulated first-cycle start (seconds)."""
    from dynres.runtime.sim.runner import build_policy, simulate

    e2e, used, switches, starts = [], [], 0, []
    for k in range(seeds):
        seed = sc.seed + k
        r = simulate(sc.model_copy(update={"seed": seed}), policy=build_policy(sc, name))
        e2e.append(r.end_to_end_s)
        used.append(seed)
        if k == 0:
            switches = r.switches
        if as_it_was and r.report.cycles:
            starts.append(r.report.cycles[0].start_s)
    return Prediction(policy=name, as_it_was=as_it_was, predicted_s=e2e, seeds=used, switches=switches), starts
