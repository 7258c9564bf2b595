"""The seed presets reproduce the published shape; runs are deterministic and above their bound."""

from __future__ import annotations

import json
import statistics

import pytest

from dynres.core.metrics import MQ_SIZE, TRAIN_UTILIZATION
from dynres.runtime.loop.driver import max_required_samples
from dynres.runtime.sim import SimResult, presets, simulate
from dynres.runtime.sim.scenario import load_scenario

SEED_RUNS = ("seed-dynamic-16-16", "seed-static-16-16", "seed-static-8-24")


@pytest.fixture(scope="module")
def seed_results() -> dict[str, SimResult]:
    """The three seed presets, full length (the same runs as the README's first command)."""
    return {name: simulate(name) for name in SEED_RUNS}


def _queue_cap(result: SimResult) -> int:
    # The most that can stay queued after a cycle's last fit step: what the staleness rule lets
    # production run ahead (max_required_samples) minus the cycle's own consumption.
    sc = result.scenario
    return max_required_samples(sc.dynres_config()) - sc.step_required_samples


@pytest.mark.slow
def test_static_16_16_is_production_bound(seed_results: dict[str, SimResult]) -> None:
    r = seed_results["seed-static-16-16"]
    cycles = r.report.cycles
    waited = [c for c in cycles if sum(c.step_wait_samples) > 0]
    assert len(waited) >= 0.75 * len(cycles)  # the trainer waits for samples in most cycles
    assert r.mean_metric(TRAIN_UTILIZATION) < 0.6
    mq = r.report.metric_series(MQ_SIZE)
    assert statistics.median(mq) <= 0.5 * _queue_cap(r)  # queue far below its cap


def test_static_8_24_is_consumption_bound(seed_results: dict[str, SimResult]) -> None:
    r = seed_results["seed-static-8-24"]
    cap = _queue_cap(r)
    mq = r.report.metric_series(MQ_SIZE)
    assert sum(1 for v in mq if v >= cap) >= 0.9 * len(mq)  # queue at its cap
    assert r.mean_metric(TRAIN_UTILIZATION) > 0.9  # the trainer never waits


def test_dynamic_is_at_least_ten_percent_faster_than_both(seed_results: dict[str, SimResult]) -> None:
    dyn = seed_results["seed-dynamic-16-16"].end_to_end_s
    for name in ("seed-static-16-16", "seed-static-8-24"):
        other = seed_results[name].end_to_end_s
        assert dyn <= 0.9 * other, f"dynamic {dyn / 3600:.3f} h vs {name} {other / 3600:.3f} h"
    dynamic = seed_results["seed-dynamic-16-16"]
    assert dynamic.switches > 0
    assert dynamic.mean_metric(MQ_SIZE) < seed_results["seed-static-8-24"].mean_metric(MQ_SIZE)


def test_seed_runs_lose_and_duplicate_nothing(seed_results: dict[str, SimResult]) -> None:
    for r in seed_results.values():
        s = r.report.samples
        assert s.duplicates == 0 and s.failed == 0
        assert s.consumed == r.scenario.steps * r.scenario.step_required_samples
        assert r.report.policy_fallbacks == 0
        assert r.extra["sleep_aborts"] == 0


@pytest.mark.slow
def test_every_simulated_run_is_above_its_lower_bound(seed_results: dict[str, SimResult]) -> None:
    results = list(seed_results.values())
    # Every other preset, shortened (the bound must hold for any run, not only the long ones).
    for name in presets.preset_names():
        if name not in seed_results:
            results.append(simulate(name, overrides={"steps": 1 if name.startswith("verl") else 3}))
    results.append(simulate("seed-dynamic-16-16", policy="fixed_ratio", overrides={"steps": 4}))
    results.append(
        simulate("seed-dynamic-16-16", overrides={"steps": 4, "cluster.rollout_gpus": 0})
    )  # only hybrid replicas
    for r in results:
        assert r.lower_bound_s > 0
        assert r.end_to_end_s >= r.lower_bound_s, (r.scenario.name, r.end_to_end_s, r.bound.terms)


def test_same_scenario_and_seed_give_identical_json() -> None:
    a = simulate("seed-dynamic-16-16", overrides={"steps": 3})
    b = simulate("seed-dynamic-16-16", overrides={"steps": 3})
    ja, jb = json.dumps(a.to_dict()), json.dumps(b.to_dict())
    assert ja == jb
    c = simulate("seed-dynamic-16-16", seed=1, overrides={"steps": 3})
    assert json.dumps(c.to_dict()) != ja


def test_json_has_the_documented_keys() -> None:
    r = simulate(load_scenario("seed-dynamic-16-16", overrides={"steps": 2}))
    d = r.to_dict()
    for key in ("end_to_end_s", "lower_bound_s", "policy", "steps", "ratio_to_bound", "report"):
        assert key in d
    assert d["policy"] == "default"
    assert len(d["steps"]) == 2
    for step in d["steps"]:
        assert {
            "dynamic_resource/train_resource_utilization",
            "dynamic_resource/rollout_resource_utilization",
            "dynamic_resource/resource_utilization",
            "dynamic_resource/mq_size",
        } <= set(step)
