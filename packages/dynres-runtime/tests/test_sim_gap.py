"""The gap to the lower bound split into causes (sim.gap): they add up, none is negative, the
ones that cannot occur are 0, a planted cost shows up in its cause, and ``--explain`` prints it."""

from __future__ import annotations

import json
import math
from functools import cache
from typing import Any

import pytest
from click.testing import CliRunner

from dynres.runtime.cli import main
from dynres.runtime.sim import SimResult, simulate
from dynres.runtime.sim.gap import CAUSES, decompose
from dynres.runtime.sim.presets import preset_names

POLICIES = ("default", "static_fully_async", "predictive")
STEPS = 3


@cache
def _run(preset: str, policy: str, **overrides: Any) -> SimResult:
    return simulate(preset, policy=policy, overrides={"steps": STEPS, **overrides})


def _gap(r: SimResult) -> float:
    return r.end_to_end_s - r.lower_bound_s


def _assert_adds_up(r: SimResult) -> dict[str, float]:
    causes = r.gap_causes
    assert tuple(causes) == CAUSES
    assert math.isclose(sum(causes.values()), _gap(r), rel_tol=1e-6, abs_tol=1e-6), (r.label, causes, _gap(r))
    for name, seconds in causes.items():
        assert seconds >= -1e-6 * r.end_to_end_s, (r.label, name, causes)
    return causes


def _check_preset(preset: str, policy: str) -> None:
    r = _run(preset, policy)
    causes = _assert_adds_up(r)
    if policy == "static_fully_async" and r.scenario.num_standalone_replicas > 0:
        assert r.switches == 0  # (an only-hybrid cluster must switch, whatever the policy)
    if r.switches == 0:
        # Nothing ever switched: no switch time, no trainer time lent to hybrids.
        assert causes["switch"] == 0.0 and causes["hybrid_trainer"] == 0.0, (r.label, causes)
    if r.extra["lost_work_tokens"] == 0:
        assert causes["lost_work"] == 0.0, (r.label, causes)


@pytest.mark.parametrize("policy", POLICIES)
def test_causes_add_up_on_two_presets(policy: str) -> None:
    for preset in ("seed-dynamic-16-16", "only-hybrid-32"):
        _check_preset(preset, policy)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("preset", preset_names())
def test_causes_add_up_on_every_preset(preset: str, policy: str) -> None:
    _check_preset(preset, policy)


def test_static_fully_async_never_switches_nor_loses_work() -> None:
    r = _run("seed-dynamic-16-16", "static_fully_async")
    causes = _assert_adds_up(r)
    assert r.extra["lost_work_tokens"] == 0.0
    assert causes["switch"] == causes["hybrid_trainer"] == causes["lost_work"] == 0.0


def test_a_huge_weight_sync_makes_sync_the_largest_cause() -> None:
    r = _run("seed-dynamic-16-16", "static_fully_async", **{"costs.weight_sync_s": 200.0})
    causes = _assert_adds_up(r)
    assert max(causes, key=lambda k: causes[k]) == "sync", causes
    assert causes["sync"] > 0.5 * _gap(r)


def test_large_switch_costs_make_switch_the_largest_cause_for_default() -> None:
    costs = {"costs.wake_up_s": 60.0, "costs.sleep_s": 60.0, "costs.trainer_offload_s": 30.0}
    r = _run("seed-dynamic-16-16", "default", **costs)
    causes = _assert_adds_up(r)
    assert max(causes, key=lambda k: causes[k]) == "switch", causes
    base = _assert_adds_up(_run("seed-dynamic-16-16", "default"))
    assert causes["switch"] > 3 * base["switch"]


def test_without_partial_rollout_aborts_lose_work() -> None:
    r = _run("seed-no-partial-16-16", "default")
    causes = _assert_adds_up(r)
    assert r.extra["rework_tokens"] > 0 and r.extra["lost_work_tokens"] >= r.extra["rework_tokens"]
    assert causes["lost_work"] > 0


def test_the_paid_time_covers_the_trainers_timeline() -> None:
    # Before the bound's credit, the timeline classes and the waiting add up to end-to-end time.
    r = _run("seed-dynamic-16-16", "default")
    assert r.trace is not None
    g = decompose(r, r.trace)
    assert math.isclose(sum(g.paid.values()) + r.lower_bound_s - g.credit_s, r.end_to_end_s, rel_tol=1e-9)
    assert math.isclose(r.lower_bound_s - g.credit_s, r.extra["train_compute_s"], rel_tol=1e-9)
    assert all(v >= 0 for v in g.paid.values()), g.paid


def test_the_json_of_a_run_has_gap_causes() -> None:
    d = json.loads(json.dumps(_run("seed-dynamic-16-16", "default").to_dict()))
    assert set(d["gap_causes"]) == set(CAUSES)
    assert math.isclose(sum(d["gap_causes"].values()), d["end_to_end_s"] - d["lower_bound_s"], rel_tol=1e-6)


def test_explain_prints_every_cause_in_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    args = ["simulate", "--preset", "seed-dynamic-16-16", "--set", "steps=2", "--compare-policy", "predictive"]
    res = CliRunner().invoke(main, [*args, "--explain"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "#1 where the time goes" in out and "#2 where the time goes" in out
    for name in CAUSES:
        assert out.count(name) >= 2, name
    assert "% gap" in out and "x bound" in out
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 80
    plain = CliRunner().invoke(main, args)
    assert plain.exit_code == 0 and "where the time goes" not in plain.stdout


def test_explain_with_seeds_names_the_seed_it_explains() -> None:
    res = CliRunner().invoke(
        main, ["simulate", "--preset", "seed-dynamic-16-16", "--set", "steps=2", "--seeds", "2", "--explain"]
    )
    assert res.exit_code == 0, res.output
    assert "#1 where the time goes, seed 0:" in res.stdout  # the first of seeds 0..1
