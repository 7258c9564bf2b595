"""predictive's extra_admission: off unless set; when set, a share of a cycle admitted beyond the budget."""

from __future__ import annotations

from policies_helpers import make_ctx

from dynres.policies.predictive import PredictivePolicy
from dynres.runtime.sim import simulate

# Staleness 0, partial rollout on: each version admits one cycle's samples, and the replicas idle
# beside its tail. Short, so the test takes seconds.
PRESET = "seed-staleness0-16-16"
SHORT = {"steps": 6}


def test_without_the_param_nothing_is_admitted_beyond_the_budget() -> None:
    ctx = make_ctx(staleness_threshold=0.0)
    assert PredictivePolicy().admit_extra_samples(ctx) == 0
    assert PredictivePolicy({"extra_admission": 0.5}).admit_extra_samples(ctx) == ctx.step_required_samples // 2
    assert PredictivePolicy({"extra_admission": 1.0}).admit_extra_samples(ctx) == ctx.step_required_samples


def test_a_budget_a_cycle_or_more_ahead_gets_no_extra() -> None:
    # There the next cycle's samples already run beside the tail; on the development draw the
    # extra lost up to 11% at staleness 2 (docs/builtin-policies.md, "Extra admission").
    pol = PredictivePolicy({"extra_admission": 0.5})
    assert pol.admit_extra_samples(make_ctx(staleness_threshold=0.5)) == 50
    assert pol.admit_extra_samples(make_ctx(staleness_threshold=1.0)) == 0
    assert pol.admit_extra_samples(make_ctx(staleness_threshold=2.0)) == 0


def test_an_only_hybrid_cluster_gets_no_extra() -> None:
    # Nothing generates while the trainer trains: the deactivation cuts samples started beside the
    # tail (only-hybrid-32 lost 5.2% with them, the development draw's only-hybrid run 1.2%).
    pol = PredictivePolicy({"extra_admission": 0.5})
    assert pol.admit_extra_samples(make_ctx(staleness_threshold=0.0, num_standalone_replicas=0)) == 0


def test_sim_extra_admission_shortens_a_staleness_0_run_and_loses_no_sample() -> None:
    plain = simulate(PRESET, policy="predictive", overrides=SHORT)
    extra = simulate(
        PRESET,
        policy="predictive",
        overrides={**SHORT, "async_training.dynamic_schedule_policy_params.extra_admission": 0.5},
    )
    assert extra.end_to_end_s < 0.95 * plain.end_to_end_s
    assert extra.extra["extra_admitted_samples"] == extra.scenario.step_required_samples // 2
    assert plain.extra["extra_admitted_samples"] == 0
    assert extra.ledger is not None and plain.ledger is not None
    assert extra.ledger.problems() == [] and len(extra.ledger.trained) == len(plain.ledger.trained)


def test_without_partial_rollout_only_a_budget_with_no_run_ahead_gets_an_extra() -> None:
    # Each sync then waits for the running samples, the extra ones among them: it pays only where
    # nothing else may run beside the tail (seed-no-partial-16-16, staleness 0.1: +4.4% with it).
    pol = PredictivePolicy({"extra_admission": 0.5})
    assert pol.admit_extra_samples(make_ctx(staleness_threshold=0.1, partial_rollout=False)) == 0
    assert pol.admit_extra_samples(make_ctx(staleness_threshold=0.0, partial_rollout=False)) == 50
    assert pol.admit_extra_samples(make_ctx(staleness_threshold=0.1, partial_rollout=True)) == 50


def test_sim_without_partial_rollout_the_extra_leaves_a_run_with_run_ahead_as_it_was() -> None:
    params = "async_training.dynamic_schedule_policy_params.extra_admission"
    plain = simulate("seed-no-partial-16-16", policy="predictive", overrides=SHORT)
    extra = simulate("seed-no-partial-16-16", policy="predictive", overrides={**SHORT, params: 0.5})
    assert extra.extra["extra_admitted_samples"] == 0
    assert extra.end_to_end_s == plain.end_to_end_s
    # At staleness 0 the same run still admits the extra.
    zero = {**SHORT, "async_training.staleness_threshold": 0.0}
    assert simulate("seed-no-partial-16-16", policy="predictive", overrides={**zero, params: 0.5}).extra[
        "extra_admitted_samples"
    ] == (plain.scenario.step_required_samples // 2)
