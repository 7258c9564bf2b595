"""`fixed_ratio` and `static_fully_async`, method by method."""

from __future__ import annotations

import pytest
from policies_helpers import make_ctx

from dynres.core.errors import PolicyParamsError, PolicyValidationError
from dynres.policies.default import DefaultPolicy
from dynres.policies.fixed_ratio import FixedRatioPolicy
from dynres.policies.static_fully_async import StaticFullyAsyncPolicy

# ---- fixed_ratio ----------------------------------------------------------------------------


@pytest.mark.parametrize("active", [True, False])
def test_fixed_should_deactivate_is_is_hybrid_active(active):
    assert FixedRatioPolicy().should_deactivate(make_ctx(is_hybrid_active=active)) is active


@pytest.mark.parametrize(
    ("ratio", "required", "trigger", "wait"),
    [(0.3, 25, 4, 30), (0.25, 5, 2, 2), (0.0, 25, 4, 0), (1.0, 25, 4, 100), (0.3, 8, 4, 9)],
)
def test_fixed_wait_is_ratio_of_a_cycle(ratio, required, trigger, wait):
    ctx = make_ctx(required_samples=required, trigger_parameter_sync_step=trigger)
    got = FixedRatioPolicy({"deactivate_ratio": ratio}).deactivate_wait_samples(ctx)
    assert got == wait and type(got) is int


@pytest.mark.parametrize(
    ("ratio", "surplus", "expected"),
    [
        (0.3, 29, True),  # gap 1
        (0.3, 30, False),  # gap 0
        (0.3, 31, False),
        (0.3, -5, True),
        (0.0, 0, False),
        (0.0, -1, True),
        (1.0, 99, True),
        (1.0, 100, False),
    ],
)
def test_fixed_activation_is_a_pure_gap_check(ratio, surplus, expected):
    ctx = make_ctx(total_generated_samples=500 + surplus, expected_samples=500)
    assert FixedRatioPolicy({"deactivate_ratio": ratio}).should_activate_after_step(ctx) is expected


def test_fixed_has_no_cost_gate():
    # Gap of 1 sample at a measured 0.5 s/sample: default's gate says no, fixed_ratio says yes.
    ctx = make_ctx(
        total_generated_samples=529, expected_samples=500, step_wait_times=(2.0, 3.0), step_wait_samples=(4, 6)
    )
    gated = DefaultPolicy()
    gated.update_after_step(ctx)
    assert gated.should_activate_after_step(ctx) is False
    assert FixedRatioPolicy().should_activate_after_step(ctx) is True


def test_fixed_never_adapts():
    policy = FixedRatioPolicy({"deactivate_ratio": 0.4})
    for step in range(1, 10):
        waited = step % 2 == 0
        policy.update_after_step(
            make_ctx(
                global_steps=step,
                step_wait_times=(1.0,),
                step_wait_samples=(20 if waited else 0,),
                last_activate_duration_s=3.0,
            )
        )
    assert policy.deactivate_wait_samples(make_ctx()) == 40
    assert policy.state_dict() == {}


@pytest.mark.parametrize("surplus", [-100, 0, 30, 1000])
def test_fixed_only_hybrid_always_activates(surplus):
    ctx = make_ctx(num_standalone_replicas=0, total_generated_samples=1000 + surplus, expected_samples=1000)
    assert FixedRatioPolicy({"deactivate_ratio": 0.0}).should_activate_after_step(ctx) is True


def test_fixed_only_hybrid_waits_for_a_whole_cycle_like_the_reference():
    # The reference forces its ratio to 1 in an only-hybrid cluster.
    ctx = make_ctx(num_standalone_replicas=0, is_hybrid_active=True)
    assert FixedRatioPolicy({"deactivate_ratio": 0.2}).deactivate_wait_samples(ctx) == 100


def test_fixed_rebalances_and_keeps_no_state():
    policy = FixedRatioPolicy()
    assert policy.should_rebalance(make_ctx()) is True
    policy.update_after_step(make_ctx())  # a no-op (its None return is the signature's)
    policy.load_state_dict({})
    with pytest.raises(PolicyValidationError):
        policy.load_state_dict({"ratio": 0.3})


def test_fixed_params():
    assert FixedRatioPolicy().params.deactivate_ratio == 0.3
    with pytest.raises(PolicyParamsError, match="deactivate_ratio"):
        FixedRatioPolicy({"deactivate_ratio": -0.1})
    with pytest.raises(PolicyParamsError, match="did you mean 'deactivate_ratio'"):
        FixedRatioPolicy({"deactivate_raito": 0.3})


# ---- static_fully_async -----------------------------------------------------------------------


@pytest.mark.parametrize("active", [True, False])
@pytest.mark.parametrize("standalone", [0, 3])
def test_static_deactivates_at_once_whenever_active(active, standalone):
    policy = StaticFullyAsyncPolicy()
    ctx = make_ctx(is_hybrid_active=active, num_standalone_replicas=standalone, queue_size=0)
    assert policy.should_deactivate(ctx) is active
    wait = policy.deactivate_wait_samples(ctx)
    assert wait == 0 and type(wait) is int


@pytest.mark.parametrize("surplus", [-1000, 0, 1000])
def test_static_never_activates_with_standalone_replicas(surplus):
    ctx = make_ctx(
        total_generated_samples=2000 + surplus, expected_samples=2000, step_wait_times=(100.0,), step_wait_samples=(25,)
    )
    assert StaticFullyAsyncPolicy().should_activate_after_step(ctx) is False


def test_static_activates_in_only_hybrid_clusters():
    # Deliberate difference: the reference never activates, which deadlocks a cluster with no
    # standalone replicas (nothing would ever generate).
    ctx = make_ctx(num_standalone_replicas=0, total_generated_samples=5000, expected_samples=100)
    assert StaticFullyAsyncPolicy().should_activate_after_step(ctx) is True


def test_static_has_no_rebalance_no_update_no_state_no_params():
    policy = StaticFullyAsyncPolicy()
    assert policy.should_rebalance(make_ctx()) is False
    policy.update_after_step(make_ctx())  # a no-op (its None return is the signature's)
    assert policy.state_dict() == {}
    with pytest.raises(PolicyParamsError, match="unknown param 'deactivate_ratio'.*valid params: \\(none\\)"):
        StaticFullyAsyncPolicy({"deactivate_ratio": 0.3})
